"""The exchange plan: gradients split into buckets, each with the strategy the cost model picks.

`make_plan(tensors, compressor, cluster)` takes the gradients in backprop order (the reverse of the
variables' order) as (position, name, elements) and partitions them into contiguous buckets, as
MergeComp (001) does: for every number of groups y it finds the best partition into y buckets by
dynamic programming on the cost model (Eq. 7: each bucket costs its compression h(x) plus its
communication g(x), both affine in its size; a bucket may start only when its last gradient is
ready and the previous bucket is done, which is the overlap term), giving each bucket the strategy
(`tfcomp.cost_model.STRATEGIES`) with the smallest predicted time, dense on ties. Algorithm 2 then
walks y = 1, 2, ... and stops when one more group no longer helps by `min_gain` (1 %), up to
`max_groups` (8). What compressing costs once per exchange whatever the buckets
(`ClusterModel.compression_fixed`) is added to the result, and a plan that then is not faster than
all dense becomes all dense. No training step is probed: it is arithmetic on calibrated figures.

`per_tensor_plan` is the plan with planning="off": one bucket per tensor. `predicted_exchange_time`
prices a plan as the exchange runs it (one fused collective per strategy: latency paid once).
`tfcomp.planner` compares plans across ranks; `PlanMismatchError` is what it raises on every rank.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from tfcomp import cost_model as cm

__all__ = ["Bucket", "Plan", "PlanMismatchError", "all_dense_time", "digest", "make_plan", "per_tensor_plan",
           "predicted_exchange_time"]

_MAX_UNITS = 128  # longer tensor lists are cut into this many runs of neighbours before the search


def digest(value) -> int:
    """A 63-bit hash of a JSON-serialisable value (equal on every rank for equal values)."""
    text = json.dumps(value, sort_keys=True, default=repr)
    return int(hashlib.sha256(text.encode()).hexdigest()[:15], 16)


@dataclasses.dataclass(frozen=True)
class Bucket:
    """Gradients exchanged together: their positions in the exchange's list (backprop order), total
    float32 elements, strategy, and the predicted seconds with it and sent dense."""

    positions: tuple
    elements: int
    strategy: str
    predicted: cm.StrategyTime
    dense_seconds: float


@dataclasses.dataclass(frozen=True)
class Plan:
    """Buckets in the order they are formed, the tensor names by position, what it was made from."""

    buckets: tuple
    names: dict
    compressor: object
    cluster: cm.ClusterModel

    def digest(self) -> int:
        """A 63-bit hash of everything that decides what the exchange runs (equal on all ranks)."""
        return digest([[list(b.positions), b.strategy] for b in self.buckets] + [repr(self.compressor)])

    @property
    def compressed(self) -> tuple:
        return tuple(b for b in self.buckets if b.strategy != "dense")

    def all_dense(self) -> "Plan":
        """The same buckets, every one sent dense (what a plan trial times against the plan)."""
        return dataclasses.replace(self, buckets=tuple(dataclasses.replace(b, strategy="dense") for b in self.buckets))

    def table(self) -> str:
        """Readable: bucket, tensors, elements, strategy, predicted time with it and dense."""
        lines = [f"tfcomp plan for {self.compressor} on {self.cluster.workers} workers "
                 f"(allreduce {_rate(self.cluster.allreduce)}, allgather {_rate(self.cluster.allgather)}, "
                 f"compressing at all {1e3 * self.cluster.compression_fixed:.3f} ms a step)",
                 f"{'bucket':>6s} {'tensors':>7s} {'elements':>11s} {'strategy':>10s} {'predicted ms':>12s} "
                 f"{'dense ms':>9s}  first tensor"]
        for i, b in enumerate(self.buckets):
            lines.append(f"{i:6d} {len(b.positions):7d} {b.elements:11d} {b.strategy:>10s} "
                         f"{1e3 * b.predicted.total:12.3f} {1e3 * b.dense_seconds:9.3f}  {self.names[b.positions[0]]}")
        lines.append(f"exchange per step: {1e3 * predicted_exchange_time(self):.3f} ms with this plan, "
                     f"{1e3 * all_dense_time(self):.3f} ms all dense")
        return "\n".join(lines)


def _rate(network: cm.Network) -> str:
    if network == cm.UNMEASURED:
        return "not measured"
    return f"{network.latency * 1e6:.0f} us + {network.bandwidth * 8 / 1e9:.2f} Gbit/s"


def _units(sizes: list) -> list:
    """Runs of neighbouring tensors [(start, end)], at most _MAX_UNITS, of similar total size."""
    if len(sizes) <= _MAX_UNITS:
        return [(i, i + 1) for i in range(len(sizes))]
    target = sum(sizes) / _MAX_UNITS
    units, start, total = [], 0, 0
    for i, n in enumerate(sizes):
        total += n
        remaining_tensors, remaining_units = len(sizes) - i - 1, _MAX_UNITS - len(units) - 1
        if total >= target or remaining_tensors <= remaining_units:
            units.append((start, i + 1))
            start, total = i + 1, 0
    if start < len(sizes):
        units.append((start, len(sizes)))
    return units


def _cheapest(elements: int, tensors: int, strategies, compressor, cluster) -> tuple:
    """(strategy, StrategyTime) with the smallest total; the earliest listed (dense) on ties."""
    best = None
    for strategy in strategies:
        t = cm.strategy_time(strategy, elements, compressor, cluster, tensors=tensors, alone=False)
        if best is None or t.total < best[1].total:
            best = (strategy, t)
    return best


def _check_cluster(cluster) -> None:
    """Plans are made only from a ClusterModel whose figures pass `ClusterModel.validate`."""
    if not isinstance(cluster, cm.ClusterModel):
        raise TypeError(f"cluster must be a tfcomp.cost_model.ClusterModel, got {type(cluster).__name__}")
    cluster.validate()


def make_plan(tensors, compressor, cluster: cm.ClusterModel, *, ready_seconds=None, max_groups: int = 8,
              min_gain: float = 0.01) -> Plan:
    """Buckets and strategies for `tensors` = [(position, name, elements)] in backprop order.

    ready_seconds: for each tensor, when its gradient is ready relative to the start of the exchange
    (default: all at 0, which is how Keras and Horovod call the exchange: after the backward pass).
    """
    _check_cluster(cluster)
    tensors = list(tensors)
    if not tensors:
        return Plan((), {}, compressor, cluster)
    strategies = (compressor.strategy,) if compressor.strategy else cm.available_strategies(compressor)
    ready = list(ready_seconds) if ready_seconds is not None else [0.0] * len(tensors)
    units = _units([n for _, _, n in tensors])
    prefix = [0]
    for start, end in units:
        prefix.append(prefix[-1] + sum(n for _, _, n in tensors[start:end]))
    unit_ready = [max(ready[start:end]) for start, end in units]
    count = len(units)
    cost = {}
    for i in range(count):
        for j in range(i + 1, count + 1):
            tensors_in = units[j - 1][1] - units[i][0]
            cost[i, j] = _cheapest(prefix[j] - prefix[i], tensors_in, strategies, compressor, cluster)
    groups = min(max_groups, count)
    inf = float("inf")
    finish = [[inf] * (count + 1) for _ in range(groups + 1)]
    choice = [[None] * (count + 1) for _ in range(groups + 1)]
    finish[0][0] = 0.0
    for y in range(1, groups + 1):
        for j in range(1, count + 1):
            for i in range(y - 1, j):
                if finish[y - 1][i] == inf:
                    continue
                t = max(unit_ready[j - 1], finish[y - 1][i]) + cost[i, j][1].total
                if t < finish[y][j]:
                    finish[y][j], choice[y][j] = t, i
    # MergeComp Algorithm 2: more groups while they help by at least min_gain.
    best_y = 1
    for y in range(2, groups + 1):
        previous = finish[y - 1][count]
        if finish[y][count] >= previous:
            break
        best_y = y
        if previous - finish[y][count] < min_gain * previous:
            break
    cuts, j, y = [], count, best_y
    while j > 0:
        i = choice[y][j]
        cuts.append((i, j))
        j, y = i, y - 1
    buckets = []
    for i, j in reversed(cuts):
        members = [t for start, end in units[i:j] for t in tensors[start:end]]
        strategy, predicted = cost[i, j]
        dense = cm.strategy_time("dense", prefix[j] - prefix[i], compressor, cluster, tensors=len(members)).total
        buckets.append(Bucket(tuple(p for p, _, _ in members), prefix[j] - prefix[i], strategy, predicted, dense))
    names = {p: name for p, name, _ in tensors}
    plan = Plan(tuple(_merge_neighbours(buckets, compressor, cluster)), names, compressor, cluster)
    if plan.compressed and "dense" in strategies and predicted_exchange_time(plan) >= all_dense_time(plan):
        # What compressed buckets cost once per exchange (cluster.compression_fixed) outweighs what they save.
        return Plan(tuple(_merge_neighbours([_dense_bucket(b, compressor, cluster) for b in plan.buckets],
                                            compressor, cluster)), names, compressor, cluster)
    return plan


def _dense_bucket(bucket, compressor, cluster):
    time = cm.strategy_time("dense", bucket.elements, compressor, cluster, tensors=len(bucket.positions))
    return Bucket(bucket.positions, bucket.elements, "dense", time, time.total)


def _merge_neighbours(buckets, compressor, cluster):
    """Neighbouring dense buckets are one allreduce anyway: shown and run as one bucket."""
    merged = []
    for b in buckets:
        if merged and merged[-1].strategy == "dense" == b.strategy:
            last = merged.pop()
            elements = last.elements + b.elements
            time = cm.strategy_time("dense", elements, compressor, cluster, tensors=len(last.positions) + len(b.positions))
            b = Bucket(last.positions + b.positions, elements, "dense", time, time.total)
        merged.append(b)
    return merged


def per_tensor_plan(tensors, compressor, cluster: cm.ClusterModel) -> Plan:
    """planning="off": one bucket per tensor; tensors of at least compressor.min_elements use the
    forced strategy or the compressor's own collective, smaller ones go dense."""
    _check_cluster(cluster)
    own = compressor.strategy or ("dense" if compressor.collective == "dense" else compressor.collective)
    buckets = []
    for position, _, elements in tensors:
        strategy = own if elements >= compressor.min_elements else "dense"
        dense = cm.strategy_time("dense", elements, compressor, cluster)
        predicted = cm.strategy_time(strategy, elements, compressor, cluster, alone=False)
        buckets.append(Bucket((position,), elements, strategy, predicted, dense.total))
    return Plan(tuple(buckets), {p: name for p, name, _ in tensors}, compressor, cluster)


