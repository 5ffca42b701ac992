"""The exchange plan: gradients split into buckets, each with the strategy the cost model picks.

`make_plan(tensors, compressor, cluster)` takes the gradients in backprop order (the reverse of the
variables' order) as (position, name, elements) and partitions them into contiguous buckets, as
MergeComp (001) does: for every number of groups y it finds the best partition into y buckets by
dynamic programming on the cost model (Eq. 7: each bucket costs its compression h(x) plus its
communication g(x), both affine in its size; a bucket may start only when its last gradient is
ready and the previous bucket is done, which is the overlap term), giving each bucket the strategy
(`tfcomp.strategies`) with the smallest predicted time, dense on ties. Algorithm 2 then
walks y = 1, 2, ... and stops when one more group no longer helps by `min_gain` (1 %), up to
`max_groups` (8). What compressing costs once per exchange whatever the buckets
(`ClusterModel.compression_fixed`) is added to the result, and a plan that then does not shorten
the training step by more than `COMPRESSION_MARGIN` (5 %) of it (`exceeds_margin`: a smaller
predicted gain is within the noise of a step measured on this machine; the step is the caller's,
else the all-dense exchange, a lower bound of it: see `make_plan`) becomes all dense. No
training step is probed: it is arithmetic on calibrated figures. The search prices a bucket only
when the dynamic programme first needs it, so where one bucket is best (Algorithm 2 stops at y = 2)
it prices about 2n of the n (n + 1) / 2 buckets of n tensors.

With the gradients' ready times (measured in training: `tfcomp.timeline`) a bucket may start before
the backward pass ends, and plans are priced by when their exchange ends; how much slower a transfer
runs while the backward pass computes beside it is fitted to a measured exchange by
`fit_overlap_slowdown`.

`per_tensor_plan` is the plan with planning="off": one bucket per tensor; `dense_plan` the plan
of an exchange whose calibration runs between its first training steps: everything dense.
`predicted_exchange_time` prices a plan as the exchange runs it (one grouped collective per compressed
strategy, priced by the strategy's `communication`, the function its buckets were priced with in the
search; one allreduce per dense tensor from when it is ready, fused by Horovod's loop: the replay
that prices plain Horovod); the search uses it too.
`tfcomp.planner` compares plans across ranks; `PlanMismatchError` is what it raises on every rank.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import hashlib
import json
import math
import numbers

from tfcomp import cost_model as cm
from tfcomp import strategies as st

__all__ = ["CLEAR_GAIN", "COMPRESSION_MARGIN", "Bucket", "Plan", "PlanMismatchError", "all_dense_time", "check_margin",
           "check_min_gain", "compression_could_pay", "dense_plan", "digest", "exceeds_margin", "fit_overlap_slowdown",
           "make_plan", "network_explaining", "pays_to_replace", "per_tensor_plan", "predicted_exchange_time",
           "predicted_gain"]

_MAX_UNITS = 128  # longer tensor lists are cut into this many runs of neighbours before the search


COMPRESSION_MARGIN = 0.05  # a plan compresses only where it is predicted (the planner, the what-if) or measured (the
# trial) to shorten the training step by more than this fraction of it; a smaller gain is within this machine's noise


def digest(value) -> int:
    """A 63-bit hash of a JSON-serialisable value (equal on every rank for equal values)."""
    text = json.dumps(value, sort_keys=True, default=repr)
    return int(hashlib.sha256(text.encode()).hexdigest()[:15], 16)


@dataclasses.dataclass(frozen=True)
class Bucket:
    """Gradients exchanged together: their positions in the exchange's list (backprop order), total
    float32 elements, strategy (a `tfcomp.strategies.Strategy`; given by its name, the registered
    strategy of that name), and the predicted seconds with it and sent dense."""

    positions: tuple
    elements: int
    strategy: st.Strategy
    predicted: cm.StrategyTime
    dense_seconds: float

    def __post_init__(self):
        if not isinstance(self.strategy, st.Strategy):
            object.__setattr__(self, "strategy", st.parse(self.strategy, "Bucket.strategy"))


@dataclasses.dataclass(frozen=True)
class Plan:
    """Buckets in the order they are formed, the tensor names by position, what it was made from,
    when each gradient is ready (seconds from the exchange's first gradient; {}: all at once, after
    the backward pass), for a plan that compresses, the buckets of the best plan that does not
    (what it was found faster than; a trial's dense arm and a dropped plan run them), and each
    tensor's float32 elements by position (`sizes`: every tensor of the buckets, adding up to each
    bucket's elements; a dense tensor is priced by its own allreduce). ValueError otherwise."""

    buckets: tuple
    names: dict
    compressor: object
    cluster: cm.ClusterModel
    ready: dict = dataclasses.field(default_factory=dict)  # {position: seconds}; absent: 0
    dense_buckets: tuple = ()  # the best all-dense buckets for `ready` (); (): these buckets, dense
    sizes: dict = dataclasses.field(default_factory=dict)  # {position: float32 elements}

    def __post_init__(self):
        for i, b in enumerate(self.buckets):
            missing = [p for p in b.positions if p not in self.sizes]
            if missing:
                raise ValueError(f"Plan: sizes must give the elements of every tensor of the buckets; bucket {i} "
                                 f"has positions {missing[:8]} without")
            if sum(self.sizes[p] for p in b.positions) != b.elements:
                raise ValueError(f"Plan: bucket {i} has {b.elements} elements, but sizes give its tensors "
                                 f"{sum(self.sizes[p] for p in b.positions)}")

    def digest(self) -> int:
        """A 63-bit hash of everything that decides what the exchange runs (equal on all ranks)."""
        return digest([[list(b.positions), b.strategy] for b in self.buckets] + [repr(self.compressor)]
                      + [[list(b.positions) for b in self.dense_buckets]])

    @property
    def compressed(self) -> tuple:
        return tuple(b for b in self.buckets if b.strategy.compresses)

    def all_dense(self) -> "Plan":
        """The plan that sends everything dense (what a plan trial times against the plan): the
        best all-dense buckets where the search found them, else these buckets, sent dense."""
        if self.dense_buckets:
            return dataclasses.replace(self, buckets=self.dense_buckets, dense_buckets=())
        return dataclasses.replace(self, buckets=tuple(dataclasses.replace(b, strategy=st.DENSE) for b in self.buckets))

    def record(self) -> dict:
        """The plan as JSON-ready lists, the compressor as its class name and `get_config()` (a tfcomp
        compressor's constructor arguments), from which `from_record` rebuilds it to be priced
        again: benchmarks keep what they predicted from."""
        def buckets(bs):
            return [[list(b.positions), b.elements, b.strategy, b.predicted.communication, b.predicted.compression,
                     b.dense_seconds] for b in bs]
        return {"buckets": buckets(self.buckets), "dense_buckets": buckets(self.dense_buckets),
                "names": sorted(self.names.items()), "sizes": sorted(self.sizes.items()),
                "ready": sorted(self.ready.items()), "cluster": self.cluster.to_list(),
                "overlap_slowdown": self.cluster.overlap_slowdown,
                "compressor": [type(self.compressor).__name__, self.compressor.get_config()]}

    @classmethod
    def from_record(cls, record: dict, compressor) -> "Plan":
        """The plan of `record` (`Plan.record`'s dict) with `compressor` (the one it names: tfcomp's
        compressor of that class, made with those arguments)."""
        def buckets(rows):
            return tuple(Bucket(tuple(positions), elements, strategy, cm.StrategyTime(communication, compression),
                                dense_seconds)
                         for positions, elements, strategy, communication, compression, dense_seconds in rows)
        cluster = dataclasses.replace(cm.ClusterModel.from_list(record["cluster"]),
                                      overlap_slowdown=record["overlap_slowdown"])
        return cls(buckets(record["buckets"]), {int(p): n for p, n in record["names"]}, compressor, cluster,
                   ready={int(p): t for p, t in record["ready"]}, dense_buckets=buckets(record["dense_buckets"]),
                   sizes={int(p): n for p, n in record["sizes"]})

    def table(self) -> str:
        """Readable: bucket, tensors, elements, strategy, predicted time with it and dense."""
        lines = [f"tfcomp plan for {self.compressor} on {self.cluster.workers} workers "
                 f"(allreduce {_rate(self.cluster.allreduce)}, allgather {_rate(self.cluster.allgather)}, "
                 f"compressing at all {1e3 * self.cluster.compression_fixed:.3f} ms a step"
                 + (f", transfers {self.cluster.overlap_slowdown:.2f}x slower during the backward pass"
                    if self.cluster.overlap_slowdown != 1.0 else "") + ")",
                 f"{'bucket':>6s} {'tensors':>7s} {'elements':>11s} {'strategy':>10s} {'predicted ms':>12s} "
                 f"{'dense ms':>9s}  first tensor"]
        for i, b in enumerate(self.buckets):
            lines.append(f"{i:6d} {len(b.positions):7d} {b.elements:11d} {b.strategy:>10s} "
                         f"{1e3 * b.predicted.total:12.3f} {1e3 * b.dense_seconds:9.3f}  {self.names[b.positions[0]]}")
        if any(self.ready.values()):
            lines.append(f"gradients ready over {1e3 * max(self.ready.values()):.3f} ms of the backward pass; the "
                         f"exchange ends {1e3 * predicted_exchange_time(self):.3f} ms after the first with this plan, "
                         f"{1e3 * all_dense_time(self):.3f} ms all dense")
        else:
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
        t = strategy.time(elements, compressor, cluster, tensors=tensors, alone=False)
        if best is None or t.total < best[1].total:
            best = (strategy, t)
    return best


def _check_cluster(cluster) -> None:
    """Plans are made only from a ClusterModel whose figures pass `ClusterModel.validate`."""
    if not isinstance(cluster, cm.ClusterModel):
        raise TypeError(f"cluster must be a tfcomp.cost_model.ClusterModel, got {type(cluster).__name__}")
    cluster.validate()


def _checked_ready(ready_seconds, count: int) -> list:
    """`ready_seconds` as a list of `count` floats (all 0 where None); ValueError naming what is wrong."""
    if ready_seconds is None:
        return [0.0] * count
    ready = [float(t) for t in ready_seconds]
    if len(ready) != count:
        raise ValueError(f"ready_seconds must give one time per tensor: got {len(ready)} for {count} tensors")
    bad = [t for t in ready if not 0.0 <= t < float("inf")]
    if bad:
        raise ValueError(f"ready_seconds must be finite seconds >= 0, got {bad[0]!r}")
    return ready


def make_plan(tensors, compressor, cluster: cm.ClusterModel, *, ready_seconds=None, max_groups: int = 8,
              min_gain: float = 0.01, margin: float = COMPRESSION_MARGIN, step_seconds: float | None = None) -> Plan:
    """Buckets and strategies for `tensors` = [(position, name, elements)] in backprop order.

    ready_seconds: for each tensor, when its gradient is ready, in seconds from the exchange's first
    gradient (default: all at 0, an exchange after the backward pass). With them a bucket may start
    before the backward pass ends, so the search weighs the overlap a dense bucket gets against what
    compressing saves. Every candidate (each number of groups, and the best all-dense plan the plan
    is compared with) is priced by `predicted_exchange_time`, the function that prices the final
    plan, which prices dense tensors one by one as Horovod sends them; neighbouring dense buckets are
    merged (they price alike either way).

    Tensors of fewer than `compressor.min_elements` elements are always sent dense (DRAGONN 004
    Sec. 4.2: small tensors are not what limits scaling, and sparsifying them starves biases and
    normalisation gains of updates); the search buckets the others, and the small ones go in dense
    buckets of their own, merged with dense neighbours.

    margin, step_seconds: the best compressing plan is kept only where it `exceeds_margin`: where it
    is predicted to end the exchange sooner than the best all-dense plan by more than `margin` (a
    fraction in [0, 1); default `COMPRESSION_MARGIN`) of the training step, `step_seconds` where
    the caller knows it (measured, or predicted with the forward and backward passes, as the
    what-if does); else the all-dense plan. Without `step_seconds` the step is taken to be the
    all-dense exchange's end from the first gradient (with ready times it spans the backward pass
    from there; without them it is the exchange alone): no forward pass, nothing of the backward
    pass before the first gradient, so a lower bound of the real step. The margin in seconds is
    then smaller than `margin` of the real step, and the rule more lenient than the margin says:
    a plan may compress for a gain under 5 % of the real step (with no ready times, for any gain
    over 5 % of the exchange). A compressor forced to one strategy (`compressor.strategy`) has no
    all-dense plan to compare with: its plan compresses whatever the margin.

    Raises:
      ValueError: naming `margin` where it is not a fraction in [0, 1), `step_seconds` where it is
        not None nor finite seconds > 0, `ready_seconds` where it is not one finite time >= 0 per
        tensor.
    """
    check_margin(margin, step_seconds)
    _check_cluster(cluster)
    tensors = list(tensors)
    if not tensors:
        return Plan((), {}, compressor, cluster)
    ready = _checked_ready(ready_seconds, len(tensors))
    names = {p: name for p, name, _ in tensors}
    ready_by_position = {p: t for (p, _, _), t in zip(tensors, ready)} if any(ready) else {}
    sizes = {p: n for p, _, n in tensors}
    strategies = (compressor.strategy,) if compressor.strategy else compressor.strategies

    def search(kept, allowed) -> Plan:
        members = [(t, r) for t, r in zip(tensors, ready) if kept(t)]
        if allowed == (st.DENSE,):
            # Every partition into dense buckets merges into one bucket priced alike (`_merge_neighbours`),
            # so Algorithm 2 keeps its first candidate, one bucket: no partition to search.
            bucket = Bucket(tuple(p for (p, _, _), _ in members), sum(n for (_, _, n), _ in members), st.DENSE, None,
                            0.0)
            return Plan((_dense_bucket(bucket, compressor, cluster),), names, compressor, cluster, ready_by_position,
                        sizes=sizes)
        context = ([t for t, _ in members], names, ready_by_position, sizes)
        return _search(context, [r for _, r in members], allowed, compressor, cluster, max_groups, min_gain)

    def compressible(tensor) -> bool:
        return tensor[2] >= compressor.min_elements

    def everything(tensor) -> bool:
        return True

    if not any(s.compresses for s in strategies) or not any(map(compressible, tensors)):
        return search(everything, (st.DENSE,))
    plan = search(compressible, strategies)
    if not all(map(compressible, tensors)):
        # Tensors under min_elements go dense, in buckets of their own, merged with dense neighbours.
        order = {p: i for i, (p, _, _) in enumerate(tensors)}
        kept_dense = search(lambda t: not compressible(t), (st.DENSE,)).buckets
        buckets = sorted(plan.buckets + kept_dense, key=lambda b: min(order[p] for p in b.positions))
        plan = _merge_neighbours(dataclasses.replace(plan, buckets=tuple(buckets)))
    if not plan.compressed:
        return search(everything, (st.DENSE,))
    if st.DENSE in strategies:
        dense = search(everything, (st.DENSE,))
        plan = dataclasses.replace(plan, dense_buckets=dense.buckets)
        # What compressed buckets cost once per exchange (cluster.compression_fixed) may outweigh what they
        # save; a gain within the margin is within the step's noise.
        gain = predicted_gain(plan)
        step = all_dense_time(plan) if step_seconds is None else step_seconds
        return plan if gain > 0.0 and exceeds_margin(gain, step, margin) else dense
    return plan


def check_margin(margin, step_seconds=None) -> None:
    """ValueError naming `margin` unless it is a fraction in [0, 1), or `step_seconds` unless it is
    None or finite seconds > 0 (what `make_plan` and `exceeds_margin` take)."""
    if isinstance(margin, bool) or not isinstance(margin, numbers.Real) or not 0.0 <= margin < 1.0:
        raise ValueError(f"margin must be a fraction in [0, 1), got {margin!r}")
    if step_seconds is not None and (isinstance(step_seconds, bool) or not isinstance(step_seconds, numbers.Real)
                                     or not 0.0 < step_seconds < float("inf")):
        raise ValueError(f"step_seconds must be None or finite seconds > 0, got {step_seconds!r}")


def predicted_gain(plan: Plan) -> float:
    """Seconds by which `plan` is predicted to end the exchange sooner than its all-dense plan
    (`all_dense_time(plan) - predicted_exchange_time(plan)`; 0 for an all-dense plan, negative
    where compressing is slower): what it shortens the training step by."""
    return all_dense_time(plan) - predicted_exchange_time(plan)


def exceeds_margin(gain_seconds: float, step_seconds: float, margin: float = COMPRESSION_MARGIN) -> bool:
    """The rule a compressing plan must pass to be kept (`make_plan`, the what-if): whether it
    shortens the training step by more than `margin` (a fraction in [0, 1)) of it, `gain_seconds`
    (predicted or measured) against the step of `step_seconds` (> 0). ValueError naming `margin` or
    `step_seconds` where bad."""
    check_margin(margin, step_seconds)
    return gain_seconds > margin * step_seconds


def _search(context, ready, strategies, compressor, cluster, max_groups: int, min_gain: float) -> Plan:
    """The best plan with `strategies`: Algorithm 2 walks y = 1, 2, ... over `_best_partitions`,
    each priced by `predicted_exchange_time` with its dense neighbours merged, and stops when one
    more group no longer helps by `min_gain`."""
    tensors, names, ready_by_position, sizes = context
    candidates = _best_partitions(tensors, ready, strategies, compressor, cluster, max_groups)

    def plan_of(y: int) -> Plan:
        return _merge_neighbours(Plan(tuple(candidates[y]), names, compressor, cluster, ready_by_position, sizes=sizes))

    best = plan_of(1)
    best_time = predicted_exchange_time(best)
    for y in range(2, len(candidates) + 1):
        candidate = plan_of(y)
        seconds = predicted_exchange_time(candidate)
        if seconds >= best_time:
            break
        gain = best_time - seconds
        best, previous, best_time = candidate, best_time, seconds
        if gain < min_gain * previous:
            break
    return best


def _best_partitions(tensors, ready, strategies, compressor, cluster, max_groups: int) -> "_Partitions":
    """{y: [Bucket]}: for every y up to `max_groups`, the partition of `tensors` (backprop order)
    into y contiguous buckets, each with its cheapest strategy, that finishes first when each bucket
    starts once its last gradient is `ready` and the previous bucket is done (MergeComp's dynamic
    programme; with no ready times, the least summed cost). Long lists are cut into `_units` first.
    A mapping whose partitions are found when first looked up (`_Partitions`)."""
    return _Partitions(tensors, ready, strategies, compressor, cluster, max_groups)


class _Partitions(collections.abc.Mapping):
    """`_best_partitions`'s mapping. The dynamic programme runs top-down, memoised: the best finish
    of the first j units in y buckets looks at the best finishes of i < j units in y - 1 buckets,
    and each bucket's price (`_cheapest`) is computed once, when first needed. So where Algorithm 2
    stops at y = 2, as it does where one bucket is best, only the buckets that start at the first
    unit or end at the last are priced (2n of the n (n + 1) / 2); y >= 3 needs them all. The same
    candidates in the same order as a bottom-up table: the same partitions."""

    def __init__(self, tensors, ready, strategies, compressor, cluster, max_groups: int):
        self._tensors, self._strategies, self._compressor, self._cluster = tensors, strategies, compressor, cluster
        self._units = _units([n for _, _, n in tensors])
        self._prefix = [0]
        for start, end in self._units:
            self._prefix.append(self._prefix[-1] + sum(n for _, _, n in tensors[start:end]))
        self._unit_ready = [max(ready[start:end]) for start, end in self._units]
        self._backward_end = max(ready)
        self._count = len(self._units)
        self._groups = min(max_groups, self._count)
        self._cost = {}  # (i, j): (strategy, StrategyTime) of the bucket of units i .. j - 1
        self._best = {}  # (y, j): (finish, i) of the first j units in y buckets, the last of units i .. j - 1

    def __len__(self) -> int:
        return self._groups

    def __iter__(self):
        return iter(range(1, self._groups + 1))

    def __getitem__(self, groups_wanted) -> list:
        if groups_wanted not in range(1, self._groups + 1):
            raise KeyError(groups_wanted)
        cuts, j = [], self._count
        for y in range(groups_wanted, 0, -1):
            i = self._finish(y, j)[1]
            cuts.append((i, j))
            j = i
        buckets = []
        for i, j in reversed(cuts):
            members = [t for start, end in self._units[i:j] for t in self._tensors[start:end]]
            strategy, predicted = self._price(i, j)
            elements = self._prefix[j] - self._prefix[i]
            dense = st.DENSE.time(elements, self._compressor, self._cluster, tensors=len(members)).total
            buckets.append(Bucket(tuple(p for p, _, _ in members), elements, strategy, predicted, dense))
        return buckets

    def _price(self, i: int, j: int) -> tuple:
        """(strategy, StrategyTime) of the bucket of units i .. j - 1, its cheapest."""
        if (i, j) not in self._cost:
            tensors_in = self._units[j - 1][1] - self._units[i][0]
            self._cost[i, j] = _cheapest(self._prefix[j] - self._prefix[i], tensors_in, self._strategies,
                                         self._compressor, self._cluster)
        return self._cost[i, j]

    def _finish(self, y: int, j: int) -> tuple:
        """(finish, i): when the first j units in y buckets finish at the earliest, and the first
        unit of the last bucket (the smallest i on ties)."""
        if (y, j) not in self._best:
            best = (float("inf"), None)
            for i in range(0, 1) if y == 1 else range(y - 1, j):
                previous = 0.0 if y == 1 else self._finish(y - 1, i)[0]
                t = cm.transfer_end(max(self._unit_ready[j - 1], previous), self._price(i, j)[1].total,
                                    self._backward_end, self._cluster.overlap_slowdown)
                if t < best[0]:
                    best = (t, i)
            self._best[y, j] = best
        return self._best[y, j]


def _dense_bucket(bucket, compressor, cluster):
    time = st.DENSE.time(bucket.elements, compressor, cluster, tensors=len(bucket.positions))
    return Bucket(bucket.positions, bucket.elements, st.DENSE, time, time.total)


def _merge_neighbours(plan: Plan) -> Plan:
    """Neighbouring dense buckets merged into one. The exchange sends each dense tensor by its own
    allreduce as soon as it is ready, fused by Horovod (a dense bucket only prices its tensors), and
    `predicted_exchange_time` prices them so: merged or apart, the plan's time is the same."""
    merged = []
    for b in plan.buckets:
        if merged and not merged[-1].strategy.compresses and not b.strategy.compresses:
            last = merged[-1]
            merged[-1] = _dense_bucket(Bucket(last.positions + b.positions, last.elements + b.elements, st.DENSE,
                                              last.predicted, 0.0), plan.compressor, plan.cluster)
        else:
            merged.append(b)
    return dataclasses.replace(plan, buckets=tuple(merged))


def dense_plan(tensors, compressor, cluster: cm.ClusterModel) -> Plan:
    """Every tensor sent dense, in one bucket (the exchange sends each dense tensor by its own
    allreduce, which Horovod fuses): the plan of an exchange whose calibration has yet to run."""
    _check_cluster(cluster)
    bucket = Bucket(tuple(p for p, _, _ in tensors), sum(n for _, _, n in tensors), st.DENSE, None, 0.0)
    return Plan((_dense_bucket(bucket, compressor, cluster),) if tensors else (),
                {p: name for p, name, _ in tensors}, compressor, cluster, sizes={p: n for p, _, n in tensors})


def per_tensor_plan(tensors, compressor, cluster: cm.ClusterModel) -> Plan:
    """planning="off": one bucket per tensor; tensors of at least compressor.min_elements use the
    forced strategy or the compressor's own collective, smaller ones go dense."""
    _check_cluster(cluster)
    own = compressor.strategy or compressor.collective
    buckets = []
    for position, _, elements in tensors:
        strategy = own if elements >= compressor.min_elements else st.DENSE
        dense = st.DENSE.time(elements, compressor, cluster)
        predicted = strategy.time(elements, compressor, cluster, alone=False)
        buckets.append(Bucket((position,), elements, strategy, predicted, dense.total))
    return Plan(tuple(buckets), {p: name for p, name, _ in tensors}, compressor, cluster,
                sizes={p: n for p, _, n in tensors})


def predicted_exchange_time(plan: Plan) -> float:
    """Seconds from the exchange's first gradient until its last reduced gradient, as the exchange
    runs the plan, given when each gradient is ready (`plan.ready`; all at 0: the whole exchange
    after the backward pass).

    The dense buckets' tensors go as Horovod's optimizer sends them, one allreduce each as soon as
    it is ready, fused by Horovod's background loop (a dense bucket is a price, not a wait for its
    last tensor); the compressed buckets of one strategy share one grouped collective, which starts
    once all of them are encoded. Encoding and decoding (`predicted.compression`) run on the device
    that computes the backward pass, so they add to it: they are priced after its last gradient,
    one group after another (on 2 emulated hosts of this machine's CPU, a compressed bucket encoded
    during the backward pass made it longer by about as much). An AR-Topk group pays one broadcast
    per bucket. All of it is one queue of collectives (`tfcomp.cost_model.network_queue_end`, the
    replay that prices plain Horovod too), every tensor put in a collective adds the per-tensor
    bookkeeping, and what compressing costs once per step (`cluster.compression_fixed`) comes last.
    Each group's network time is its strategy's `communication`, the price the search gave its
    buckets one by one. The exchange ends no earlier than the last gradient."""
    cluster, k, compressor = plan.cluster, plan.cluster.workers, plan.compressor

    def ready_of(bucket) -> float:
        return max(plan.ready.get(p, 0.0) for p in bucket.positions)

    # (ready, bytes, tensors) per allreduce the exchange submits
    dense = [(plan.ready.get(p, 0.0), b.strategy.wire_bytes(compressor, plan.sizes[p], k), 1)
             for b in plan.buckets if not b.strategy.compresses for p in b.positions]
    groups = {}
    for b in plan.compressed:
        groups.setdefault(b.strategy, []).append(b)
    collectives = []  # (ready, seconds on the network)
    backward_end = max(plan.ready.values(), default=0.0)
    computing = backward_end  # the device is busy with the backward pass until then
    for strategy, buckets in sorted(groups.items(), key=lambda item: max(map(ready_of, item[1]))):
        computing += sum(b.predicted.compression for b in buckets)
        network = strategy.communication([b.elements for b in buckets], compressor, cluster)
        tensors = sum(len(b.positions) for b in buckets)
        collectives.append((computing, network + strategy.bookkeeping(len(buckets), tensors, cluster)))
    end = max(cm.network_queue_end(dense, collectives, cluster, backward_end), backward_end)
    return end + (cluster.compression_fixed if plan.compressed else 0.0)


def check_min_gain(min_gain) -> None:
    """ValueError naming `min_gain` unless it is a fraction in [0, 1) (what a re-plan must gain)."""
    if not 0.0 <= min_gain < 1.0:
        raise ValueError(f"min_gain must be a fraction in [0, 1), got {min_gain!r}")


def pays_to_replace(running: Plan, new: Plan, min_gain: float) -> bool:
    """Whether `new` is predicted to end the exchange sooner than `running`, priced with `new`'s
    figures (its cluster and ready times), by at least `min_gain` (a fraction) of the part of
    `running`'s exchange that outlasts the backward pass (its last gradient): what replacing a plan
    in training must gain to be worth a new trace of the step and a new trial. (Relative to the
    part a plan can change: the whole exchange also spans the backward pass.)"""
    check_min_gain(min_gain)
    now = predicted_exchange_time(dataclasses.replace(running, cluster=new.cluster, ready=new.ready))
    exposed = now - max(new.ready.values(), default=0.0)
    return now - predicted_exchange_time(new) > min_gain * exposed


def replacement(running: Plan, new: Plan, min_gain: float, *, compressing: bool = True):
    """What a re-plan installs in place of `running` (the buckets the exchange runs now): `new`,
    or only its all-dense buckets where `compressing` is False (a trial in this job measured
    compressing slower than dense, which outweighs the model), where that differs from `running`
    and `pays_to_replace` with `min_gain`; else None (keep running)."""
    if not compressing:
        new = new.all_dense()
    if new.digest() == running.digest() or not pays_to_replace(running, new, min_gain):
        return None
    return new


GRID_POINTS = 65  # `fit_overlap_slowdown` and `network_explaining` try this many values (odd: the middle
#                   one, factor 1, is on `network_explaining`'s grid) before bisecting


def fit_overlap_slowdown(plan: Plan, measured_seconds: float, tolerance: float = 1e-4) -> float:
    """The least `ClusterModel.overlap_slowdown` (in [1, cm.MAX_OVERLAP_SLOWDOWN]) with which
    `predicted_exchange_time(plan)` reaches `measured_seconds`, the exchange's end measured with
    `plan` run (its `ready` the measured ready times): 1 where the plan is predicted to end no
    earlier than measured; where no slowdown explains the measurement, the one predicting the
    latest end (1 where no slowdown changes the prediction: nothing of the plan overlaps the
    backward pass).

    The prediction is not monotone in the slowdown: a slower transfer during the backward pass can
    let Horovod fuse more of the later dense tensors into one allreduce, paying fewer latencies. Nor
    is it continuous: a fusion gained or lost is a jump, so the prediction reached can exceed the
    measurement by about a tensor's latency. So the slowdowns are tried on a grid (`GRID_POINTS`,
    evenly spaced in log) and the step before the first that reaches the measurement is bisected
    to `tolerance`."""
    if not (measured_seconds >= 0.0 and math.isfinite(measured_seconds)):
        raise ValueError(f"measured_seconds must be finite seconds >= 0, got {measured_seconds!r}")

    @functools.cache  # where no slowdown reaches the measurement, the grid's predictions pick the latest
    def predicted(slowdown: float) -> float:
        cluster = dataclasses.replace(plan.cluster, overlap_slowdown=slowdown)
        return predicted_exchange_time(dataclasses.replace(plan, cluster=cluster))

    grid = _log_grid(1.0, cm.MAX_OVERLAP_SLOWDOWN)
    fitted = _first_reaching(lambda slowdown: predicted(slowdown) >= measured_seconds, grid, tolerance)
    if fitted is None:
        return max(grid, key=lambda slowdown: (predicted(slowdown), -slowdown))
    return fitted


def _log_grid(low: float, high: float) -> list:
    """`GRID_POINTS` values from `low` to `high` (both included, both > 0), evenly spaced in log."""
    steps = GRID_POINTS - 1
    return [low * (high / low) ** (i / steps) for i in range(steps)] + [high]


def _first_reaching(reaches, grid: list, tolerance: float):
    """Where `reaches(x)` first holds: the first point of `grid` (ascending) where it does, less the
    step before it bisected to `tolerance` (the upper end of the last interval, where it holds);
    None where it holds at no point of the grid."""
    for index, x in enumerate(grid):
        if reaches(x):
            if index == 0:
                return x
            low, high = grid[index - 1], x
            while high - low > tolerance:
                middle = 0.5 * (low + high)
                if reaches(middle):
                    high = middle
                else:
                    low = middle
            return high
    return None


_MAX_BANDWIDTH = cm.CLUSTER_LIMITS["allreduce.bandwidth"][1]
NETWORK_SCALE_RANGE = 64.0  # `network_explaining` scales the bandwidths by at most this factor either way


def network_explaining(plan: Plan, measured_seconds: float, tolerance: float = 1e-4) -> cm.ClusterModel:
    """`plan.cluster` with both networks' bandwidths multiplied by the one factor (in
    [1 / NETWORK_SCALE_RANGE, NETWORK_SCALE_RANGE]) with which `predicted_exchange_time(plan)` comes
    down to `measured_seconds`, the least such: the network that would explain the measured exchange
    if the network were all that the model got wrong (the nearest bound where none in the range
    does; the cluster unchanged where no bandwidth changes the prediction).

    The prediction shrinks as the bandwidths grow, but not strictly nor continuously (a faster
    transfer can leave Horovod fewer tensors to fuse), so as in `fit_overlap_slowdown` the factors
    are tried on a grid (`GRID_POINTS`, evenly spaced in log) and the step before the first whose
    prediction is no later than measured is bisected (on the factor's log, to `tolerance`)."""
    if not (measured_seconds >= 0.0 and math.isfinite(measured_seconds)):
        raise ValueError(f"measured_seconds must be finite seconds >= 0, got {measured_seconds!r}")

    def scaled(factor: float) -> cm.ClusterModel:
        def faster(network: cm.Network) -> cm.Network:
            return dataclasses.replace(network, bandwidth=min(network.bandwidth * factor, _MAX_BANDWIDTH))

        return dataclasses.replace(plan.cluster, allreduce=faster(plan.cluster.allreduce),
                                   allgather=faster(plan.cluster.allgather))

    def predicted(log_factor: float) -> float:
        return predicted_exchange_time(dataclasses.replace(plan, cluster=scaled(math.exp(log_factor))))

    grid = [math.log(factor) for factor in _log_grid(1.0 / NETWORK_SCALE_RANGE, NETWORK_SCALE_RANGE)]
    if predicted(grid[0]) == predicted(grid[-1]):
        return plan.cluster
    log_factor = _first_reaching(lambda x: predicted(x) <= measured_seconds, grid, tolerance)
    return scaled(math.exp(grid[-1] if log_factor is None else log_factor))


def all_dense_time(plan: Plan) -> float:
    """`predicted_exchange_time` of `plan.all_dense()`: everything sent dense."""
    return predicted_exchange_time(plan.all_dense())


class PlanMismatchError(RuntimeError):
    """The ranks made different plans (they would run different collectives and hang)."""


CLEAR_GAIN = 1.5  # where compression's least costs predict less than this gain over dense, a compressor tried in
# training is planned from them (`compression_could_pay`): the trial decides, and measuring the rest would not pay


def compression_could_pay(tensors, compressor, least_cost_cluster: cm.ClusterModel, *,
                          margin: float = COMPRESSION_MARGIN, step_seconds: float | None = None) -> bool:
    """The planner's rule for stopping calibration early: whether measuring compression's other
    costs could change the plan of `tensors` = [(position, name, elements)] in backprop order,
    given `least_cost_cluster` (the networks measured, compression at the least costs its first
    probes allow): only where the plan with those least costs compresses (`make_plan` with `margin`
    and `step_seconds`: its gain exceeds the margin) and, for a compressor tried in training
    (`compressor.tried_steps` > 0), is predicted at least `CLEAR_GAIN` times faster than dense (a
    smaller gain goes to the trial, a truer test than more probes). Higher costs could only make
    compressing pay less."""
    plan = make_plan(tensors, compressor, least_cost_cluster, margin=margin, step_seconds=step_seconds)
    gain = all_dense_time(plan) / max(predicted_exchange_time(plan), 1e-12)
    return bool(plan.compressed) and (compressor.tried_steps == 0 or gain >= CLEAR_GAIN)
