"""Gradient compressors: validated hyper-parameters, a wire format, and encode/decode in TensorFlow.

A compressor turns one flat float32 gradient (or gradient plus error-feedback residual) of `size`
elements into *wire tensors*, the payload one worker sends, and decodes them back:

  encoded = compressor.encode(flat, seed, worker)     # Encoded(wire=(tensors...), context)
  mine    = compressor.decode_local(encoded, size)   # float32 [size]: what this worker sent
  total   = compressor.decode_sum(wire, context, size, num_workers)
            # float32 [size]: the sum over workers, given the collective's result for each wire
            # tensor (allgather: the K workers' tensors concatenated on dim 0; allreduce: their sum)

`collective` says which strategy (`tfcomp.strategies`) that is: the allgather (sparse and
quantised payloads, decoded together by one `sparse_batched_decode` for the sparsifiers, 004 Sec.
4.3) or the allreduce of payloads that add up (RandomK's values at indices shared by all ranks,
IntQuant's levels). FP16 and NoCompression are dense compressors: the exchange sends those tensors
through Horovod's own allreduce, exactly as `hvd.Compression.fp16` and `hvd.Compression.none` do.
`strategies` lists every strategy a compressor can run, dense first (the plan keeps to dense on
ties): the sparsifiers' index-value pairs also go by AR-Topk and the partitioned allreduce.

Seeds: `seed` is an int64 scalar tensor equal on every rank and different every step; `worker` is
this rank's index in the process set, for randomness that must differ between ranks.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

import numpy as np

from tfcomp import strategies as st
from tfcomp.lazy_module import LazyModule

# Imported on first use: settings and payload sizes (the cost model, the what-if) need neither.
tf = LazyModule("tensorflow")
ops = LazyModule("tfcomp.ops")

__all__ = [
    "Compressor",
    "DGC",
    "DRAGONN",
    "EFSignSGD",
    "Encoded",
    "FP16",
    "IntQuant",
    "NoCompression",
    "QSGD",
    "RandomK",
    "TopK",
    "as_compressor",
    "check_compression",
    "scale_values",
]

DEFAULT_MIN_ELEMENTS = 8192  # 32 KiB of float32: biases, normalisation gains, small kernels go dense
DEFAULT_TRIAL_STEPS = 10
DEFAULT_UNION_LIMIT = 1.0


class Encoded(NamedTuple):
    """One worker's payload: the wire tensors and what decoding needs besides them."""

    wire: tuple
    context: Any = None


_INT32_MAX = 2**31 - 1  # the ops' int32 attributes and indices
_INT64_MAX = 2**63 - 1  # the exchange's int64 step counter, TensorFlow's element counts
_MAX_SLOTS_PER_ELEMENT = float(_INT32_MAX)  # a one-element selection's slots must fit the op


