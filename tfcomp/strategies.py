"""Exchange strategies: how one bucket of gradients crosses the network, and what that costs.

One class per strategy knows its wire bytes and its price under the cost model
(`tfcomp.cost_model`); its graph (encode, grouped collective, decode) is the class of the same
strategy in `tfcomp.step`, registered under this object there, so that this module, and with it
`tfcomp.planning`, `tfcomp.cost_model` and `tfcomp.whatif`, stays free of TensorFlow:

  dense        Horovod's allreduce of the float32 tensors, one per tensor (fp16 on the wire for FP16)
  allgather    the compressor's payload from every worker (004), decoded together
  allreduce    payloads that add up (RandomK's values at indices drawn from a shared seed, IntQuant's
               integer levels on an agreed scale), summed by one ring allreduce
  artopk       AR-Topk (003 Alg. 1): one owner's indices broadcast, the values at them allreduced
  partitioned  hash-partitioned sparse allreduce: pairs sent to their index's owner by one alltoall,
               summed there (at most the compressor's owner budget kept), shared by one allgather

A strategy is a `str` subclass whose value is its name: the name is what the ranks' plan digest,
`tfcomp.planning.Plan.record` and the reports carry, so plans and records read as before, while
everything a strategy does is a method of its object (tfcomp's code never compares names).
A compressor declares the strategies it can run (`Compressor.strategies`, dense first) and its own
one (`Compressor.collective`, what planning="off" and calibration's probe use).

`Strategy.communication` is the one price of a strategy's network time: of a grouped collective of
the buckets one exchange sends with it. `Strategy.time`, what the bucket search, the per-tensor plan
and the what-if price one bucket with, is it for a group of one plus the bucket's compression; the
plan's price (`tfcomp.planning.predicted_exchange_time`, the final choice) calls it for every group.
`parse` turns a user's name into a strategy; adding a strategy is one class here registered in
`STRATEGIES` (and its graph class in `tfcomp.step`).
"""

from __future__ import annotations

from typing import Sequence

from tfcomp import cost_model as cm

__all__ = ["ALLGATHER", "ALLREDUCE", "ARTOPK", "DENSE", "NAMES", "PARTITIONED", "STRATEGIES", "WIRE_TENSORS",
           "Allgather", "ArTopk", "Dense", "Partitioned", "Strategy", "SummedAllreduce", "named", "parse"]

_NON_FINITE_COUNT_BYTES = 4  # the float32 count of non-finite values that rides with every payload
WIRE_TENSORS = 3  # tensors a compressed bucket puts in its collectives (payload, indices or scale, count)


