"""The compressed gradient exchange behind both entry points.

`GradientExchange` is what Horovod's Keras `DistributedOptimizer` calls as its "allreduce grads"
function once `tfcomp` is imported and a tfcomp compressor is given (see `tfcomp.horovod_glue`).
For a list of gradients it returns the list of reduced gradients, averaged or summed over the
process set as `op` says. On the first call it makes the plan (`tfcomp.planning`): the floating-point
dense gradients, in backprop order, split into buckets, each with a strategy; with planning="auto"
from the cost model calibrated on the cluster (`tfcomp.calibration`), checked equal on all ranks and
printed on rank 0. Every step then:

  * compressed buckets: each tensor's gradient plus its error-feedback residual (or DGC momentum
    correction), concatenated, encoded as one tensor (MergeComp), the remainder kept as the new
    residuals; buckets of one strategy share one grouped collective: allgather (decoded by one
    `sparse_batched_decode` of all K workers' payloads), allreduce (RandomK's shared indices), or
    AR-Topk (the owner's indices broadcast, values at them allreduced); divided by K for Average;
  * dense buckets: one Horovod grouped allreduce each (per dtype), and one more for the other dense
    tensors, with Horovod's prescale/postscale factors (fp16 on the wire for `tfcomp.FP16()`): the
    same reduction plain Horovod runs, with one op per bucket instead of one per tensor;
  * `tf.IndexedSlices` (embeddings) unless `sparse_as_dense`: Horovod's sparse allreduce (allgather).

The first `compressor.warmup_steps` communicating steps send the compressible tensors dense (with
their residuals, which are then cleared). Residuals are updated only when every reduced gradient is
finite, so a step that a loss-scale optimizer skips leaves them untouched. A step counter, saved with
the residuals, derives the per-step seeds, equal on all ranks.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import NamedTuple

import horovod.tensorflow as hvd
import tensorflow as tf

from tfcomp import calibration, ops, planning
from tfcomp.compressors import Compressor, FP16
from tfcomp.cost_model import ClusterModel
from tfcomp.memory import ErrorFeedback

__all__ = ["GradientExchange", "HorovodCollectives", "LocalCollectives", "TensorRecord"]


def _grouped_by_dtype(collective, tensors, **kwargs):
    """Runs a Horovod grouped collective (which needs one dtype per group) once per dtype, in order
    of first appearance, and returns the results in the order of `tensors`."""
    results = [None] * len(tensors)
    dtypes = list(dict.fromkeys(t.dtype for t in tensors))
    for dtype in dtypes:
        positions = [i for i, t in enumerate(tensors) if t.dtype == dtype]
        for i, r in zip(positions, collective([tensors[i] for i in positions], **kwargs)):
            results[i] = r
    return results


class HorovodCollectives:
    """The collectives of the compressed buckets, over a Horovod process set (lists are grouped)."""

    def __init__(self, process_set):
        self.process_set = process_set

    @property
    def size(self) -> int:
        return self.process_set.size()

    @property
    def rank(self) -> int:
        return self.process_set.rank()

    def included(self) -> bool:
        return self.process_set.included()

    def allgather(self, tensors):
        return _grouped_by_dtype(hvd.grouped_allgather, tensors, process_set=self.process_set)

    def allreduce_sum(self, tensors):
        return _grouped_by_dtype(hvd.grouped_allreduce, tensors, op=hvd.Sum, process_set=self.process_set)

    def broadcast(self, tensor, root: int, name: str):
        return hvd.broadcast(tensor, root, process_set=self.process_set, name=name)


class LocalCollectives:
    """Stand-ins that communicate nothing, for timing the compression work of `size` workers
    (calibration): allgather returns this worker's tensor repeated `size` times, allreduce returns
    it as it is, broadcast returns the tensor."""

    def __init__(self, size: int):
        self.size, self.rank = size, 0

    def allgather(self, tensors):
        return [tf.concat([t] * self.size, axis=0) for t in tensors]

    def allreduce_sum(self, tensors):
        return [tf.identity(t) for t in tensors]

    def broadcast(self, tensor, root: int, name: str):
        del root, name
        return tf.identity(tensor)

    def included(self) -> bool:
        return True


class _UntrackedFunction:
    """Holds the exchange's tf.function out of sight of object tracking: SavedModel export would
    otherwise retrace it in its own graph, where the variables it uses are stand-ins."""

    def __init__(self, function):
        self._function = function

    def __call__(self, *args):
        return self._function(*args)


@dataclass(frozen=True)
class TensorRecord:
    """How one gradient is exchanged: name, elements, strategy, bytes per worker per step
    (sent_bytes -1: depends on the step, as for IndexedSlices; a compressed bucket's payload is
    shared out by elements), and its bucket in the plan (-1: not planned)."""

    name: str
    elements: int
    strategy: str
    dense_bytes: int
    sent_bytes: int
    bucket: int = -1


class _Payload(NamedTuple):
    """One bucket's wire tensors, what decoding needs besides them, and the dense value of what this
    worker sent (float32 [n], for error feedback; None without)."""

    wire: tuple
    context: object
    sent: object


def _concat(flats):
    return flats[0] if len(flats) == 1 else tf.concat(flats, axis=0)


def _split(flat, bucket, grads):
    """The bucket's flat tensor cut back into its tensors' flat parts, in bucket order."""
    if len(bucket.positions) == 1:
        return [flat]
    return tf.split(flat, [int(grads[i].shape.num_elements()) for i in bucket.positions])


def _wire_bytes(compressor, bucket) -> int:
    """Bytes one worker sends for a compressed bucket (AR-Topk: the values; the owner's indices too)."""
    if bucket.strategy == "artopk":
        return 4 * compressor.payload_length(bucket.elements)
    return compressor.payload_bytes(bucket.elements)


class GradientExchange(tf.Module):
    """Callable (grads, vars) -> reduced grads, with error feedback state tracked as a tf.Module.

    Args:
      compressor: a `tfcomp.Compressor`.
      op: `hvd.Average` or `hvd.Sum`.
      gradient_predivide_factor: as in Horovod; applies to the tensors sent dense (the compressed
        ones are summed in float32 by the decode and then divided by K).
      sparse_as_dense: convert `tf.IndexedSlices` gradients to dense tensors first.
      process_set: the Horovod process set to reduce over.
      name: name scope of the exchange's ops.
      plan: a fixed `tfcomp.planning.Plan` for the gradients it will see (default: made on the
        first call); collectives: what the compressed buckets use (default: Horovod's over
        process_set; calibration passes `LocalCollectives` to time the compression alone).
    """

    def __init__(self, compressor: Compressor, *, op=hvd.Average, gradient_predivide_factor: float = 1.0,
                 sparse_as_dense: bool = False, process_set=hvd.global_process_set, name: str = "tfcomp",
                 plan=None, collectives=None):
        super().__init__(name=name.replace(">", "_"))
        if op not in (hvd.Average, hvd.Sum):
            raise ValueError(f"op must be hvd.Average or hvd.Sum for tfcomp compressors, got {op!r}")
        self.compressor = compressor
        self.op = op
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self.sparse_as_dense = bool(sparse_as_dense)
        self.process_set = process_set
        self.memory = ErrorFeedback()
        with tf.init_scope():
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="communication_step")
        self.collectives = collectives or HorovodCollectives(process_set)
        self.records: tuple = ()
        self.plan = plan
        self._plans = {}
        self._cluster = None
        self.calibration_seconds = 0.0  # how long the first step's calibration took (0: cached or none)
        self._graph_fn = _UntrackedFunction(tf.function(self._exchange, autograph=False))

    def __call__(self, grads, vars=None, use_generic_names=False):  # noqa: A002 (Horovod's signature)
        del use_generic_names
        grads = list(grads)
        if vars is None:
            raise ValueError("tfcomp's exchange needs the variables of the gradients (for error feedback)")
        if not self.collectives.included():
            return grads
        present = [i for i, g in enumerate(grads) if g is not None]
        grads_in = [self._densify(grads[i], vars[i]) for i in present]
        vars_in = [vars[i] for i in present]
        plan = self._plan_for(grads_in, vars_in)
        # Memory is created here, outside the exchange's tf.function, so that a variable whose
        # gradient first appears on a later call (a retrace) can still get its residual.
        if self.compressor.error_feedback:
            for bucket in plan.compressed:
                for position in bucket.positions:
                    self.memory.residual(vars_in[position], grads_in[position].shape.num_elements(),
                                         with_momentum=self.compressor.momentum is not None)
        reduced = self._graph_fn(grads_in, vars_in)
        out = list(grads)
        for i, r in zip(present, reduced):
            out[i] = r
        return out

    def _densify(self, grad, var):
        """With sparse_as_dense, IndexedSlices become dense tensors of the variable's static shape."""
        if self.sparse_as_dense and isinstance(grad, tf.IndexedSlices):
            return tf.reshape(tf.convert_to_tensor(grad), var.shape)
        return grad

    # -- the plan ----------------------------------------------------------------------------------

    def _plan_for(self, grads, vars):  # noqa: A002
        """The plan for this list of gradients: made once per list of (name, shape, dtype), on the
        first call, eagerly and on every rank at the same time (calibration and the digest check
        are collectives), then reused by every retrace."""
        candidates = [i for i, g in enumerate(grads)
                      if not isinstance(g, tf.IndexedSlices) and g.dtype.is_floating and self.compressor.collective != "dense"]
        signature = tuple((getattr(vars[i], "name", str(i)), tuple(grads[i].shape), grads[i].dtype.name)
                          for i in candidates)
        if signature in self._plans:
            self.plan = self._plans[signature]
            return self.plan
        if self.plan is not None and not self._plans:  # given to the constructor
            self._plans[signature] = self.plan
            return self.plan
        # Backprop order: the last variables' gradients are computed first.
        tensors = [(i, getattr(vars[i], "name", f"grad_{i}"), int(grads[i].shape.num_elements()))
                   for i in reversed(candidates)]
        with tf.init_scope():
            if self.compressor.planning == "off" or not tensors:
                plan = planning.per_tensor_plan(tensors, self.compressor, ClusterModel.unpriced(self.process_set.size()))
            else:
                if self._cluster is None:
                    start = time.perf_counter()
                    self._cluster = calibration.calibrate(self.compressor, self.process_set,
                                                          max_elements=sum(n for _, _, n in tensors),
                                                          tensor_elements=[n for _, _, n in tensors])
                    self.calibration_seconds = time.perf_counter() - start
                plan = planning.make_plan(tensors, self.compressor, self._cluster)
            if self.process_set.size() > 1:
                planning.check_same_plan(plan, self.process_set)
        if self.process_set.rank() == 0 and self.process_set.size() > 1 and self.compressor.planning == "auto" and tensors:
            print(f"tfcomp: calibrated in {self.calibration_seconds:.1f} s\n{plan.table()}", flush=True)
        self._plans[signature] = self.plan = plan
        return plan

    # -- the graph ---------------------------------------------------------------------------------

    def _dense_factors(self):
        if self.op == hvd.Average:
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _allreduce_dense(self, tensors):
        """The tensors reduced by one Horovod grouped allreduce per dtype: one op and one entry in
        Horovod's negotiation for the group, where Horovod's own optimizer has one per tensor (on
        the 82-tensor model of benchmarks/network_worker.py, unshaped, a step took 0.94 to 1.02 of
        plain Horovod's in four validation runs: BENCHMARKS.md). The group starts once all its
        tensors are ready."""
        prescale, postscale = self._dense_factors()
        compression = hvd.Compression.fp16 if isinstance(self.compressor, FP16) else hvd.Compression.none
        return _grouped_by_dtype(hvd.grouped_allreduce, tensors, op=self.op, prescale_factor=prescale,
                                 postscale_factor=postscale, compression=compression, process_set=self.process_set)

    def _record(self, grads, vars):  # noqa: A002
        """How each gradient will be exchanged (for describe())."""
        compressor = self.compressor
        bucket_of = {p: (n, b) for n, b in enumerate(self.plan.buckets) for p in b.positions}
        records = []
        for i, (g, v) in enumerate(zip(grads, vars)):
            name = getattr(v, "name", f"grad_{i}")
            size = int(v.shape.num_elements())
            dense_bytes = g.dtype.size * size
            number, bucket = bucket_of.get(i, (-1, None))
            if isinstance(g, tf.IndexedSlices):
                records.append(TensorRecord(name, size, "sparse allgather", dense_bytes, -1, number))
            elif bucket is not None and bucket.strategy != "dense":
                # The bucket's payload, shared out by elements.
                sent = round(_wire_bytes(compressor, bucket) * size / bucket.elements)
                records.append(TensorRecord(name, size, f"{type(compressor).__name__} {bucket.strategy}",
                                            dense_bytes, sent, number))
            elif isinstance(compressor, FP16):
                records.append(TensorRecord(name, size, "fp16 allreduce", dense_bytes, 2 * size, number))
            else:
                records.append(TensorRecord(name, size, "allreduce", dense_bytes, dense_bytes, number))
        self.records = tuple(records)

    def _exchange(self, grads, vars):  # noqa: A002
        self._record(grads, vars)
        out = [None] * len(grads)
        compressed = self.plan.compressed
        planned = {p for b in self.plan.buckets for p in b.positions}
        # One grouped allreduce per dense bucket, one more for the dense tensors the plan left out.
        dense_groups = [b.positions for b in self.plan.buckets if b.strategy == "dense"]
        dense_groups.append([i for i, g in enumerate(grads) if i not in planned and not isinstance(g, tf.IndexedSlices)])
        prescale, postscale = self._dense_factors()
        for i, g in enumerate(grads):
            if isinstance(g, tf.IndexedSlices):
                out[i] = hvd.allreduce(g, op=self.op, prescale_factor=prescale, postscale_factor=postscale,
                                       process_set=self.process_set)
        for group in dense_groups:
            for i, r in zip(group, self._allreduce_dense([grads[i] for i in group])):
                out[i] = r
        if compressed:
            accumulated = [self._accumulate_bucket(b, grads, vars) for b in compressed]
            if self.compressor.warmup_steps > 0:
                reduced, memory = tf.cond(self.step < self.compressor.warmup_steps,
                                          lambda: self._send_dense(accumulated),
                                          lambda: self._send_compressed(accumulated, compressed))
            else:
                reduced, memory = self._send_compressed(accumulated, compressed)
            if self.compressor.error_feedback:
                # A step whose reduced gradients are not all finite is one a loss-scale optimizer
                # skips: the memory stays as it was.
                finite = [tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(r)))
                          for r in list(reduced) + [o for o in out if o is not None]]
                keep = tf.logical_not(tf.reduce_all(finite))
                updates = []
                for bucket, (new_residual, new_momentum) in zip(compressed, memory):
                    updates += self._update_memory(bucket, grads, vars, new_residual, new_momentum, keep)
                with tf.control_dependencies(updates):
                    reduced = [tf.identity(r) for r in reduced]
            for bucket, total in zip(compressed, reduced):
                for i, part in zip(bucket.positions, _split(total, bucket, grads)):
                    out[i] = tf.cast(tf.reshape(part, tf.shape(grads[i])), grads[i].dtype)
        self.step.assign_add(1)
        return out

    def _accumulate_bucket(self, bucket, grads, vars):  # noqa: A002
        """(flat float32 gradients plus memory of the bucket's tensors, concatenated; DGC momentum or None)."""
        parts = [self._accumulate(grads[i], vars[i]) for i in bucket.positions]
        accumulated = _concat([acc for acc, _ in parts])
        momentum = None if parts[0][1] is None else _concat([m for _, m in parts])
        return accumulated, momentum

    def _accumulate(self, grad, var):
        """(flat float32 gradient plus memory of one tensor, DGC momentum or None)."""
        compressor = self.compressor
        flat = tf.reshape(tf.cast(grad, tf.float32), [-1])
        if not compressor.error_feedback:
            return flat, None
        size = int(flat.shape[0])
        residual = self.memory.residual(var, size, with_momentum=compressor.momentum is not None)
        if compressor.momentum is None:
            return flat + residual, None
        momentum = compressor.momentum * self.memory.momentum(var, size) + flat
        return residual + momentum, momentum

    def _update_memory(self, bucket, grads, vars, new_residual, new_momentum, keep):  # noqa: A002
        """Assigns the new memory of the bucket's variables unless `keep` (a bool tensor) says not to."""
        residuals = _split(new_residual, bucket, grads)
        momenta = [None] * len(residuals) if new_momentum is None else _split(new_momentum, bucket, grads)
        updates = []
        for i, part, momentum_part in zip(bucket.positions, residuals, momenta):
            size = int(part.shape[0])
            residual = self.memory.residual(vars[i], size, with_momentum=momentum_part is not None)
            updates.append(residual.assign(tf.where(keep, residual, part)))
            if momentum_part is not None:
                momentum = self.memory.momentum(vars[i], size)
                updates.append(momentum.assign(tf.where(keep, momentum, momentum_part)))
        return updates

    def _send_compressed(self, accumulated, buckets):
        """Encodes, exchanges and decodes the accumulated buckets.

        Returns (reduced buckets, [(new residual, new momentum or None)] or []). Buckets of one
        strategy share one grouped collective. A non-finite value anywhere in a bucket on any worker
        makes the bucket's reduced values NaN, as a dense allreduce would, even where the compressor
        did not send that value: each bucket's count of such values rides along with its payload.
        """
        compressor = self.compressor
        num_workers = self.collectives.size
        worker = self.collectives.rank
        payloads, memory = [], []
        for position, ((acc, momentum), bucket) in enumerate(zip(accumulated, buckets)):
            seed = self.step * 65536 + position
            if bucket.strategy == "artopk":
                payload = self._artopk_payload(acc, seed, worker, num_workers)
            else:
                encoded = compressor.encode(acc, seed, worker)
                payload = _Payload(encoded.wire, encoded.context,
                                   compressor.decode_local(encoded, int(acc.shape[0])) if compressor.error_feedback else None)
            non_finite = tf.reshape(tf.reduce_sum(tf.cast(~tf.math.is_finite(acc), tf.float32)), [1])
            payloads.append(payload._replace(wire=tuple(payload.wire) + (non_finite,)))
            if compressor.error_feedback:
                new_momentum = None if momentum is None else tf.where(payload.sent != 0, 0.0, momentum)
                memory.append((acc - payload.sent, new_momentum))
        received = [None] * len(buckets)
        for strategy in ("allgather", "allreduce", "artopk"):
            members = [n for n, b in enumerate(buckets) if b.strategy == strategy]
            if not members:
                continue
            wires = [t for n in members for t in payloads[n].wire]
            if strategy == "allgather":
                exchanged = self.collectives.allgather(wires)
            else:
                exchanged = self.collectives.allreduce_sum(wires)
            start = 0
            for n in members:
                received[n] = tuple(exchanged[start:start + len(payloads[n].wire)])
                start += len(payloads[n].wire)
        reduced = []
        for (acc, _), bucket, payload, wire in zip(accumulated, buckets, payloads, received):
            size = int(acc.shape[0])
            if bucket.strategy == "artopk":
                total = ops.sparse_batched_decode(wire[0], payload.context, size)
            else:
                total = compressor.decode_sum(wire[:-1], payload.context, size, num_workers)
            total = total / num_workers if self.op == hvd.Average else total
            reduced.append(tf.where(tf.reduce_sum(wire[-1]) > 0, float("nan"), total))
        return reduced, memory

    def _artopk_payload(self, acc, seed, worker, num_workers):
        """AR-Topk (003 Algorithm 1): the owner's selected indices are broadcast, every worker sends
        its values at them (to be summed by allreduce). Owner: round-robin over steps (STAR), or the
        worker whose accumulated gradient has the largest variance (VAR, ties to the lowest rank)."""
        _, own_indices = self.compressor.encode(acc, seed, worker).wire
        if self.compressor.artopk_owner == "var":
            variances, = self.collectives.allgather([tf.reshape(tf.math.reduce_variance(acc), [1])])
            owner = tf.cast(tf.argmax(variances), tf.int32)
        else:
            owner = tf.cast(self.step % num_workers, tf.int32)
        indices = tf.switch_case(owner, [
            functools.partial(self.collectives.broadcast, own_indices, root, f"tfcomp_artopk_indices_from_{root}")
            for root in range(num_workers)
        ])
        values = tf.where(indices >= 0, tf.gather(acc, tf.maximum(indices, 0)), 0.0)
        size = int(acc.shape[0])
        sent = ops.sparse_batched_decode(values, indices, size) if self.compressor.error_feedback else None
        return _Payload((values,), indices, sent)

    def _send_dense(self, accumulated):
        """Warm-up: gradient plus residual sent dense; the memory is then empty."""
        reduced = list(self._allreduce_dense([acc for acc, _ in accumulated]))
        memory = []
        if self.compressor.error_feedback:
            memory = [(tf.zeros_like(acc), None if momentum is None else tf.zeros_like(acc))
                      for acc, momentum in accumulated]
        return reduced, memory

    def bytes_per_step(self) -> tuple:
        """(dense bytes, sent bytes) one worker exchanges per step, over the tensors whose payload
        size is fixed (IndexedSlices are left out)."""
        known = [r for r in self.records if r.sent_bytes >= 0]
        return sum(r.dense_bytes for r in known), sum(r.sent_bytes for r in known)

    def compressed_tensors(self) -> list:
        """Names of the tensors the compressor encodes."""
        return [r.name for r in self.records if r.strategy.startswith(type(self.compressor).__name__)]

    def describe(self) -> str:
        """A table of how each gradient is exchanged and the bytes sent per step against dense."""
        if not self.records:
            return "tfcomp: no gradients exchanged yet"
        lines = [f"{'tensor':40s} {'elements':>10s} {'strategy':>22s} {'dense B':>10s} {'sent B':>10s}"]
        for r in self.records:
            sent_text = "varies" if r.sent_bytes < 0 else str(r.sent_bytes)
            lines.append(f"{r.name[:40]:40s} {r.elements:10d} {r.strategy:>22s} {r.dense_bytes:10d} {sent_text:>10s}")
        dense, sent = self.bytes_per_step()
        lines.append(f"{'total':40s} {'':10s} {'':22s} {dense:10d} {sent:10d}  ({sent / max(dense, 1):.2%} of dense)")
        return "\n".join(lines)