def _is_real(value) -> bool:
    """A real number (Python or NumPy), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _check_ratio(ratio) -> float:
    if not _is_real(ratio) or not 0 < ratio <= 1:  # NaN fails the comparison
        raise ValueError(f"ratio must be a number in (0, 1], got {ratio!r}")
    return float(ratio)


def _check_int(name: str, value, minimum: int, maximum: int, why: str) -> int:
    """`value` as a Python int if it is an integer (Python or NumPy, not a bool) in [minimum, maximum]."""
    if not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value > maximum:
        raise ValueError(f"{name} must be at most {maximum} ({why}), got {value!r}")
    return int(value)


def _check_momentum(momentum):
    if momentum is None:
        return None
    if not _is_real(momentum) or not 0 <= momentum < 1:
        raise ValueError(f"momentum must be None or a number in [0, 1), got {momentum!r}")
    return float(momentum)


KERAS_ADAM = (0.9, 0.999, 1e-7)  # tf.keras.optimizers.Adam's beta_1, beta_2, epsilon


def _check_adam(adam):
    """None, True (KERAS_ADAM) or (beta_1, beta_2, epsilon) -> None or a tuple of three floats."""
    if adam is None:
        return None
    if adam is True:
        return KERAS_ADAM
    if isinstance(adam, (tuple, list)) and len(adam) == 3 and all(_is_real(x) for x in adam):
        beta_1, beta_2, epsilon = (float(x) for x in adam)
        if 0 <= beta_1 < 1 and 0 <= beta_2 < 1 and 0 < epsilon < math.inf:
            return beta_1, beta_2, epsilon
    raise ValueError("adam must be None, True (Keras Adam's 0.9, 0.999, 1e-7) or (beta_1, beta_2, epsilon) with "
                     f"the betas in [0, 1) and epsilon a finite number > 0, got {adam!r}")


def scale_values(payload_values, scale: float):
    """`payload_values` times `scale` (a payload's values or per-worker scales, K·k or K elements:
    the decode's averaging costs no pass over its dense result), unchanged for 1."""
    return payload_values if scale == 1.0 else payload_values * scale


def _num_selected(ratio: float, size: int) -> int:
    """k = max(1, round(ratio * size)), rounding halves up."""
    return max(1, math.floor(ratio * size + 0.5))


class Compressor:
    """Base class. Subclasses set `collective` and `strategies` and implement encode / decode_local / decode_sum.

    Attributes:
      collective: (class) the compressor's own strategy (`tfcomp.strategies`: the allgather, the
        allreduce, or dense: sent by Horovod's allreduce, see module doc), what planning="off" uses.
      strategies: (class) the strategies it can run, dense first.
      error_feedback: keep what was not sent, per variable, and add it to the next gradient.
      momentum: None, or DGC's momentum-correction factor (error feedback with momentum and factor
        masking; then use the inner optimizer without momentum). Gradients the plan sends dense
        (and every gradient in warm-up steps) are sent as their momentum, which they keep: an
        all-dense plan trains as SGD with this momentum. Sparse (IndexedSlices) gradients get none.
      adam: None, or Adam correction (beta_1, beta_2, epsilon; True: Keras Adam's defaults): each
        worker keeps Adam's moments of its own gradients, m <- b1 m + (1 - b1) g and
        v <- b2 v + (1 - b2) g^2, and the exchange sends their bias-corrected step direction
        d = m^ / (sqrt(v^) + epsilon) with error feedback (what is not sent yet accumulates as
        the same directions would have, where sparsified gradients under Adam arrive as rare large
        values that its normalisation shrinks to one step); then use plain SGD at Adam's learning
        rate as the inner optimizer. The moments are not masked where something was sent.
        Gradients the plan sends dense (and warm-up steps) send d too, so an all-dense plan trains
        as Adam with per-worker moments. Needs error feedback; excludes `momentum`.
      warmup_steps: communicating steps sent dense before compression starts (0 to 2^63 - 1).
      planning: "auto" (default): at the first step tfcomp calibrates the cluster and splits the
        gradients into buckets, each exchanged with the strategy the cost model predicts fastest
        (`tfcomp.planning`); "off": every tensor of at least `min_elements` elements is compressed
        on its own, smaller ones are sent dense.
      strategy: None (default: the cost model chooses per bucket) or the name of one of
        `strategies` (`tfcomp.strategies.NAMES`) to force it for every compressed bucket; kept as
        that strategy.
      min_elements: tensors with fewer elements are always sent dense, whatever the planning or the
        forced strategy (1 to 2^63 - 1; default 8192).
      trial_steps: with planning="auto" and no forced strategy, a plan that compresses is tried in
        training (`tfcomp.trial`): `trial_steps` timed steps with it and as many dense (half the
        plan's, dense's, the plan's other half, each block after one untimed step), and it is kept
        only if its median step is at least 2 % shorter; else every bucket goes dense. 0: the cost
        model's plan is kept untried (0 to 2^31 - 1; default 10).
      payload_shows_non_finite: (class) whether a non-finite element of the encoded tensor always
        leaves a non-finite value in the payload's floating-point tensors (NaN and Inf always
        selected and ranked first; a scale or norm over every element), so that the exchange
        learns of it from the payload instead of a pass over the tensor.
      fuses_residual: (class) whether `encode_sum` adds the gradient and the residual in its
        kernels' own pass (read once, the sum written there), so that the exchange hands them over
        apart instead of adding them first.
      agrees_scale: (class) whether the encode needs a scale agreed by all ranks: the exchange then
        gathers every worker's `local_scale` of each such bucket (one allgather for all) and calls
        `encode_scaled` with the largest.

    Integers may be Python or NumPy integers (not bools, not floats such as 4.0); numbers may be
    Python or NumPy reals, finite. Anything else is a ValueError naming the argument and its value.
    """

    collective = st.ALLGATHER
    strategies = (st.DENSE, st.ALLGATHER)
    dense_element_bytes = 4  # bytes per element when a bucket is sent dense
    payload_shows_non_finite = False
    fuses_residual = False
    agrees_scale = False

    def __init__(self, *, error_feedback: bool, momentum=None, adam=None, warmup_steps: int = 0,
                 min_elements: int = DEFAULT_MIN_ELEMENTS, planning: str = "auto", strategy=None,
                 trial_steps: int = DEFAULT_TRIAL_STEPS):
        if not isinstance(error_feedback, bool):
            raise ValueError(f"error_feedback must be True or False, got {error_feedback!r}")
        self.error_feedback = error_feedback
        self.momentum = _check_momentum(momentum)
        if self.momentum is not None and not error_feedback:
            raise ValueError("momentum correction needs error_feedback=True")
        self.adam = _check_adam(adam)
        if self.adam is not None and not error_feedback:
            raise ValueError("adam correction needs error_feedback=True")
        if self.adam is not None and self.momentum is not None:
            raise ValueError("momentum and adam are two corrections of the optimizer; give one, got both")
        self.warmup_steps = _check_int("warmup_steps", warmup_steps, 0, _INT64_MAX,
                                       "the exchange counts steps in an int64")
        self.min_elements = _check_int("min_elements", min_elements, 1, _INT64_MAX, "an int64 count of elements")
        if planning not in ("auto", "off"):
            raise ValueError(f"planning must be 'auto' or 'off', got {planning!r}")
        self.planning = planning
        self.strategy = None if strategy is None else st.parse(strategy, "strategy", self.strategies,
                                                               owner=type(self).__name__, or_none=True)
        self.trial_steps = _check_int("trial_steps", trial_steps, 0, 2**31 - 1, "a number of steps")

    @property
    def tried_steps(self) -> int:
        """Timed steps per arm of the plan's trial in training: `trial_steps` where the cost model
        chooses (planning "auto", no forced strategy), else 0."""
        return self.trial_steps if self.planning == "auto" and self.strategy is None else 0

    @property
    def optimizer_state(self) -> int:
        """Vectors per tensor that the exchange keeps of the optimizer besides the residual: 0,
        1 (DGC momentum) or 2 (Adam's first and second moments)."""
        return 2 if self.adam is not None else int(self.momentum is not None)

    def get_config(self) -> dict:
        """Hyper-parameters, for repr and for comparing plans across ranks."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"tfcomp.{type(self).__name__}({args})"

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self.get_config() == other.get_config()

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(sorted(self.get_config().items()))))

    def payload_bytes(self, size: int) -> int:
        """Bytes one worker sends for a tensor of `size` float32 elements."""
        raise NotImplementedError

    def encode(self, flat: tf.Tensor, seed: tf.Tensor, worker: int) -> Encoded:
        """flat: float32 [size]; seed: int64 scalar; worker: this rank's index."""
        raise NotImplementedError

    def encode_sum(self, flat: tf.Tensor, residual: tf.Tensor, seed: tf.Tensor, worker: int):
        """(`encode` of acc = flat + residual, acc), all float32 [size]; this default adds them
        first, a compressor with `fuses_residual` in its kernels' pass."""
        accumulated = flat + residual
        return self.encode(accumulated, seed, worker), accumulated

    def decode_local(self, encoded: Encoded, size: int) -> tf.Tensor:
        """float32 [size]: the dense value of this worker's own payload."""
        raise NotImplementedError

    def decode_sum(self, wire: tuple, context, size: int, num_workers: int, scale: float = 1.0) -> tf.Tensor:
        """float32 [size]: `scale` times the sum of all workers' payloads from the collective's
        results (the scale applied to the payloads' values before the sum, so that averaging costs
        no pass over the dense result; exact where scale is a power of two, as 1/K is for K = 2,
        4, 8)."""
        raise NotImplementedError

    def compress(self, tensor):
        """Horovod's compressor interface, reached only where Horovod runs its own exchange with a
        tfcomp compressor: the glue was not installed (the compressor came from `tfcomp.compressors`
        directly, not through `tfcomp.`). Raises a RuntimeError that says so."""
        del tensor
        raise RuntimeError(f"Horovod was given {self!r} without tfcomp's glue installed: make compressors as "
                           f"tfcomp.{type(self).__name__}(...) (after `import tfcomp`), or call "
                           "tfcomp.horovod_glue.install() before building the optimizer or tape")

    def sent_pairs(self, encoded: Encoded):
        """(values float32 [m], indices int32 [m], -1 = empty) when this worker's payload is a
        subset of its input's elements, sent exactly (then error feedback only clears them);
        None when it is not (quantisers: the residual is input minus the decoded payload)."""
        del encoded
        return None


class _Sparsifier(Compressor):
    """Payload (values [m] float32, indices [m] int32, -1 = empty); decode: one batched decode."""

    strategies = (st.DENSE, st.ALLGATHER, st.ARTOPK, st.PARTITIONED)

    def __init__(self, ratio, *, error_feedback=True, artopk_owner="star", union_limit=DEFAULT_UNION_LIMIT, **kwargs):
        self.ratio = _check_ratio(ratio)
        if artopk_owner not in ("star", "var"):
            raise ValueError(f"artopk_owner must be 'star' (round-robin) or 'var' (max variance), got {artopk_owner!r}")
        self.artopk_owner = artopk_owner
        if union_limit is not None and not (_is_real(union_limit) and 0 < union_limit <= _INT32_MAX):
            raise ValueError(f"union_limit must be None or a number in (0, 2^31 - 1], got {union_limit!r}")
        self.union_limit = None if union_limit is None else float(union_limit)
        super().__init__(error_feedback=error_feedback, **kwargs)

    def payload_length(self, size: int) -> int:
        return _num_selected(self.ratio, size)

    def owner_budget(self, pairs: int, num_workers: int) -> int | None:
        """The most summed elements each of `num_workers` owners of a hash-partitioned sparse
        allreduce keeps, where every worker sends payloads of `pairs` slots in all (k):
        ceil(union_limit * k / K); None without a limit (the owner's whole union, lossless)."""
        if self.union_limit is None:
            return None
        return max(1, math.ceil(self.union_limit * pairs / num_workers))

    def owned_pairs(self, pairs: int, num_workers: int) -> int:
        """The most sums one owner shares in that allreduce: its budget, and never more than the
        `pairs` slots of each worker (its share of the worst case, a union of K k indices)."""
        budget = self.owner_budget(pairs, num_workers)
        return pairs if budget is None else min(budget, pairs)

    def payload_bytes(self, size: int) -> int:
        return 8 * self.payload_length(size)

    def decode_local(self, encoded: Encoded, size: int) -> tf.Tensor:
        values, indices = encoded.wire
        return ops.sparse_batched_decode(values, indices, size)

    def decode_sum(self, wire, context, size, num_workers, scale=1.0):
        values, indices = wire
        return ops.sparse_batched_decode(scale_values(values, scale), indices, size)

    def sent_pairs(self, encoded):
        return encoded.wire


class DRAGONN(_Sparsifier):
    """DRAGONN hashing sparsification (004 Algorithm 1), the default sparsifier.

    Args:
      ratio: fraction of elements to send, in (0, 1]. Default 0.001.
      slots_per_element: num_slots = max(1, round(slots_per_element * ratio * size)), in (0, 2^31 - 1].
        Default 1 (004's setting: about 63 % of the slots fill, 004 Lemma A.10). A tensor whose
        num_slots would pass 2^31 - 1 is a ValueError when it is encoded.
      num_samples: elements sampled to estimate the threshold, 1 to 2^31 - 1. Default 65536.
      artopk_owner: whose indices AR-Topk buckets use (003 Alg. 1): "star" (round-robin over the
        steps, default) or "var" (the worker whose accumulated gradient has the largest variance).
      union_limit: in the hash-partitioned sparse allreduce (`tfcomp.strategies.PARTITIONED` buckets), the reduced
        result keeps at most union_limit * k of the summed elements, k the payload's slots: each of
        the K owners its ceil(union_limit * k / K) largest in magnitude; what an owner drops stays
        in its senders' residuals (with error feedback). None keeps the whole union of the
        workers' indices (lossless; its traffic then depends on how much they overlap, and the
        cost model prices the worst case). Default 1.0: the k largest sums of the union (as
        gTop-k), a number in (0, 2^31 - 1].
      error_feedback, momentum, adam, warmup_steps, planning, strategy, min_elements: see `Compressor`.
        Default error feedback on, no momentum or Adam correction, no warm-up, cost-model planning.
    Each worker hashes with its own seed, which changes every step.
    """

    payload_shows_non_finite = True
    fuses_residual = True

    def __init__(self, ratio=0.001, *, slots_per_element=1.0, num_samples=65536, **kwargs):
        if not _is_real(slots_per_element) or not 0 < slots_per_element <= _MAX_SLOTS_PER_ELEMENT:
            raise ValueError(f"slots_per_element must be a number in (0, 2^31 - 1], got {slots_per_element!r}")
        self.slots_per_element = float(slots_per_element)
        self.num_samples = _check_int("num_samples", num_samples, 1, _INT32_MAX, "the op's int32 range")
        super().__init__(ratio, **kwargs)

    def payload_length(self, size: int) -> int:
        return max(1, math.floor(self.slots_per_element * self.ratio * size + 0.5))

    def encode(self, flat, seed, worker):
        """As `Compressor.encode`; flat may also be a list (float32 [n_i] each): a bucket's tensors,
        read in place as their concatenation."""
        return Encoded(self._compress(flat, None, seed, worker))

    def encode_sum(self, flat, residual, seed, worker):
        """As `Compressor.encode_sum`; flat and residual may also be lists (float32 [n_i] each, one
        residual per gradient): a bucket's tensors, read in place as their concatenation, and then
        the sums come back as a list of the same shapes."""
        values, indices, accumulated = self._compress(flat, residual, seed, worker)
        return Encoded((values, indices)), accumulated

    def _compress(self, flat, residual, seed, worker):
        """dragonn_compress's outputs for flat (a tensor or the list of a bucket's parts; + residual,
        added in its pass, then also the sum)."""
        size = sum(int(f.shape[0]) for f in flat) if isinstance(flat, list) else int(flat.shape[0])
        num_slots = self.payload_length(size)
        if num_slots > _INT32_MAX:
            raise ValueError(f"slots_per_element={self.slots_per_element!r} with ratio={self.ratio!r} gives a tensor "
                             f"of {size} elements {num_slots} slots, more than the op's {_INT32_MAX}")
        hash_seed = seed * 1_000_003 + worker
        threshold = ops.estimate_threshold(flat, self.ratio, self.num_samples, hash_seed, addend=residual)
        return ops.dragonn_compress(flat, threshold, num_slots, hash_seed, addend=residual)


class DGC(_Sparsifier):
    """DGC threshold sparsification (004 Algorithm 3): sampled threshold, then the selected elements
    in index order, the first ratio * size of them.

    Args:
      ratio: fraction of elements to send, in (0, 1]. Default 0.001.
      num_samples: elements sampled to estimate the threshold, 1 to 2^31 - 1. Default 65536.
      artopk_owner, union_limit, error_feedback, momentum, adam, warmup_steps, planning, strategy, min_elements: see
        `DRAGONN` and `Compressor`.
    """

    def __init__(self, ratio=0.001, *, num_samples=65536, **kwargs):
        self.num_samples = _check_int("num_samples", num_samples, 1, _INT32_MAX, "the op's int32 range")
        super().__init__(ratio, **kwargs)

    def encode(self, flat, seed, worker):
        threshold = ops.estimate_threshold(flat, self.ratio, self.num_samples, seed * 1_000_003 + worker)
        return Encoded(ops.dgc_compress(flat, threshold, self.payload_length(int(flat.shape[0]))))


class TopK(_Sparsifier):
    """Exact top-k sparsification: the ratio * size elements of largest magnitude.

    Args:
      ratio: fraction of elements to send, in (0, 1]. Default 0.001.
      artopk_owner, union_limit, error_feedback, momentum, adam, warmup_steps, planning, strategy, min_elements: see
        `DRAGONN` and `Compressor`.
    """

    payload_shows_non_finite = True

    def __init__(self, ratio=0.001, **kwargs):
        super().__init__(ratio, **kwargs)

    def encode(self, flat, seed, worker):
        return Encoded(ops.topk_compress(flat, self.payload_length(int(flat.shape[0]))))


class RandomK(Compressor):
    """Random-k sparsification with indices drawn from a seed shared by all ranks, so the values of
    all workers sit at the same indices and are summed by allreduce.

    Args:
      ratio: fraction of elements to send, in (0, 1]. Default 0.01.
      error_feedback, momentum, adam, warmup_steps, planning, strategy, min_elements: see `Compressor`.
    """

    collective = st.ALLREDUCE
    strategies = (st.DENSE, st.ALLREDUCE)

    def __init__(self, ratio=0.01, *, error_feedback=True, **kwargs):
        self.ratio = _check_ratio(ratio)
        super().__init__(error_feedback=error_feedback, **kwargs)

    def payload_bytes(self, size):
        return 4 * _num_selected(self.ratio, size)

    def encode(self, flat, seed, worker):
        size = int(flat.shape[0])
        k = _num_selected(self.ratio, size)
        # fold_in hashes the whole seed (raw seeds that differ only in high bits must not repeat);
        # the first k of a seeded permutation are k distinct indices, the same on every rank.
        key = tf.random.experimental.stateless_fold_in(tf.constant([0x5EED, size], tf.int64), seed)
        indices = tf.random.experimental.stateless_shuffle(tf.range(size, dtype=tf.int32), key)[:k]
        return Encoded((tf.gather(flat, indices),), indices)

    def decode_local(self, encoded, size):
        return ops.sparse_batched_decode(encoded.wire[0], encoded.context, size)

    def decode_sum(self, wire, context, size, num_workers, scale=1.0):
        return ops.sparse_batched_decode(scale_values(wire[0], scale), context, size)

    def sent_pairs(self, encoded):
        return encoded.wire[0], encoded.context


class EFSignSGD(Compressor):
    """Scaled sign compression with error feedback (EF-SignSGD): 1 bit per element, packed 8 to a
    byte, and one float32 scale (the mean magnitude). Payload: ceil(size / 8) + 4 bytes.

    Args:
      error_feedback, momentum, adam, warmup_steps, planning, strategy, min_elements: see `Compressor` (error feedback on).
    """

    payload_shows_non_finite = True

    def __init__(self, *, error_feedback=True, **kwargs):
        super().__init__(error_feedback=error_feedback, **kwargs)

    _BIT_WEIGHTS = (1, 2, 4, 8, 16, 32, 64, 128)

    def payload_bytes(self, size):
        return -(-size // 8) + 4

    def encode(self, flat, seed, worker):
        size = int(flat.shape[0])
        scale = tf.reshape(tf.reduce_mean(tf.abs(flat)), [1])
        # Bits packed in uint8 throughout (int32 took 4 bytes per element, 3 tensors of them).
        bits = tf.pad(tf.cast(flat >= 0, tf.uint8), [[0, -size % 8]])
        weights = tf.constant(self._BIT_WEIGHTS, tf.uint8)
        return Encoded((tf.reduce_sum(tf.reshape(bits, [-1, 8]) * weights, axis=1), scale))

    def _unpack(self, packed, scale, size):
        """float32 [size] of +-scale from one worker's packed bits (uint8 [ceil(size / 8)])."""
        bits = tf.bitwise.bitwise_and(tf.reshape(packed, [-1, 1]), tf.constant(self._BIT_WEIGHTS, tf.uint8))
        return tf.reshape(tf.where(bits > 0, scale, -scale), [-1])[:size]

    def decode_local(self, encoded, size):
        packed, scale = encoded.wire
        return self._unpack(packed, scale[0], size)

    def decode_sum(self, wire, context, size, num_workers, scale=1.0):
        # One worker at a time into the total: one dense float32 tensor in flight, not K.
        packed, magnitudes = wire
        scale = scale_values(magnitudes, scale)
        packed = tf.reshape(packed, [num_workers, -1])
        total = self._unpack(packed[0], scale[0], size)
        for worker in range(1, num_workers):
            total += self._unpack(packed[worker], scale[worker], size)
        return total


class QSGD(Compressor):
    """QSGD stochastic quantisation (Alistarh et al.): each element becomes a signed level in
    [-s, s], s = 2^bits - 1, of the tensor's L2 norm, rounded up or down at random so that the
    quantised tensor is unbiased. Levels travel as int8 (one byte per element) with one float32 norm.

    Args:
      bits: 1 to 7 bits of magnitude (plus the sign). Default 4.
      error_feedback: default False (QSGD is unbiased); momentum, adam, warmup_steps, planning, strategy,
        min_elements: see
        `Compressor`.
    """

    payload_shows_non_finite = True

    def __init__(self, bits=4, *, error_feedback=False, **kwargs):
        if not isinstance(bits, numbers.Integral) or isinstance(bits, (bool, np.bool_)) or not 1 <= bits <= 7:
            raise ValueError(f"bits must be an integer in [1, 7], got {bits!r}")
        self.bits = int(bits)
        super().__init__(error_feedback=error_feedback, **kwargs)

    def payload_bytes(self, size):
        return size + 4

    def encode(self, flat, seed, worker):
        levels = float(2**self.bits - 1)
        norm = tf.norm(flat)
        scaled = tf.math.divide_no_nan(tf.abs(flat), norm) * levels
        noise = tf.random.stateless_uniform(tf.shape(flat), seed=tf.stack([seed, tf.cast(worker, tf.int64)]))
        # The sign applied in int8 (a float32 tf.sign(flat) took 4 bytes per element); the levels
        # are integers in [0, s], so this is the same as casting magnitude * sign.
        magnitude = tf.cast(tf.minimum(tf.floor(scaled + noise), levels), tf.int8)
        return Encoded((tf.where(flat < 0, -magnitude, magnitude), tf.reshape(norm, [1])))

    def _dequantise(self, levels, norm):
        """float32 [size] of one worker's levels times its norm / s."""
        return tf.cast(levels, tf.float32) * (norm / float(2**self.bits - 1))

    def decode_local(self, encoded, size):
        levels, norm = encoded.wire
        return self._dequantise(levels, norm[0])

    def decode_sum(self, wire, context, size, num_workers, scale=1.0):
        # One worker at a time into the total: one dense float32 tensor in flight, not K.
        levels, norm = wire
        norm = scale_values(norm, scale)
        levels = tf.reshape(levels, [num_workers, -1])
        total = self._dequantise(levels[0], norm[0])
        for worker in range(1, num_workers):
            total += self._dequantise(levels[worker], norm[worker])
        return total


class IntQuant(Compressor):
    """Allreduce-compatible stochastic quantisation (THC, Li et al., NSDI 2024): integer levels that
    Horovod's int32 allreduce sums directly, so the traffic does not grow with K as an allgather's.

    Each element x becomes the integer level floor(x / s * L + u), u uniform in [0, 1), so that its
    expectation is x / s * L (unbiased); s is the scale agreed by all ranks (the largest |x| of any
    worker's tensor, by one allgather of one float32 per bucket), and L = floor((2^(bits-1) - 1) / K)
    levels on each side, so that the sum of K workers' levels fits in `bits` signed bits.
    32 / bits levels are packed into each int32 (level j times 2^(bits j)); the allreduce's sum of
    those lanes is the packed sum of the levels, exact because no field's sum leaves its range, and
    is unpacked after it. Payload: 4 * ceil(size / (32 / bits)) bytes (8 bits: a quarter of float32).

    Args:
      bits: 4, 8 or 16 bits per element on the wire. Default 8. A run needs K <= 2^(bits-1) - 1
        workers (at least one level each side): 7 workers at 4 bits, 127 at 8.
      error_feedback: default True (the residual keeps what rounding left out); False gives the
        unbiased quantiser alone. momentum, adam, warmup_steps, planning, strategy, min_elements:
        see `Compressor`.
    """

    collective = st.ALLREDUCE
    strategies = (st.DENSE, st.ALLREDUCE)
    agrees_scale = True

    def __init__(self, bits=8, *, error_feedback=True, **kwargs):
        if not isinstance(bits, numbers.Integral) or isinstance(bits, (bool, np.bool_)) or bits not in (4, 8, 16):
            raise ValueError(f"bits must be 4, 8 or 16, got {bits!r}")
        self.bits = int(bits)
        super().__init__(error_feedback=error_feedback, **kwargs)

    @property
    def fields(self) -> int:
        """Levels packed into one int32."""
        return 32 // self.bits

    def payload_bytes(self, size):
        return 4 * -(-size // self.fields)

    def levels(self, num_workers: int) -> int:
        """L, the levels on each side of zero for K = num_workers: floor((2^(bits-1) - 1) / K)."""
        levels = (2 ** (self.bits - 1) - 1) // num_workers
        if levels < 1:
            raise ValueError(f"IntQuant(bits={self.bits}) sums at most {2 ** (self.bits - 1) - 1} workers without "
                             f"overflow, got {num_workers}: use more bits")
        return levels

    @staticmethod
    def local_scale(flat: tf.Tensor) -> tf.Tensor:
        """float32 scalar: this worker's largest |x| (the agreed scale is the largest over workers)."""
        return tf.reduce_max(tf.abs(flat))

    def encode(self, flat, seed, worker):
        """`encode_scaled` with this worker's own scale, for one worker."""
        return self.encode_scaled(flat, self.local_scale(flat), seed, worker, 1)

    def encode_scaled(self, flat, scale, seed, worker: int, num_workers: int) -> Encoded:
        """flat: float32 [size]; scale: float32 scalar >= max |flat| agreed by the K = num_workers
        ranks. Wire: (int32 [ceil(size / fields)],) from `ops.int_quantize`, its rounding noise
        drawn from seed * 1_000_003 + worker; context: (scale, L)."""
        levels = self.levels(num_workers)
        return Encoded((ops.int_quantize(flat, scale, seed * 1_000_003 + worker, self.bits, levels),), (scale, levels))

    def _dequantise(self, lanes, context, size: int, factor: float = 1.0) -> tf.Tensor:
        scale, levels = context
        return ops.int_dequantize(lanes, scale * (factor / levels), self.bits, size)

    def decode_local(self, encoded, size):
        return self._dequantise(encoded.wire[0], encoded.context, size)

    def decode_sum(self, wire, context, size, num_workers, scale=1.0):
        return self._dequantise(wire[0], context, size, scale)


class _DenseCompressor(Compressor):
    """Sent by Horovod's allreduce; no hyper-parameters."""

    collective = st.DENSE
    strategies = (st.DENSE,)

    def __init__(self):
        super().__init__(error_feedback=False)

    def get_config(self) -> dict:
        return {}


class FP16(_DenseCompressor):
    """Half-precision allreduce, exactly `hvd.Compression.fp16` (no error feedback)."""

    dense_element_bytes = 2

    def payload_bytes(self, size):
        return 2 * size


class NoCompression(_DenseCompressor):
    """Plain allreduce, exactly `hvd.Compression.none`."""

    def payload_bytes(self, size):
        return 4 * size


_PUBLIC = ("DRAGONN", "DGC", "TopK", "RandomK", "EFSignSGD", "QSGD", "IntQuant", "FP16", "NoCompression")
_PUBLIC_LIST = ", ".join(f"tfcomp.{name}()" for name in _PUBLIC)
_EXPECTED = ("compression must be a tfcomp compressor instance such as tfcomp.DRAGONN(), or Horovod's "
             "hvd.Compression.none / hvd.Compression.fp16")


def _horovod_compressor_base():
    """horovod.tensorflow.compression.Compressor, or None without Horovod."""
    try:
        from horovod.tensorflow.compression import Compressor as HorovodCompressor
    except ImportError:
        return None
    return HorovodCompressor


def _is_horovod_compressor(compression) -> bool:
    """Horovod's own compressor: a subclass of horovod.tensorflow.compression.Compressor (as
    hvd.Compression.none and .fp16 are) or an instance of one."""
    base = _horovod_compressor_base()
    if base is None:
        return False
    return isinstance(compression, base) or (isinstance(compression, type) and issubclass(compression, base))


def _class_name(cls: type) -> str:
    if cls.__name__ in _PUBLIC and globals().get(cls.__name__) is cls:
        return f"tfcomp.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def _wrong_compression(compression) -> TypeError:
    """The TypeError for a `compression` that neither tfcomp nor Horovod can run: what was given and
    what to write instead."""
    if isinstance(compression, type) and issubclass(compression, Compressor):
        name = _class_name(compression)
        if compression.__name__ in _PUBLIC and name == f"tfcomp.{compression.__name__}":
            return TypeError(f"{_EXPECTED}; got the class {name}: add () to make one, compression={name}()")
        return TypeError(f"{_EXPECTED}; got the class {name}: write one of {_PUBLIC_LIST}")
    if isinstance(compression, str):
        wanted = "".join(c for c in compression.lower() if c.isalnum())
        names = {name.lower(): name for name in _PUBLIC} | {"none": "NoCompression", "topk": "TopK"}
        if wanted in names:
            fix = f"write compression=tfcomp.{names[wanted]}()"
        else:
            fix = f"write one of {_PUBLIC_LIST}"
        return TypeError(f"{_EXPECTED}; got {compression!r} (a string): {fix}")
    if compression is None:
        return TypeError(f"{_EXPECTED}; got None: leave compression out or write hvd.Compression.none")
    if isinstance(compression, type) and compression.__name__ == "Compression" and hasattr(compression, "none"):
        return TypeError(f"{_EXPECTED}; got hvd.Compression itself ({compression!r}): "
                         "write hvd.Compression.none or hvd.Compression.fp16")
    if isinstance(compression, type):
        return TypeError(f"{_EXPECTED}; got the class {_class_name(compression)} ({compression!r})")
    return TypeError(f"{_EXPECTED}; got {compression!r} (a {type(compression).__module__}."
                     f"{type(compression).__qualname__})")


def check_compression(compression):
    """`compression` unchanged if tfcomp or Horovod can run it, else a TypeError that says what was
    given and what to write instead.

    Returned unchanged: a tfcomp `Compressor` instance; Horovod's own compressors, that is any
    subclass of `horovod.tensorflow.compression.Compressor` (`hvd.Compression.none`,
    `hvd.Compression.fp16`, a user's own) or an instance of one. TypeError for everything else:
    a tfcomp compressor class (`tfcomp.DRAGONN`: "add ()"), a string ("dragonn": "write
    compression=tfcomp.DRAGONN()"), `hvd.Compression` itself, None, any other object. Never
    imports more than `horovod.tensorflow.compression` and never constructs anything.
    """
    if isinstance(compression, Compressor) or _is_horovod_compressor(compression):
        return compression
    raise _wrong_compression(compression)


def as_compressor(compression) -> Compressor:
    """A tfcomp compressor for `compression`: a tfcomp Compressor (returned as it is), None or
    Horovod's Compression.none (`NoCompression()`), Horovod's Compression.fp16 (`FP16()`), classes
    or instances. TypeError for anything else (see `check_compression`), and for Horovod
    compressors other than those two, which only Horovod's own exchange runs."""
    if isinstance(compression, Compressor):
        return compression
    if compression is None:
        return NoCompression()
    check_compression(compression)
    from horovod.tensorflow.compression import FP16Compressor, NoneCompressor

    for horovod_class, ours in ((NoneCompressor, NoCompression), (FP16Compressor, FP16)):
        if compression is horovod_class or type(compression) is horovod_class:
            return ours()
    given = compression if isinstance(compression, type) else type(compression)
    raise TypeError(f"{_EXPECTED}; got the Horovod compressor {_class_name(given)}, which tfcomp does not run: "
                    "pass it to hvd.DistributedOptimizer (Horovod's own exchange) instead")
