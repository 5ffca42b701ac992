"""Alpha-beta cost model of the collectives tfcomp can use, and the 004 Eq. 1 test.

Times are in seconds, sizes in bytes. A `Network` has a one-way latency alpha (s) and a bandwidth
(bytes/s; beta = 1 / bandwidth). With K workers and S bytes (003 Table I and Eq. 4, 004 Sec. 4.2):

  ring allreduce of S          2 (K-1) (alpha + S / (K B))
  tree allreduce of S          2 log2(K) (alpha + S / B)
  broadcast of S               log2(K) (alpha + S / B)
  ring allgather, S per worker (K-1) (alpha + S / B)
  AR-Topk, ring (003 Eq. 4a)   broadcast of the indices + ring allreduce of the values
  AR-Topk, tree (003 Eq. 4b)   broadcast of the indices + tree allreduce of the values
  alltoall, S per worker       (K-1) (alpha + S / (K B))
  hash-partitioned sparse      alltoall of the k pairs + ring allgather of each owner's kept sums
    allreduce

Encode and decode times are affine in the number of elements, c0 + c1 * d (001 Assumption 5),
fitted from measurements with `AffineCost.fit`. The 004 Eq. 1 test says compression pays for a
tensor when encode + decode time < dense allreduce time - compressed exchange time.

Iteration times (000): with dense buckets overlapping the backward pass (Sec. 4.1),
T = max(gamma T_comp, sum of all but the last bucket's times) + the last bucket's time; with
compression after the backward pass (Appendix B), T = T_comp + T_encode_decode + T_comm.

`ClusterModel` holds what calibration measures (`tfcomp.calibration`): the allreduce and allgather
networks, the chosen compressor's encode+decode fit, per-tensor costs, and the fixed cost of
compressing at all, which an exchange pays once. `tfcomp.strategies` prices one bucket, or a
group of buckets, under each exchange strategy with these collectives; `tfcomp.planning` searches the
buckets and strategies with it.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass

__all__ = [
    "AffineCost",
    "CLUSTER_LIMITS",
    "HOROVOD_CYCLE_SECONDS",
    "HOROVOD_FUSION_BYTES",
    "MAX_OVERLAP_SLOWDOWN",
    "ClusterModel",
    "Network",
    "UNMEASURED",
    "StrategyTime",
    "compressed_iteration",
    "horovod_dense_finish",
    "network_queue_end",
    "overlapped_dense_iteration",
    "transfer_end",
    "alltoall",
    "artopk_ring",
    "artopk_tree",
    "broadcast",
    "compression_pays",
    "parse_bandwidth",
    "parse_count",
    "parse_latency",
    "partitioned_allreduce",
    "ring_allgather",
    "ring_allreduce",
    "tree_allreduce",
]

_NUMBER = r"([-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)"
_LATENCY_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_PREFIXES = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}  # decimal, either case
_BITS = ("bps", "bit/s", "bits/s", "bit", "b/s")  # as written: bit units have a lower-case b
_BYTES = ("Bps", "B/s", "byte/s", "bytes/s")
_COUNT_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9}


def _check_range(value: float, argument: str, text, allow_zero: bool) -> float:
    if value < 0 or (value == 0 and not allow_zero) or not math.isfinite(value):
        raise ValueError(f"{argument} must be {'>= 0' if allow_zero else '> 0'}, got {text!r}")
    return value


def parse_latency(text: str) -> float:
    """'1ms' -> 0.001 (seconds). Units: s, ms, us, ns (any case, a space allowed). 0 allowed,
    negative values are not."""
    match = re.fullmatch(rf"\s*{_NUMBER}\s*([a-zA-Z]+)\s*", str(text))
    if not match or match.group(2).lower() not in _LATENCY_UNITS:
        raise ValueError(f"latency must be a number with a unit ({', '.join(_LATENCY_UNITS)}), e.g. '1ms'; got {text!r}")
    return _check_range(float(match.group(1)) * _LATENCY_UNITS[match.group(2).lower()], "latency", text, True)


def parse_bandwidth(text: str) -> float:
    """'10Gbps' -> 1.25e9 (bytes per second); > 0. A decimal prefix k, M, G or T (either case),
    then bits as bps, bit/s, bit (as tc writes rates) or b/s, or bytes as Bps, B/s or byte/s:
    '10Gbit/s', '10 gbit', '400Mbps' and '1.25GB/s' are all accepted. The b is case-sensitive
    (b bits, B bytes), as in the units' usual spelling."""
    match = re.fullmatch(rf"\s*{_NUMBER}\s*([kKmMgGtT]?)([a-zA-Z/]+)\s*", str(text))
    unit = match.group(3) if match else ""
    per_byte = 1 / 8 if unit in _BITS or unit.lower() in ("bit", "bit/s", "bits/s") else 1.0 if unit in _BYTES else None
    if per_byte is None:
        raise ValueError(f"bandwidth must be a number with a unit of bits ({', '.join(_BITS)}) or bytes "
                         f"({', '.join(_BYTES)}) per second, with a prefix k, M, G or T, e.g. '10Gbit/s'; got {text!r}")
    value = float(match.group(1)) * _PREFIXES[match.group(2).lower()] * per_byte
    return _check_range(value, "bandwidth", text, False)