class Strategy(str):
    """One way to exchange a bucket: its name (the `str` value), whether it compresses, and its
    price. Instances are the registered singletons of `STRATEGIES` (copies and pickles come back as
    them).

    Class attributes:
      name: the strategy's name, what users force it by (`Compressor(strategy=...)`).
      compresses: whether its buckets are compressed (encoded, error feedback kept); False: dense.
      per_slot_field: the `ClusterModel` field (seconds per payload slot) that prices the work this
        strategy adds to or saves from the allgather's encode and decode, which calibration probes
        for it (`tfcomp.calibration`); None: it has no probe of its own.
      runs_in_tfcomp: whether the exchange runs it (False: priced by the what-if only).
    """

    name: str = ""
    compresses: bool = True
    per_slot_field: str | None = None
    runs_in_tfcomp: bool = True

    def __new__(cls):
        return super().__new__(cls, cls.name)

    def __reduce__(self):
        return named, (str(self),)

    def wire_bytes(self, compressor, elements: int, workers: int) -> int:
        """Bytes one worker sends for a bucket of `elements` float32 with `compressor` among
        `workers`."""
        return compressor.payload_bytes(elements)

    def communication(self, elements: Sequence[int], compressor, cluster: cm.ClusterModel) -> float:
        """Network seconds of one grouped collective of compressed buckets of `elements` float32
        each (every bucket sent with this strategy in one exchange), without the per-tensor
        bookkeeping of its wire tensors."""
        raise NotImplementedError

    def compression(self, elements: int, compressor, cluster: cm.ClusterModel, tensors: int, alone: bool) -> float:
        """Seconds of one bucket's compression work: encode + decode (`cluster.encode_decode`), each
        tensor's `cluster.compression_per_tensor`, merging more than one tensor
        (`cluster.merge_per_element` per element), `cluster.compression_fixed` for a bucket `alone`
        in its exchange, and this strategy's per-slot figure (signed; the total never below 0)."""
        seconds = cluster.encode_decode(elements) + tensors * cluster.compression_per_tensor
        if alone:
            seconds += cluster.compression_fixed
        if tensors > 1:
            seconds += cluster.merge_per_element * elements
        if self.per_slot_field is not None:
            slots = compressor.payload_length(elements)
            seconds = max(seconds + getattr(cluster, self.per_slot_field) * slots, 0.0)
        return seconds

    def bookkeeping(self, buckets: int, tensors: int, cluster: cm.ClusterModel) -> float:
        """Seconds that the tensors a group of `buckets` buckets (of `tensors` gradients in all)
        puts in collectives add, `cluster.per_tensor` each (none for one worker): `WIRE_TENSORS`
        per compressed bucket, whatever its gradients."""
        return WIRE_TENSORS * buckets * cluster.per_tensor if cluster.workers > 1 else 0.0

    def time(self, elements: int, compressor, cluster: cm.ClusterModel, *, tensors: int = 1,
             alone: bool = True) -> cm.StrategyTime:
        """Seconds to exchange one bucket of `tensors` tensors, `elements` float32 values: its
        `communication` as a group of one plus its wire tensors' bookkeeping, and its `compression`
        (`alone`: the bucket pays what an exchange pays once for compressing at all; the plan's
        search prices buckets with alone=False)."""
        return cm.StrategyTime(self.communication([elements], compressor, cluster)
                               + self.bookkeeping(1, tensors, cluster),
                               self.compression(elements, compressor, cluster, tensors, alone))

    def variants(self) -> tuple:
        """(label, strategy) of each way the what-if prices this strategy: itself."""
        return ((self.name, self),)


class Dense(Strategy):
    """Horovod's ring allreduce of the float32 tensors (2 bytes per element for FP16), one
    allreduce per tensor as Horovod's optimizer sends them; each adds `cluster.per_tensor`. A plan
    prices its dense tensors through Horovod's fusion (`tfcomp.cost_model.network_queue_end`), not
    as groups."""

    name = "dense"
    compresses = False

    def wire_bytes(self, compressor, elements: int, workers: int) -> int:
        return compressor.dense_element_bytes * elements

    def communication(self, elements: Sequence[int], compressor, cluster: cm.ClusterModel) -> float:
        """The ring allreduce of all of `elements` at once (one fused allreduce)."""
        k = cluster.workers
        return cm.ring_allreduce(self.wire_bytes(compressor, sum(elements), k), k, cluster.allreduce)

    def compression(self, elements: int, compressor, cluster: cm.ClusterModel, tensors: int, alone: bool) -> float:
        return 0.0

    def bookkeeping(self, buckets: int, tensors: int, cluster: cm.ClusterModel) -> float:
        """`cluster.per_tensor` per tensor: each goes in its own allreduce."""
        return tensors * cluster.per_tensor if cluster.workers > 1 else 0.0

    def variants(self) -> tuple:
        return (("dense_ring_allreduce", self),)


class Allgather(Strategy):
    """A ring allgather of every worker's payload and its non-finite count (004 Sec. 4.2)."""

    name = "allgather"

    def communication(self, elements, compressor, cluster):
        payload = sum(compressor.payload_bytes(n) + _NON_FINITE_COUNT_BYTES for n in elements)
        return cm.ring_allgather(payload, cluster.workers, cluster.allgather)