def predicted_exchange_time(plan: Plan) -> float:
    """Seconds per step as the exchange runs the plan: one grouped collective per strategy (its
    latency paid once), every compressed bucket's encode and decode, the fixed cost of compressing
    at all (once), one broadcast per AR-Topk bucket, and the per-tensor bookkeeping of every tensor
    put in a collective."""
    cluster, k = plan.cluster, plan.cluster.workers
    by_strategy = {}
    for b in plan.buckets:
        by_strategy.setdefault(b.strategy, []).append(b)
    compressor = plan.compressor
    dense_tensors = sum(len(b.positions) for b in by_strategy.get("dense", []))
    wire_tensors = cm.WIRE_TENSORS * sum(1 for b in plan.buckets if b.strategy != "dense")
    seconds = (dense_tensors + wire_tensors) * cluster.per_tensor if k > 1 else 0.0
    if plan.compressed:
        seconds += cluster.compression_fixed
    for strategy, buckets in by_strategy.items():
        elements = [b.elements for b in buckets]
        seconds += sum(b.predicted.compression for b in buckets)
        if strategy == "dense":
            seconds += cm.ring_allreduce(compressor.dense_element_bytes * sum(elements), k, cluster.allreduce)
        elif strategy == "allgather":
            seconds += cm.ring_allgather(sum(compressor.payload_bytes(n) + 4 for n in elements), k, cluster.allgather)
        elif strategy == "allreduce":
            seconds += cm.ring_allreduce(sum(compressor.payload_bytes(n) + 4 for n in elements), k, cluster.allreduce)
        elif strategy == "partitioned":
            seconds += cm.partitioned_allreduce(compressor, elements, k, cluster.allreduce, cluster.allgather)
        else:
            selected = [4 * compressor.payload_length(n) for n in elements]
            seconds += sum(cm.broadcast(s, k, cluster.allgather) for s in selected)
            seconds += cm.ring_allreduce(sum(s + 4 for s in selected), k, cluster.allreduce)
            if getattr(compressor, "artopk_owner", "star") == "var":
                seconds += cm.ring_allgather(4 * len(selected), k, cluster.allgather)
    return seconds


def all_dense_time(plan: Plan) -> float:
    """Seconds per step with every bucket of the plan in one dense allreduce."""
    total = sum(b.elements for b in plan.buckets)
    tensors = sum(len(b.positions) for b in plan.buckets)
    return cm.strategy_time("dense", total, plan.compressor, plan.cluster, tensors=tensors).total


class PlanMismatchError(RuntimeError):
    """The ranks made different plans (they would run different collectives and hang)."""