def parse_count(text: str, argument: str) -> int:
    """'25.6M' -> 25600000: a number of elements > 0, with an optional decimal suffix k, M, G or B
    (10^9; either case); a ValueError naming `argument` where it is not a whole number > 0."""
    match = re.fullmatch(rf"\s*{_NUMBER}\s*([a-zA-Z]?)\s*", str(text))
    suffix = match.group(2).lower() if match else None
    if suffix not in _COUNT_SUFFIXES:
        raise ValueError(f"{argument} must be a number of elements, e.g. 126000000, 1.2e8 or 25.6M; got {text!r}")
    value = float(match.group(1)) * _COUNT_SUFFIXES[suffix]
    if not (math.isfinite(value) and value >= 1 and value == round(value) and value < 2**63):
        raise ValueError(f"{argument} must be a whole number of elements >= 1, got {text!r}")
    return int(round(value))


@dataclass(frozen=True)
class Network:
    """One-way latency in seconds and bandwidth in bytes per second, both > 0 (latency may be 0)."""

    latency: float
    bandwidth: float

    def __post_init__(self):
        if not (isinstance(self.latency, (int, float)) and math.isfinite(self.latency) and self.latency >= 0):
            raise ValueError(f"latency must be a finite number of seconds >= 0, got {self.latency!r}")
        if not (isinstance(self.bandwidth, (int, float)) and math.isfinite(self.bandwidth) and self.bandwidth > 0):
            raise ValueError(f"bandwidth must be a finite number of bytes per second > 0, got {self.bandwidth!r}")

    def hop(self, num_bytes: float) -> float:
        """Time of one message of num_bytes: alpha + S / B."""
        return self.latency + num_bytes / self.bandwidth


def _check_workers(workers: int) -> int:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    return workers


def ring_allreduce(num_bytes: float, workers: int, network: Network) -> float:
    """2 (K-1) (alpha + S / (K B)): reduce-scatter then allgather around the ring."""
    k = _check_workers(workers)
    return 2 * (k - 1) * network.hop(num_bytes / k)


def tree_allreduce(num_bytes: float, workers: int, network: Network) -> float:
    """2 log2(K) (alpha + S / B): reduce up and broadcast down a binary tree."""
    return 2 * math.log2(_check_workers(workers)) * network.hop(num_bytes)


def broadcast(num_bytes: float, workers: int, network: Network) -> float:
    """log2(K) (alpha + S / B) down a binary tree."""
    return math.log2(_check_workers(workers)) * network.hop(num_bytes)


def ring_allgather(bytes_per_worker: float, workers: int, network: Network) -> float:
    """(K-1) (alpha + S / B): every worker's S bytes travel K-1 hops (004 Sec. 4.2)."""
    return (_check_workers(workers) - 1) * network.hop(bytes_per_worker)