class SummedAllreduce(Strategy):
    """A ring allreduce of payloads that add up (RandomK, IntQuant) and their non-finite counts;
    for a compressor that `agrees_scale` (IntQuant), one allgather of one float32 per bucket of the
    group before it: the workers' scales, of which every rank takes the largest."""

    name = "allreduce"

    def communication(self, elements, compressor, cluster):
        k = cluster.workers
        seconds = cm.ring_allreduce(sum(compressor.payload_bytes(n) + _NON_FINITE_COUNT_BYTES for n in elements), k,
                                    cluster.allreduce)
        if compressor.agrees_scale:
            seconds += cm.ring_allgather(4 * len(elements), k, cluster.allgather)
        return seconds


class ArTopk(Strategy):
    """AR-Topk (003 Eq. 4a, 4b): per bucket, a broadcast of the owner's k int32 indices (on the
    allgather network), then one ring (or, with `tree`, tree) allreduce of the k float32 values of
    every bucket and their non-finite counts; where the owner is the max-variance worker (VAR), an
    allgather of one float32 per bucket (the exchange runs the ring; the what-if prices the tree
    too)."""

    name = "artopk"
    per_slot_field = "artopk_per_slot"

    def __init__(self, tree: bool = False):
        self.tree = tree
        self.runs_in_tfcomp = not tree

    def __new__(cls, tree: bool = False):
        return super().__new__(cls)

    def __reduce__(self):
        return (ArTopk, (True,)) if self.tree else super().__reduce__()

    def wire_bytes(self, compressor, elements, workers):
        """The values (the owner sends its indices too)."""
        return 4 * compressor.payload_length(elements)

    def communication(self, elements, compressor, cluster):
        k = cluster.workers
        selected = [4 * compressor.payload_length(n) for n in elements]
        seconds = sum(cm.broadcast(s, k, cluster.allgather) for s in selected)
        reduce = cm.tree_allreduce if self.tree else cm.ring_allreduce
        seconds += reduce(sum(s + _NON_FINITE_COUNT_BYTES for s in selected), k, cluster.allreduce)
        if compressor.artopk_owner == "var":
            seconds += cm.ring_allgather(4 * len(selected), k, cluster.allgather)
        return seconds

    def variants(self) -> tuple:
        return (("artopk_ring", self), ("artopk_tree", ArTopk(tree=True)))


class Partitioned(Strategy):
    """The hash-partitioned sparse allreduce (`tfcomp.cost_model.partitioned_allreduce`), on the
    allgather network."""

    name = "partitioned"
    per_slot_field = "partitioned_per_slot"

    def wire_bytes(self, compressor, elements, workers):
        """At most its k pairs to their owners and, as an owner, its budget of sums."""
        pairs = compressor.payload_length(elements)
        return 8 * pairs + 8 * compressor.owned_pairs(pairs, workers)

    def communication(self, elements, compressor, cluster):
        return cm.partitioned_allreduce(compressor, list(elements), cluster.workers, cluster.allgather)


DENSE, ALLGATHER, ALLREDUCE, ARTOPK, PARTITIONED = Dense(), Allgather(), SummedAllreduce(), ArTopk(), Partitioned()
STRATEGIES = {s.name: s for s in (DENSE, ALLGATHER, ALLREDUCE, ARTOPK, PARTITIONED)}  # the registry, by name
NAMES = tuple(STRATEGIES)


def named(name: str) -> Strategy:
    """The registered strategy of `name` (a name the code itself recorded, e.g. in a plan record)."""
    return STRATEGIES[name]


def parse(value, argument: str, allowed: Sequence[Strategy] | None = None, owner: str | None = None,
          or_none: bool = False) -> Strategy:
    """The strategy a user names by `value` (a name, or a strategy), among `allowed` (default: all).

    Raises:
      ValueError: naming `argument` (and `owner`, what the strategies are allowed for; `or_none`:
        None is allowed too) and listing the valid names, where `value` is not one of them.
    """
    allowed = tuple(STRATEGIES.values()) if allowed is None else tuple(allowed)
    if isinstance(value, str) and value in allowed:
        return STRATEGIES[str(value)]
    names = tuple(str(s) for s in allowed)
    raise ValueError(f"{argument} must be {'None or ' if or_none else ''}one of {names}"
                     f"{f' for {owner}' if owner else ''}, got {value!r}")