def artopk_ring(index_bytes: float, value_bytes: float, workers: int, network: Network) -> float:
    """AR-Topk with ring reduction (003 Eq. 4a): one worker broadcasts its indices, all allreduce
    the values at those indices."""
    return broadcast(index_bytes, workers, network) + ring_allreduce(value_bytes, workers, network)


def alltoall(bytes_per_worker: float, workers: int, network: Network) -> float:
    """(K-1) (alpha + S / (K B)): each worker sends a K-th of its S bytes to each other one, one
    message after another (as Gloo's pairwise exchange does)."""
    k = _check_workers(workers)
    return (k - 1) * network.hop(bytes_per_worker / k)


def partitioned_allreduce(compressor, bucket_elements, workers: int, network: Network) -> float:
    """The hash-partitioned sparse allreduce of buckets of `bucket_elements` float32 elements: an
    alltoall of every worker's k pairs (8 bytes each, k the payload's slots), then a ring allgather
    of each owner's summed pairs (`compressor.owned_pairs`), plus its non-finite flag (one pair),
    both on the allgather `network`. Calibration fits no alltoall network; Horovod's alltoall costs
    a call at least what its allgather does (one float32 per worker on the emulated cluster,
    unshaped, K = 2, 4, 8: alltoall 1.24, 4.32, 14.36 ms; allgather 1.14, 2.90, 11.54 ms; allreduce
    1.18, 2.23, 6.92 ms; research/notebook.md, "Horovod ops on constants are folded")."""
    pairs = sum(compressor.payload_length(n) for n in bucket_elements)
    owned = compressor.owned_pairs(pairs, workers)
    return alltoall(8 * pairs, workers, network) + ring_allgather(8 * owned + 8, workers, network)


def artopk_tree(index_bytes: float, value_bytes: float, workers: int, network: Network) -> float:
    """AR-Topk with tree reduction (003 Eq. 4b)."""
    return broadcast(index_bytes, workers, network) + tree_allreduce(value_bytes, workers, network)


@dataclass(frozen=True)
class AffineCost:
    """Time c0 + c1 * elements (seconds), as 001 Assumption 5 models compression overhead."""

    c0: float
    c1: float

    def __call__(self, elements: float) -> float:
        return self.c0 + self.c1 * elements

    @classmethod
    def fit(cls, elements, seconds) -> "AffineCost":
        """Least-squares fit to measurements (at least two distinct sizes); c0 and c1 are clipped at 0."""
        xs, ys = [float(x) for x in elements], [float(y) for y in seconds]
        if len(xs) != len(ys) or len(set(xs)) < 2:
            raise ValueError(f"need matching elements and seconds with at least two distinct sizes, got {xs} and {ys}")
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        c1 = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
        c1 = max(c1, 0.0)
        return cls(max(mean_y - c1 * mean_x, 0.0), c1)


def compression_pays(dense_bytes: float, payload_bytes: float, workers: int, network: Network,
                     encode_decode_seconds: float) -> bool:
    """004 Eq. 1: T_comp(d) < T_full(d) - T_spr(d), with T_full a ring allreduce of the dense tensor
    and T_spr a ring allgather of every worker's payload."""
    saved = ring_allreduce(dense_bytes, workers, network) - ring_allgather(payload_bytes, workers, network)
    return encode_decode_seconds < saved


def overlapped_dense_iteration(compute_seconds: float, bucket_seconds, gamma: float = 1.0) -> float:
    """000 Sec. 4.1: backward pass plus synchronisation with k dense buckets overlapping the backward
    pass, max(gamma T_comp, sum of the first k-1 bucket times) + the last bucket's time. gamma >= 1 is
    the slowdown of the backward pass while communicating (000 measured 1.04 to 1.1)."""
    times = [float(t) for t in bucket_seconds]
    if not times:
        return gamma * compute_seconds
    return max(gamma * compute_seconds, sum(times[:-1])) + times[-1]


def compressed_iteration(compute_seconds: float, encode_decode_seconds: float, communication_seconds: float) -> float:
    """000 Appendix B: compression after the backward pass, T_comp + T_encode_decode + T_comm."""
    return compute_seconds + encode_decode_seconds + communication_seconds


HOROVOD_FUSION_BYTES = 128 * 2**20  # Horovod 0.28.1's defaults (HOROVOD_FUSION_THRESHOLD,
HOROVOD_CYCLE_SECONDS = 1e-3         # HOROVOD_CYCLE_TIME)


def horovod_dense_finish(elements, ready_seconds, cluster: ClusterModel, *, element_bytes: int = 4,
                         fusion_bytes: int = HOROVOD_FUSION_BYTES, cycle_seconds: float = HOROVOD_CYCLE_SECONDS) -> float:
    """When stock Horovod's dense allreduce of the gradients ends, relative to the start of the
    backward pass: 002's replay of its fusion buffer over the gradients' ready times (`elements`
    and `ready_seconds` per gradient, in any order), `network_queue_end` with one allreduce per
    gradient and nothing else on the network; no earlier than the last gradient."""
    if len(elements) != len(ready_seconds):
        raise ValueError(f"need one ready time per gradient, got {len(ready_seconds)} for {len(elements)} gradients")
    ready = [float(t) for t in ready_seconds]
    backward_end = max(ready, default=0.0)
    dense = [(t, element_bytes * int(n), 1) for t, n in zip(ready, elements)]
    return max(network_queue_end(dense, [], cluster, backward_end, fusion_bytes=fusion_bytes,
                                 cycle_seconds=cycle_seconds), backward_end)


def network_queue_end(dense, collectives, cluster: ClusterModel, backward_end: float, *,
                      fusion_bytes: int = HOROVOD_FUSION_BYTES, cycle_seconds: float = HOROVOD_CYCLE_SECONDS) -> float:
    """When the last of these Horovod operations ends (0 where there are none), run one at a time in
    the order they become ready, as Horovod's background loop runs them:

      dense: (ready seconds, bytes, tensors) per dense allreduce submitted (one per gradient, as
        Horovod's optimizer and tfcomp's dense buckets send them). The loop wakes every
        `cycle_seconds`; each time the network is free it fuses the allreduces ready by then, in
        the order they became ready, up to `fusion_bytes` (at least one), into one ring allreduce
        that also pays `cluster.per_tensor` per tensor;
      collectives: (ready seconds, seconds on the network) of other collectives (compressed
        buckets' grouped collectives), each run alone once ready and the network free.

    Until `backward_end` a dense transfer runs `cluster.overlap_slowdown` times slower."""
    k = cluster.workers
    per_tensor = cluster.per_tensor if k > 1 else 0.0
    dense = sorted(dense, key=lambda d: d[0])
    collectives = sorted(collectives, key=lambda c: c[0])
    free, i, j = 0.0, 0, 0
    while i < len(dense) or j < len(collectives):
        if i < len(dense) and (j == len(collectives) or dense[i][0] <= collectives[j][0]):
            ready = dense[i][0]
            aligned = math.ceil(ready / cycle_seconds - 1e-9) * cycle_seconds if cycle_seconds > 0 else 0.0
            start = max(free, ready, aligned)
            fused, size, tensors = 0, 0, 0
            while i + fused < len(dense) and dense[i + fused][0] <= start and (
                    fused == 0 or size + dense[i + fused][1] <= fusion_bytes):
                size += dense[i + fused][1]
                tensors += dense[i + fused][2]
                fused += 1
            free = transfer_end(start, ring_allreduce(size, k, cluster.allreduce) + tensors * per_tensor, backward_end,
                                cluster.overlap_slowdown)
            i += fused
        else:
            free = max(free, collectives[j][0]) + collectives[j][1]
            j += 1
    return free


UNMEASURED = Network(0.0, 1e15)  # a network nobody measured: transfers on it take (almost) no time


_MAX_WORKERS = 2**31 - 1
_HOUR = 3600.0
# Bounds of every figure a ClusterModel holds (beyond them a figure is a broken measurement or a
# corrupt file, not a cluster): (least, greatest, unit). Bandwidths must also be > 0.
CLUSTER_LIMITS = {
    "allreduce.latency": (0.0, _HOUR, "seconds"),
    "allreduce.bandwidth": (0.0, 1e18, "bytes per second"),
    "allgather.latency": (0.0, _HOUR, "seconds"),
    "allgather.bandwidth": (0.0, 1e18, "bytes per second"),
    "encode_decode.c0": (0.0, _HOUR, "seconds"),
    "encode_decode.c1": (0.0, 1.0, "seconds per element"),
    "per_tensor": (0.0, _HOUR, "seconds"),
    "compression_per_tensor": (0.0, _HOUR, "seconds"),
    "merge_per_element": (0.0, 1.0, "seconds per element"),
    "compression_fixed": (0.0, _HOUR, "seconds"),
    "partitioned_per_slot": (-1.0, 1.0, "seconds per payload slot"),
    "artopk_per_slot": (-1.0, 1.0, "seconds per payload slot"),
}
# Per-slot figures are signed: what a strategy's work adds to (or saves from) the allgather's.
_LIST_FIELDS = ("workers", *CLUSTER_LIMITS)
MAX_OVERLAP_SLOWDOWN = 20.0  # ClusterModel.overlap_slowdown's greatest value


def transfer_end(start: float, seconds: float, busy_until: float, slowdown: float) -> float:
    """When a transfer of `seconds` (on an idle device) that starts at `start` ends, where it runs
    `slowdown` times slower until `busy_until` (the backward pass's end) and at full speed after."""
    if start >= busy_until or slowdown == 1.0:
        return start + seconds
    done_while_busy = (busy_until - start) / slowdown
    if seconds <= done_while_busy:
        return start + seconds * slowdown
    return busy_until + seconds - done_while_busy


@dataclass(frozen=True)
class ClusterModel:
    """The figures the plan is made from: workers, the allreduce and allgather networks fitted by
    calibration, the compressor's encode+decode time per bucket of n float32 elements (encode, the
    local decode for error feedback, and the decode of all K payloads), and per-tensor costs."""

    workers: int
    allreduce: Network
    allgather: Network
    encode_decode: AffineCost
    per_tensor: float = 0.0  # seconds each tensor adds to the collectives (Horovod's negotiation, bookkeeping)
    compression_per_tensor: float = 0.0  # seconds each tensor adds to a compressed bucket's work
    merge_per_element: float = 0.0  # seconds per element to concatenate and split a multi-tensor bucket
    compression_fixed: float = 0.0  # seconds an exchange with any compressed bucket pays once, beyond its buckets
    # Seconds per payload slot (k) that a bucket's compression work takes beyond the allgather's
    # (whose work encode_decode prices: encode, and the decode of K payloads), signed: the
    # partitioned allreduce partitions its pairs and sums its owner's share (ops.sum_pairs) but
    # decodes about k pairs, AR-Topk gathers values at one owner's indices and decodes k pairs.
    partitioned_per_slot: float = 0.0
    artopk_per_slot: float = 0.0
    # How many times longer a transfer takes while the backward pass still computes on the same
    # device (the two compete for it; 000's gamma seen from the network's side). Fitted in training
    # from the exchange's timeline (`tfcomp.planning.fit_overlap_slowdown`), not by calibration, so
    # not in `to_list`; 1: a transfer during the backward pass is as fast as one after it.
    overlap_slowdown: float = 1.0

    def __post_init__(self):
        self.validate()

    def validate(self) -> "ClusterModel":
        """Raises ValueError naming the first field no cluster can have: workers not an integer >= 1,
        or a figure that is not a finite number within `CLUSTER_LIMITS` (NaN, inf, negative, 1e308).
        Returns the model. Runs on construction, so no plan is made from such figures."""
        if isinstance(self.workers, bool) or not isinstance(self.workers, int):
            raise ValueError(f"ClusterModel.workers must be an integer in [1, {_MAX_WORKERS}], got {self.workers!r}")
        _check_workers_figure(self.workers)
        for field, kind in (("allreduce", Network), ("allgather", Network), ("encode_decode", AffineCost)):
            if not isinstance(getattr(self, field), kind):
                raise ValueError(f"ClusterModel.{field} must be of type {kind.__name__}, got {getattr(self, field)!r}")
        for field in CLUSTER_LIMITS:
            owner, _, name = field.rpartition(".")
            _check_figure(field, getattr(getattr(self, owner), name) if owner else getattr(self, name))
        slowdown = self.overlap_slowdown
        if isinstance(slowdown, bool) or not isinstance(slowdown, numbers.Real) or not (
                1.0 <= slowdown <= MAX_OVERLAP_SLOWDOWN):
            raise ValueError(f"ClusterModel.overlap_slowdown must be a finite number in [1, {MAX_OVERLAP_SLOWDOWN:g}], "
                             f"got {slowdown!r}")
        return self

    def to_list(self) -> list:
        """[workers, allreduce latency, bandwidth, allgather latency, bandwidth, c0, c1, per_tensor,
        compression_per_tensor, merge_per_element, compression_fixed, partitioned_per_slot,
        artopk_per_slot] (floats)."""
        return [float(self.workers), self.allreduce.latency, self.allreduce.bandwidth, self.allgather.latency,
                self.allgather.bandwidth, self.encode_decode.c0, self.encode_decode.c1, self.per_tensor,
                self.compression_per_tensor, self.merge_per_element, self.compression_fixed,
                self.partitioned_per_slot, self.artopk_per_slot]

    @classmethod
    def unpriced(cls, workers: int) -> "ClusterModel":
        """Figures nobody measured (one worker, planning="off", stand-ins): every transfer and all
        compression cost 0, so the plan keeps to dense on ties and is not priced."""
        return cls(workers, UNMEASURED, UNMEASURED, AffineCost(0.0, 0.0))

    @classmethod
    def from_list(cls, values) -> "ClusterModel":
        """The model of `to_list`'s 13 numbers; a ValueError naming the field of one that `validate`
        rejects, or saying how many there were when not 11."""
        values = list(values)
        if len(values) != len(_LIST_FIELDS):
            raise ValueError(f"ClusterModel figures must be {len(_LIST_FIELDS)} numbers ({', '.join(_LIST_FIELDS)}), "
                             f"got {len(values)}: {values!r}")
        workers = _check_workers_figure(values[0])
        w, arl, arb, agl, agb, c0, c1, per_tensor, compression_per_tensor, merge, fixed, partitioned, artopk = (
            workers, *(_check_figure(field, v) for field, v in zip(_LIST_FIELDS[1:], values[1:])))
        return cls(w, Network(arl, arb), Network(agl, agb), AffineCost(c0, c1), per_tensor, compression_per_tensor,
                   merge, fixed, partitioned_per_slot=partitioned, artopk_per_slot=artopk)


def _check_workers_figure(value) -> int:
    """An integral number (int, or a float such as to_list's) in [1, _MAX_WORKERS], as an int."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        integral = True
    else:  # floats are compared only when finite (int(inf) raises); huge ints are never converted
        integral = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and (
            value == int(value))
    if integral and 1 <= value <= _MAX_WORKERS:
        return int(value)
    raise ValueError(f"ClusterModel.workers must be an integer in [1, {_MAX_WORKERS}], got {value!r}")


def _check_figure(field: str, value) -> float:
    """`value` as a float if it is a finite number within CLUSTER_LIMITS[field], else a ValueError naming it."""
    low, high, unit = CLUSTER_LIMITS[field]
    positive = field.endswith("bandwidth")
    if not isinstance(value, bool) and isinstance(value, numbers.Real) and (
            low < value <= high if positive else low <= value <= high):
        return float(value)
    bounds = f"({low:g}, {high:g}]" if positive else f"[{low:g}, {high:g}]"
    raise ValueError(f"ClusterModel.{field} must be a finite number of {unit} in {bounds}, got {value!r}")


@dataclass(frozen=True)
class StrategyTime:
    """Predicted seconds of one bucket: communication and compression (encode + decode)."""

    communication: float
    compression: float

    @property
    def total(self) -> float:
        return self.communication + self.compression
