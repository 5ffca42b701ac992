"""Calibration of the cost model on the running cluster: at start-up, or between the first training steps.

`calibrate(compressor, process_set, max_elements, tensor_elements)` returns a `tfcomp.cost_model.ClusterModel`:

  * the allreduce and allgather networks: latency from a tiny collective (one float32), bandwidth
    from a large one (the size of the gradients, 1 to 16 MiB; an eighth of that, at most 4 MiB, for
    the allgather), fitted to the ring formulas of `tfcomp.cost_model`;
  * what each tensor adds to the exchange's collectives (Horovod's per-tensor negotiation and
    bookkeeping), from a graph of 64 one-element allreduces against one;
  * the compressor's encode+decode time as `c0 + c1 * elements` (plus per-tensor and per-merged-
    element costs), fitted to the times of compressed buckets in the exchange itself (accumulate
    with the residual, encode, local decode, new residual, decode of all K workers' payloads) with
    stand-in collectives that send nothing (`LocalCollectives`: every worker's payload taken to be
    this one's), every rank at once, at sizes from 2^12 up to the largest bucket (at most 2^22);
    the merge cost from a bucket of the gradients' own tensors (`tensor_elements`) where they are
    few and small enough; for the sparsifiers, what the partitioned allreduce's and AR-Topk's work
    (partition and owner sums; the values at one owner's indices) adds to or saves from the
    allgather's (the decode of K payloads), per slot, from the largest probe run with each. The
    payloads' collectives are priced by the network figures alone. (Until 2026-11, the probes ran
    the real collectives and their modelled time was subtracted: on 2 emulated hosts at 1 Gbit/s
    that made c1 spread 74 to 89 % against 1 to 33 % for the same probes computing alone, and
    come out 13 to 20 % low, BENCHMARKS.md);
  * in two stages: the smallest and the largest compression probe first, which bound the costs
    from below (every cost they cannot separate at 0). If the plan with those least costs is all
    dense (a network fast enough that compressing cannot pay), no further measurement could change
    that, and calibration stops there (on a fast network it takes a fraction of the time). It
    stops there too for a compressor tried in training (`tfcomp.trial`) where those least costs
    predict less than a 1.5x faster exchange than dense: their plan goes to the trial.

Calibration comes in pieces: `calibration_pieces` is a generator whose every `next()` runs one
piece (a probe graph made, or called for the first time, which traces it; or one round of timed
calls) and which returns the figures. `calibrate` runs it at once (the exchange's first step does,
by default); an exchange whose calibration is deferred (`GradientExchange.defer_calibration`, which
`tfcomp.keras.Replan` sets) runs a few pieces after each training step instead, its first steps
sending everything dense, so that no step waits for the whole of it.

Everything is timed as training runs it: each call one graph, started right after a barrier (in
training the previous step's collectives synchronise the workers), the probes of a kind
interleaved round by round in three blocks, the block that lies furthest out left out (a slow
spell of a shared machine), and the medians taken.

Every rank measures, each timed call started right after a barrier (so that the figures include
the contention of all workers computing at once);
each compression cost is the median of the ranks' (steadier than one rank's), the network figures
rank 0's, and the whole broadcast, so every rank plans from the same numbers. The networks are
measured by every job (the same hosts may be linked at another rate tomorrow). The compression
costs are a property of the hosts and the compressor, not of the network: rank 0 caches them in a
JSON file (`TFCOMP_CALIBRATION_CACHE`, default `~/.cache/tfcomp/calibration.json`; "none" turns
the cache off) keyed by the machine (rank 0's host name and CPU), the world layout, the TensorFlow
and tfcomp versions, the compressor's settings and the gradients' sizes (as far as they size the
probes); a change of any of them measures again. A first stage's lower bounds are cached as such:
a later job on a network where they no longer rule compression out measures the rest.

The same file keeps the gradients' ready times measured in training (`store_ready_times`, called
when the exchange re-plans with them), keyed by the hosts and the gradients' exact sizes, so that a
later job of the same model makes its first plan with them (`cached_ready_times`) instead of
assuming every gradient ready after the backward pass.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import os
import platform
import reprlib
import time
from typing import NamedTuple

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from absl import logging

from tfcomp.collectives import LocalCollectives, barrier
from tfcomp.compressors import DEFAULT_MIN_ELEMENTS, DEFAULT_TRIAL_STEPS, DEFAULT_UNION_LIMIT
from tfcomp.cost_model import AffineCost, ClusterModel, Network, StrategyTime, available_strategies
from tfcomp.memory import ExchangeState
from tfcomp.planning import Bucket, Plan, all_dense_time, make_plan, predicted_exchange_time
from tfcomp.step import StepGraph

__all__ = ["CACHE_ENV", "CompressionFigures", "cache_key", "cached_ready_times", "calibrate", "calibration_pieces",
           "compression_pieces", "cost_settings", "cpu_allocator", "finish", "measure_compression", "store_ready_times"]

CACHE_ENV = "TFCOMP_CALIBRATION_CACHE"
_DEFAULT_CACHE = os.path.join("~", ".cache", "tfcomp", "calibration.json")
_LARGE_MIN_ELEMENTS = 2**18  # 1 MiB of float32
# 16 MiB: at 1 Gbit/s a ring allreduce of it takes 150 to 220 ms (2 to 4 workers). Smaller, the
# emulated links' token-bucket burst (the first 0.5 MB at 1 Gbit/s, 1 MB at 2 go at once) inflated
# the bandwidth: two workers, 2 Gbit/s links, 2.08 to 2.20 Gbit/s from 4 MiB and 1.75 to 1.81 from
# 16, where larger transfers ran at 1.74 (BENCHMARKS.md), so larger dense exchanges were priced low.
_LARGE_MAX_ELEMENTS = 2**22
_LARGE_ALLGATHER_MAX_ELEMENTS = 2**20  # 4 MiB: the allgather carries compressed payloads
_BOOKKEEPING_TENSORS = 64
_LARGE_PARTS = 4
_LARGE_ROUNDS_ELEMENTS = 2**23  # the large collectives run about a third of this many elements per block (2 to 5 rounds)
_ENCODE_SIZES = (2**12, 2**22)  # the smallest compression probe, and the largest there can be
_PER_TENSOR_PROBE_ELEMENTS = 2**16  # also a one-tensor probe
_PER_TENSOR_PROBE_TENSORS = 16
_BUCKETS_PROBE_BUCKETS = 4  # small buckets in one call, against one
# The merge probe is one bucket of the gradients' own tensors where they are this many and this large.
_OWN_MERGE_PROBE_TENSORS = (2, 512)
_OWN_MERGE_PROBE_ELEMENTS = (_PER_TENSOR_PROBE_ELEMENTS, _ENCODE_SIZES[-1])
# Rounds per block (three blocks, the outlying one left out) of the compression probes: short ones (fewer
# than _MIN_LARGEST_PROBE elements), and long ones with a largest probe of 2^22 elements (more for
# smaller ones, up to as many as the short ones).
_SHORT_PROBE_ROUNDS = 7
_LONG_PROBE_ROUNDS = 3
_MIN_LARGEST_PROBE = 2**20
# The sparsifiers' other strategies, probed at the largest size beside the allgather: what their
# work adds per payload slot (ClusterModel.partitioned_per_slot, artopk_per_slot).
_OTHER_STRATEGY_PROBES = ("partitioned", "artopk")
_TINY_BYTES = 4.0  # the tiny collectives send one float32
_MIN_TRANSFER_SECONDS = 1e-6  # the least transfer time a fit accepts (a finite bandwidth)
# In the cache key: compression probes computing alone (before: with the real collectives, less
# their modelled time, which gave lower figures).
_PROBE_METHOD = "compute alone"
_BARRIER = "tfcomp_calibration_barrier"  # the one-float allreduce before each timed call
# Where compression's least costs predict less than this gain over dense, a compressor tried in
# training is planned from them: the trial decides, and measuring the rest would not pay.
_CLEAR_GAIN = 1.5


def _interleaved_times(runs: dict, rounds: int, synchronise=None):
    """A generator that times the callables in `runs` round-robin for `rounds` rounds, so that a
    shared machine's drifts touch them alike (and a difference of two runs is best taken round by
    round), yielding after each round (a piece of calibration that may run between two training
    steps); it returns {name: float64 [rounds] seconds}. With `synchronise` (a barrier), every timed
    call starts right after it: in training, each step's exchange starts with the workers just
    synchronised by the previous step's collectives, and a timing of back-to-back calls (which
    pipeline in Horovod's cycle) would miss the wait for the next cycle. Every rank must pass the
    same runs and rounds (they run collectives)."""
    times = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            if synchronise is not None:
                synchronise()
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
        yield
    return {name: np.asarray(values) for name, values in times.items()}


def _without_outlying_block(sets, synchronise, warmup: int = 1, blocks: int = 3):
    """A generator that returns {name: seconds [rounds]} of every set of runs [(runs, rounds)]:
    each run called `warmup` times untimed (its first call traces its graph; a piece each), then
    each set timed in `blocks` blocks of `rounds` rounds (`_interleaved_times`), the sets' blocks
    alternating, and the rounds of each set's blocks pooled less one: the fastest or the slowest
    block by sum of medians, whichever lies further from the middle one. A shared machine has
    spells of a second or so in which everything runs slower (another tenant; on a VM, the host
    taking the CPU): such a spell spoils one block, not the figures."""
    for runs, _ in sets:
        for run in runs.values():
            for _ in range(warmup):
                run()
            yield
    timed = []
    for _ in range(blocks):
        timed.append([])
        for runs, rounds in sets:
            timed[-1].append((yield from _interleaved_times(runs, rounds=rounds, synchronise=synchronise)))
    times = {}
    for per_block in zip(*timed):
        times.update(_pool_without_outlier(per_block))
    return times


def finish(pieces):
    """Runs a generator of calibration pieces (`calibration_pieces`, or any of this module's
    generators) to its end, at once, and returns what it returns."""
    while True:
        try:
            next(pieces)
        except StopIteration as done:
            return done.value


def _pool_without_outlier(per_block) -> dict:
    """{name: float64 [rounds]}: the blocks' times ({name: [rounds]} each, at least 3 blocks)
    concatenated in their order, less the fastest or the slowest block by sum of medians,
    whichever lies further from its neighbour in that order."""
    sums = [sum(np.median(v) for v in t.values()) for t in per_block]
    order = sorted(range(len(per_block)), key=sums.__getitem__)
    fast, slow = order[:2], order[-2:]
    dropped = fast[0] if sums[fast[1]] - sums[fast[0]] > sums[slow[1]] - sums[slow[0]] else slow[1]
    kept = [t for n, t in enumerate(per_block) if n != dropped]
    return {name: np.concatenate([t[name] for t in kept]) for name in kept[0]}


def _graph_call(function):
    """A callable that runs `function` (returning a list of tensors) as one tf.function and waits for it."""
    graph = tf.function(function, autograph=False)
    return lambda: graph()[0].numpy()


def _rank0_value(value: float, process_set) -> float:
    """Rank 0's float, on every rank (decisions that change the sequence of collectives must agree)."""
    sent = tf.constant([value], tf.float64)
    return float(hvd.broadcast(sent, 0, process_set=process_set, name="tfcomp_calibration_decision").numpy()[0])


def _fit_network(tiny_seconds: float, large_seconds: float, large_bytes: float, hops: float, bytes_per_hop: float) -> Network:
    """Solves t = hops * (alpha + S_hop / B) from a tiny (one float32) and a large measurement. When
    noise makes the tiny one take nearly as long as the large one (or longer), at least half of the
    larger time is taken as transfer (a lower bandwidth rather than an absurdly high one); figures
    that noise and the subtraction of per-tensor costs made negative still give a valid Network."""
    transfer = max(large_seconds - tiny_seconds, 0.5 * max(large_seconds, tiny_seconds), _MIN_TRANSFER_SECONDS)
    bandwidth = hops * bytes_per_hop * (large_bytes - _TINY_BYTES) / transfer
    latency = max(tiny_seconds / hops - bytes_per_hop * _TINY_BYTES / bandwidth, 0.0)
    return Network(latency, bandwidth)


def _network_probe_elements(elements: int) -> tuple:
    """(large allreduce, large allgather) float32 elements for gradients of `elements`: their size
    within 1 MiB .. 16 MiB (a multiple of _LARGE_PARTS), and an eighth of it, within 1 MiB .. 4 MiB,
    for the allgather, whose payloads are compressed."""
    allreduce = min(max(elements, _LARGE_MIN_ELEMENTS), _LARGE_MAX_ELEMENTS) // _LARGE_PARTS * _LARGE_PARTS
    return allreduce, min(max(elements // 8, _LARGE_MIN_ELEMENTS), _LARGE_ALLGATHER_MAX_ELEMENTS)


def _merge_probe(largest: int, tensor_elements=()) -> tuple:
    """The tensor sizes of the merge probe's one bucket: the gradients' own (`tensor_elements`,
    ints), where they are 2 to 512 tensors, none empty, of 2^16 to 2^22 elements in all, since what
    a bucket of many tensors costs beyond its per-tensor costs grows faster than its elements (its
    working set leaves the cache); otherwise `largest` elements as 8 tensors."""
    sizes = tuple(int(n) for n in tensor_elements)
    (fewest, most), (least, greatest) = _OWN_MERGE_PROBE_TENSORS, _OWN_MERGE_PROBE_ELEMENTS
    if fewest <= len(sizes) <= most and least <= sum(sizes) <= greatest and min(sizes) >= 1:
        return sizes
    return (largest // 8,) * 7 + (largest - 7 * (largest // 8),)


def _largest_compression_probe(max_elements: int) -> int:
    """The largest compression probe, in float32 elements: the gradients' size, but at least 2^20
    (so that the slope stands out of the noise) and at most 2^22."""
    return min(max(max_elements, _MIN_LARGEST_PROBE), _ENCODE_SIZES[-1])


def _measure_networks(process_set, elements: int):
    """A generator of calibration pieces that returns the `ClusterModel` of the collectives for
    this process set (no compression figures), timed as
    training runs them (in a graph, the workers synchronised just before): latency from one float32,
    bandwidth from `elements` float32 (the gradients' size, within 1 MiB .. 16 MiB, as 4 tensors
    that Horovod fuses) for the allreduce and an eighth of that for the allgather, whose payloads
    are compressed; and what each tensor adds from 64 one-element allreduces against one."""
    k = process_set.size()

    def allreduces(tensors, name):
        return _graph_call(lambda: [hvd.allreduce(t * 1.0, op=hvd.Sum, process_set=process_set, name=f"{name}_{i}")
                                    for i, t in enumerate(tensors)])

    def allgather(tensor, name):
        return _graph_call(lambda: [hvd.allgather(tensor * 1.0, process_set=process_set, name=name)])

    synchronise = barrier(process_set, _BARRIER)
    tiny_allreduce = allreduces([tf.ones([1])], "tfcomp_calibration_tiny")
    tiny_allgather = allgather(tf.ones([1]), "tfcomp_calibration_tiny_allgather")
    # Per-tensor cost: separate allreduces in one graph, the way Horovod's optimizer sends dense
    # gradients (one allreduce each, fused by Horovod; the exchange's grouped allreduce pays less).
    small = {
        "allreduce": tiny_allreduce,
        "allgather": tiny_allgather,
        "tensors": allreduces([tf.fill([1], float(i)) for i in range(_BOOKKEEPING_TENSORS)], "tfcomp_calibration_tensor"),
    }
    ar_elements, ag_elements = _network_probe_elements(elements)
    # The large allreduce as training sends gradients: separate tensors that Horovod fuses, so the
    # copies into and out of its fusion buffer are part of the measured bandwidth (less the
    # per-tensor costs of those tensors).
    parts = [tf.random.stateless_normal([ar_elements // _LARGE_PARTS], seed=[7, i]) for i in range(_LARGE_PARTS)]
    large = {
        "large_allreduce": allreduces(parts, "tfcomp_calibration_large"),
        "tiny_allreduce": tiny_allreduce,
        "large_allgather": allgather(tf.random.stateless_normal([ag_elements], seed=[7, 2]), "tfcomp_calibration_large_allgather"),
        "tiny_allgather": tiny_allgather,
    }
    large_rounds = min(5, max(2, _LARGE_ROUNDS_ELEMENTS // ar_elements // 3))
    t = yield from _without_outlying_block([(small, 5), (large, large_rounds)], synchronise, warmup=3)
    per_tensor = max(np.median(t["tensors"] - t["allreduce"]), 0.0) / (_BOOKKEEPING_TENSORS - 1)
    # Transfer times, each large collective against the tiny one of its round; the cost model adds
    # per_tensor for every tensor of a dense bucket, so it comes out of the allreduce's figures.
    tiny_ar, tiny_ag = np.median(t["allreduce"]) - per_tensor, np.median(t["allgather"])
    large_ar = tiny_ar + np.median(t["large_allreduce"] - t["tiny_allreduce"]) - (_LARGE_PARTS - 1) * per_tensor
    large_ag = tiny_ag + np.median(t["large_allgather"] - t["tiny_allgather"])
    # ring allreduce: 2 (K-1) hops of S/K bytes; ring allgather: K-1 hops of S bytes.
    return ClusterModel(k, _fit_network(float(tiny_ar), float(large_ar), 4.0 * ar_elements, 2 * (k - 1), 1.0 / k),
                        _fit_network(float(tiny_ag), float(large_ag), 4.0 * ag_elements, k - 1, 1.0),
                        AffineCost(0.0, 0.0), float(per_tensor))


def cost_settings(compressor):
    """`compressor` less the settings that do not change what compressing costs: a copy with no
    warm-up (whose dense steps the probes would otherwise time instead of compression), the
    default planning, strategy, min_elements and trial (which choose buckets, not their cost) and, for
    the sparsifiers, AR-Topk's round-robin owner and the default union limit (the probes use the
    compressor's own collective, and those of the other strategies these defaults). What the
    probes run and what the cache is keyed by, so that changing those settings measures nothing
    again."""
    probe = copy.copy(compressor)
    probe.warmup_steps, probe.planning, probe.strategy, probe.min_elements = 0, "auto", None, DEFAULT_MIN_ELEMENTS
    probe.trial_steps = DEFAULT_TRIAL_STEPS
    if hasattr(probe, "artopk_owner"):
        probe.artopk_owner, probe.union_limit = "star", DEFAULT_UNION_LIMIT
    return probe


def _exchange_probe(compressor, workers: int, buckets, strategy=None):
    """A callable that runs one exchange call, as one graph, whose plan is `buckets` (lists of
    tensor sizes), each compressed with `strategy` (None: the compressor's own collective), its
    collectives `LocalCollectives(workers)`: one worker's compression work in a cluster of
    `workers`, the decode of all their payloads included, nothing sent."""
    strategy = strategy or ("allreduce" if compressor.collective == "allreduce" else "allgather")
    sizes = [n for bucket in buckets for n in bucket]
    positions = iter(range(len(sizes)))
    plan = Plan(tuple(Bucket(tuple(next(positions) for _ in bucket), sum(bucket), strategy, StrategyTime(0.0, 0.0), 0.0)
                      for bucket in buckets),
                {i: f"calibration_{i}" for i in range(len(sizes))}, compressor, ClusterModel.unpriced(workers),
                sizes=dict(enumerate(sizes)))
    step = StepGraph(compressor, ExchangeState(), LocalCollectives(workers))
    variables = [tf.Variable(tf.zeros([n]), name="calibration") for n in sizes]
    gradients = [tf.random.stateless_normal([n], seed=[11, n]) for n in sizes]
    runtime = step.create_state(plan, gradients, variables)
    return _graph_call(lambda: step(plan, gradients, variables, runtime))


class CompressionFigures(NamedTuple):
    """What compressing costs, in seconds: `encode_decode` c0 + c1 * elements per bucket,
    `per_tensor` for each tensor of a bucket, `merge_per_element` for each element of a bucket of
    more than one tensor, and `fixed` once per exchange with any compressed bucket (the fields of
    `tfcomp.cost_model.ClusterModel` of those names). `fitted`: whether the probes' times grew
    with their size; False where they did not (a machine so loaded that the noise hid the work),
    and then c1 is the largest probe's whole time per element (an upper bound: the plan leans to
    dense). `complete`: False for the lower bounds of `_lower_bound_figures` (only the smallest
    and largest probes measured)."""

    encode_decode: AffineCost
    per_tensor: float
    merge_per_element: float
    fixed: float
    fitted: bool = True
    complete: bool = True
    partitioned_per_slot: float = 0.0
    artopk_per_slot: float = 0.0

    @classmethod
    def of(cls, cluster: ClusterModel, complete: bool = True) -> "CompressionFigures":
        """The compression figures in `cluster` (fitted: a cache keeps only fitted ones)."""
        return cls(cluster.encode_decode, cluster.compression_per_tensor, cluster.merge_per_element,
                   cluster.compression_fixed, True, complete, cluster.partitioned_per_slot, cluster.artopk_per_slot)

    def apply(self, cluster: ClusterModel) -> ClusterModel:
        """`cluster` with these compression figures."""
        return dataclasses.replace(cluster, encode_decode=self.encode_decode, compression_per_tensor=self.per_tensor,
                                   merge_per_element=self.merge_per_element, compression_fixed=self.fixed,
                                   partitioned_per_slot=self.partitioned_per_slot, artopk_per_slot=self.artopk_per_slot)


def _compression_figures(seconds: dict, sizes, largest: int, merged: tuple, slots: int) -> CompressionFigures:
    """The figures from the probes' times ({name: float64 [rounds] seconds}, paired round by round)
    as `measure_compression` describes them (`slots`: the largest probe's payload slots). Times
    that do not grow with the size (a machine so loaded that the noise hides the work) get the
    slope of the line from the origin to the largest probe, so that no bucket's elements are priced
    at nothing, and are not `fitted`."""
    small = sizes[0]
    single = AffineCost.fit(sizes, [np.median(seconds[n]) for n in sizes])
    fitted = single.c1 > 0
    if not fitted:
        single = AffineCost(single.c0, float(np.median(seconds[largest])) / largest)
    per_bucket = max(np.median(seconds["buckets"] - seconds[small]) / (_BUCKETS_PROBE_BUCKETS - 1) - single.c1 * small,
                     0.0)
    per_tensor = max(np.median(seconds["many"] - seconds[_PER_TENSOR_PROBE_ELEMENTS]), 0.0) / (_PER_TENSOR_PROBE_TENSORS - 1)
    merged_elements = sum(merged)
    merge = max(np.median(seconds["merged"] - seconds[merged_elements]) - (len(merged) - 1) * per_tensor,
                0.0) / merged_elements
    fixed = max(single.c0 - per_bucket - per_tensor, 0.0)
    per_slot = {strategy: float(np.median(seconds[strategy] - seconds[largest])) / slots if strategy in seconds else 0.0
                for strategy in _OTHER_STRATEGY_PROBES}
    return CompressionFigures(AffineCost(float(per_bucket), single.c1), float(per_tensor), float(merge), float(fixed),
                              bool(fitted), True, per_slot["partitioned"], per_slot["artopk"])


def _lower_bound_figures(times: dict, small: int, largest: int) -> CompressionFigures:
    """What the smallest and the largest one-tensor probes alone tell ({size: float64 [rounds]
    seconds}): c1 their slope and `fixed` their intercept, so that one bucket of one tensor is
    priced as measured, and every cost they cannot tell apart (c0 per bucket, per tensor, per
    merged element) at its least, 0, so that any plan of more buckets or tensors is priced at most
    at its cost. Not `fitted` where the slope is not positive."""
    fit = AffineCost.fit([small, largest], [float(np.median(times[n])) for n in (small, largest)])
    return CompressionFigures(AffineCost(0.0, fit.c1), 0.0, 0.0, fit.c0, bool(fit.c1 > 0), complete=False)


def measure_compression(compressor, num_workers: int, max_elements: int, tensor_elements=(), could_pay=None,
                        process_set=None) -> CompressionFigures:
    """`compression_pieces` run at once: the `CompressionFigures` it returns."""
    return finish(compression_pieces(compressor, num_workers, max_elements, tensor_elements, could_pay, process_set))


def compression_pieces(compressor, num_workers: int, max_elements: int, tensor_elements=(), could_pay=None,
                       process_set=None):
    """A generator of calibration pieces (one probe made, one probe's first call, or one round of
    timed calls) that returns the `CompressionFigures` of the work of compressed buckets in the
    exchange itself for `num_workers` workers (accumulate, encode, local decode, residual, decode
    of all payloads), each probe one graph call with `LocalCollectives` (nothing sent: the network
    figures price the collectives), the probes interleaved. With `process_set` (Horovod's, of
    `num_workers` ranks, every one of them calling at once), each timed call starts right after a
    barrier, so the figures include the contention of all workers computing at once as in
    training, and every cost is the median of the ranks' and `fitted` rank 0's
    (`_median_over_ranks`), the same on every rank.

    c1 is the slope of one-bucket calls of one tensor of 2^12, 2^16 and max_elements (at least
    2^20, at most 2^22) elements (and the merge probe's total) and their intercept is c0 + fixed;
    c0 is what one more bucket in the same call adds beyond its elements (4 small buckets against
    1). Per tensor: 16 tensors of 2^12 elements in one bucket against one tensor of 2^16 (short
    calls, so the difference of 15 per-tensor costs stands out of the noise; merging 2^16 elements
    costs next to nothing). Per merged element: one bucket of the gradients' own tensors
    (`tensor_elements`, ints in backprop order) against one tensor of their total, less their
    per-tensor costs; where the gradients are too few or too large for that (`_merge_probe`), the
    largest size as 8 tensors, measured at the size of the largest bucket, where merging costs the
    most. For the sparsifiers, the largest size also with the partitioned allreduce and with
    AR-Topk: what each one's work adds to the allgather's probe, per payload slot, signed.

    With `could_pay` (a callable that every rank calls at once: given `_lower_bound_figures`,
    whether compression could pay with costs that low), the smallest and the largest probe are
    timed first; where it says no, those lower bounds are returned (`complete` False) and nothing
    more is measured: no further cost could make compression pay."""
    compressor = cost_settings(compressor)
    largest = _largest_compression_probe(max_elements)
    merged = _merge_probe(largest, tensor_elements)
    sizes = sorted({_ENCODE_SIZES[0], _PER_TENSOR_PROBE_ELEMENTS, largest, sum(merged)})
    small = sizes[0]
    plans = {**{n: [[n]] for n in sizes}, "buckets": [[small]] * _BUCKETS_PROBE_BUCKETS,
             "many": [[_PER_TENSOR_PROBE_ELEMENTS // _PER_TENSOR_PROBE_TENSORS] * _PER_TENSOR_PROBE_TENSORS],
             "merged": [list(merged)]}
    for strategy in _OTHER_STRATEGY_PROBES if "partitioned" in available_strategies(compressor) else ():
        plans[strategy] = [[largest]]
    probes = {}
    for name, buckets in plans.items():
        probes[name] = _exchange_probe(compressor, num_workers, buckets, name if name in _OTHER_STRATEGY_PROBES else None)
        yield
    synchronise = None if process_set is None else barrier(process_set, _BARRIER)
    # Short calls are noisy and cheap, long ones steadier and costly: each set its own rounds (the
    # differences taken below are of probes in the same set, paired round by round).
    long_rounds = min(_SHORT_PROBE_ROUNDS, max(_LONG_PROBE_ROUNDS, _LONG_PROBE_ROUNDS * _ENCODE_SIZES[-1] // largest))

    def timed(names) -> dict:
        sets = []
        for long_calls, rounds in ((False, _SHORT_PROBE_ROUNDS), (True, long_rounds)):
            chosen = {name: probes[name] for name in names
                      if (sum(map(sum, plans[name])) >= _MIN_LARGEST_PROBE) == long_calls}
            sets += [(chosen, rounds)] if chosen else []
        return (yield from _without_outlying_block(sets, synchronise))

    agreed = (lambda figures: figures) if process_set is None else (
        lambda figures: _median_over_ranks(figures, process_set))
    if could_pay is not None:
        lower = agreed(_lower_bound_figures((yield from timed([small, largest])), small, largest))
        if not could_pay(lower):
            return lower
    times = yield from timed(list(probes))
    slots = compressor.payload_length(largest) if hasattr(compressor, "payload_length") else largest
    return agreed(_compression_figures(times, sizes, largest, merged, slots))


def _median_over_ranks(figures: CompressionFigures, process_set) -> CompressionFigures:
    """The ranks' figures agreed: every cost the median of the ranks' (each rank times the probes
    on its own: over 8 calibrations in 2 jobs on 4 hosts of this machine, rank 0's per-element
    cost spread 44 % and the median of the 4 ranks' 18 %; between fresh jobs both spread as much
    as the jobs' own speed, BENCHMARKS.md), `fitted` rank 0's (its decisions follow it),
    `complete` alike on every rank. Every rank of `process_set` must call it at once."""
    costs = [figures.encode_decode.c0, figures.encode_decode.c1, figures.per_tensor, figures.merge_per_element,
             figures.fixed, figures.partitioned_per_slot, figures.artopk_per_slot]
    gathered = hvd.allgather(tf.constant([[*costs, float(figures.fitted)]], tf.float64), process_set=process_set,
                             name="tfcomp_calibration_compression_figures").numpy()
    c0, c1, per_tensor, merge, fixed, partitioned, artopk = (float(x) for x in np.median(gathered[:, :-1], axis=0))
    return CompressionFigures(AffineCost(c0, c1), per_tensor, merge, fixed, bool(gathered[0, -1]), figures.complete,
                              partitioned, artopk)


def cache_key(compressor, process_set, max_elements: int, tensor_elements=()) -> str:
    """What the cached figures depend on; any change measures again: the host, its CPU, the world
    layout, TensorFlow's and tfcomp's versions, the compressor's `cost_settings`, and of `max_elements` (the
    gradients' size) and `tensor_elements` (their tensors' sizes), the probe sizes they give: these
    follow the size from 2^18 to 2^23 elements, and the merge probe is the tensors' own list
    where `_merge_probe` takes it; and how the probes measure (`_PROBE_METHOD`), so that figures
    measured another way are measured again."""
    largest = _largest_compression_probe(max_elements)
    probes = (*_network_probe_elements(max_elements), largest, _merge_probe(largest, tensor_elements))
    return _hashed_key(process_set, repr(cost_settings(compressor)), str(probes), _PROBE_METHOD)


def cpu_allocator() -> str:
    """"BFC" or "malloc": the allocator TensorFlow gives CPU tensors in this process, as
    `TF_CPU_ALLOCATOR_USE_BFC` says (TensorFlow reads it when it makes its first CPU tensor).
    Compression costs depend on it: with malloc, glibc maps every allocation over 32 MiB afresh
    and page-faults it on every step (README, "Training on CPUs")."""
    return "BFC" if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").strip().lower() in ("1", "true") else "malloc"


def _hashed_key(process_set, *parts) -> str:
    """A cache key of `parts` and what every cached figure depends on: the host, its CPU, the world
    layout, TensorFlow's and tfcomp's versions, the CPU allocator."""
    layout = [hvd.size(), hvd.local_size(), hvd.cross_size(), process_set.size()]
    parts = [platform.node(), platform.machine(), platform.processor(), str(os.cpu_count()), str(layout),
             tf.__version__, _tfcomp_version(), cpu_allocator(), *parts]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def _tfcomp_version() -> str:
    from tfcomp.version import __version__

    return __version__


def _cache_path():
    setting = os.environ.get(CACHE_ENV, _DEFAULT_CACHE)
    return None if setting.strip().lower() in ("", "none", "off") else os.path.expanduser(setting)


_CACHE_FORMAT, _CACHE_VERSION = "tfcomp calibration cache", 2
# The file's sections: calibration figures by `cache_key`, gradients' ready times by `_ready_key`.
_CACHE_SECTIONS = ("entries", "ready_times")
_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}


def _cache_content(path) -> dict:
    """The cache file at `path` as a dict ({} where there is none); a ValueError saying what is
    wrong with a file that is not a cache of this format and version."""
    try:
        with open(path, encoding="utf-8") as f:
            content = json.load(f)
    except FileNotFoundError:
        return {}
    except OSError as error:
        raise ValueError(f"cannot be read ({error.strerror or error})") from None
    except (ValueError, RecursionError) as error:  # not JSON, not UTF-8, nested too deep
        raise ValueError(f"is not JSON ({error})") from None
    if not isinstance(content, dict):
        raise ValueError(f"holds a JSON {_JSON_TYPES.get(type(content), '?')}, not a cache object")
    format_, version = content.get("format"), content.get("version")
    if format_ != _CACHE_FORMAT or version != _CACHE_VERSION or isinstance(version, bool):
        raise ValueError(f"is not a {_CACHE_FORMAT!r} of version {_CACHE_VERSION} (format "
                         f"{reprlib.repr(format_)}, version {reprlib.repr(version)})")
    for section in _CACHE_SECTIONS:
        if not isinstance(content.get(section, {}), dict):
            raise ValueError(f"has {section} that are a JSON {_JSON_TYPES.get(type(content.get(section)), '?')}, "
                             "not an object")
    if "entries" not in content:
        raise ValueError("has entries that are a JSON null, not an object")
    return content


def _cache_entries(path) -> dict:
    """{key: entry} of the calibration figures in the cache file at `path` (see `_cache_content`)."""
    return _cache_content(path).get("entries", {})


def _cache_entry_model(entry, workers=None) -> ClusterModel:
    """The figures of a cache entry, checked (`ClusterModel.from_list`, and `workers` where given);
    a ValueError saying what is wrong otherwise."""
    if not isinstance(entry, dict) or not isinstance(entry.get("figures"), list):
        raise ValueError(f"is not an object with a list of figures: {reprlib.repr(entry)}")
    model = ClusterModel.from_list(entry["figures"])
    if workers is not None and model.workers != workers:
        raise ValueError(f"has figures for {model.workers} workers, this job has {workers}")
    return model


def _report_cache(path, problem: str) -> None:
    """One warning line (absl logging)."""
    logging.warning("%s", " ".join(f"tfcomp: calibration cache {path}: {problem}".split()))


def _read_cache(path, key, workers=None):
    """(figures, complete) cached for `key` (for `workers` workers where given; `complete` False
    for the lower bounds of a first stage that found compression could not pay, and for entries
    written before that was recorded), or None: where there are none, and where the file or the
    entry is unusable (corrupt, of another format or version, of the wrong shape, absurd figures,
    another worker count), which is reported in one line on stderr; the caller measures again and
    `_write_cache` replaces it."""
    try:
        entry = _cache_entries(path).get(key)
    except ValueError as error:
        _report_cache(path, f"{error}; ignored, measuring again (the file will be rewritten, this one kept as "
                            f"{path}.bad)")
        return None
    try:
        return None if entry is None else (_cache_entry_model(entry, workers), entry.get("complete") is True)
    except ValueError as error:
        _report_cache(path, f"entry {key}: {error}; ignored, measuring again")
        return None


def _write_cache(path, key, model: ClusterModel, complete: bool = True) -> None:
    """Adds (or replaces) `key`'s entry (`complete`: see `_read_cache`), keeping the other usable
    entries (`_rewrite_cache`)."""
    _rewrite_cache(path, "entries", key, {"figures": model.validate().to_list(), "complete": bool(complete)})


def _rewrite_cache(path, section: str, key, value: dict) -> None:
    """Sets `key` of the file's `section` to `value` (with the host and the time added), keeping
    the other usable entries of both sections. Atomic: the file is written beside the old one and
    renamed over it, so a killed job leaves the old file or the new one. A file that is not a usable
    cache is kept as `<path>.bad`. Failures are reported, not raised (a read-only home must not stop
    training)."""
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        try:
            content, unusable = _cache_content(path), False
        except ValueError:
            content, unusable = {}, True
        kept = {"entries": {}, "ready_times": {}}
        for other, entry in content.get("entries", {}).items():
            with contextlib.suppress(ValueError):
                _cache_entry_model(entry)
                kept["entries"][other] = entry
        for other, entry in content.get("ready_times", {}).items():
            with contextlib.suppress(ValueError):
                _ready_entry_seconds(entry)
                kept["ready_times"][other] = entry
        kept[section][key] = {**value, "host": platform.node(), "time": time.time()}
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump({"format": _CACHE_FORMAT, "version": _CACHE_VERSION, **kept}, f, indent=1, allow_nan=False)
            f.flush()
            os.fsync(f.fileno())
        if unusable and os.path.isfile(path):
            os.replace(path, f"{path}.bad")
        os.replace(temporary, path)
    except (OSError, ValueError) as error:
        _report_cache(path, f"could not be written: {error}")
    finally:
        with contextlib.suppress(OSError):
            os.remove(temporary)


def _ready_key(process_set, tensor_elements) -> str:
    """What cached ready times depend on: the host, its CPU, the world layout, TensorFlow's and
    tfcomp's versions, and the gradients' exact sizes in backprop order (the model)."""
    return _hashed_key(process_set, str([int(n) for n in tensor_elements]))


def _ready_entry_seconds(entry, count=None) -> list:
    """The ready times of a cache entry (floats in [0, 1 hour), `count` of them where given); a
    ValueError saying what is wrong otherwise."""
    seconds = entry.get("seconds") if isinstance(entry, dict) else None
    if not isinstance(seconds, list) or not all(
            isinstance(t, (int, float)) and not isinstance(t, bool) and 0.0 <= t < 3600.0 for t in seconds):
        raise ValueError(f"is not an object with a list of ready times in seconds: {reprlib.repr(entry)}")
    if count is not None and len(seconds) != count:
        raise ValueError(f"has {len(seconds)} ready times for {count} gradients")
    return [float(t) for t in seconds]


def cached_ready_times(process_set, tensor_elements):
    """The gradients' ready times (seconds from the first, one per tensor of `tensor_elements`, in
    backprop order) that `store_ready_times` kept from an earlier job of the same model on the same
    hosts, rank 0's on every rank; None where there are none (or the cache is off). Every rank of
    `process_set` must call it at the same point (one broadcast). An unusable entry is reported in
    one line and ignored."""
    count = len(tensor_elements)
    path = _cache_path()
    seconds = None
    if path and process_set.rank() == 0 and count:
        key = _ready_key(process_set, tensor_elements)
        try:
            entry = _cache_content(path).get("ready_times", {}).get(key)
            seconds = None if entry is None else _ready_entry_seconds(entry, count)
        except ValueError as error:
            _report_cache(path, f"ready times {key}: {error}; ignored")
    if process_set.size() > 1:
        sent = tf.constant([0.0 if seconds is None else 1.0] + (seconds or [0.0] * count), tf.float64)
        shared = hvd.broadcast(sent, 0, process_set=process_set, name="tfcomp_cached_ready_times").numpy()
        seconds = [float(t) for t in shared[1:]] if shared[0] == 1.0 else None
    return seconds


def store_ready_times(process_set, tensor_elements, ready_seconds) -> None:
    """Keeps `ready_seconds` (one per tensor of `tensor_elements`, backprop order; measured in
    training, the same on every rank) for later jobs of the same model on the same hosts
    (`cached_ready_times`); rank 0 writes, the others do nothing. Nothing where the cache is off."""
    seconds = _ready_entry_seconds({"seconds": [float(t) for t in ready_seconds]}, len(tensor_elements))
    path = _cache_path()
    if path and process_set.rank() == 0:
        _rewrite_cache(path, "ready_times", _ready_key(process_set, tensor_elements), {"seconds": seconds})


def _measure(compressor, process_set, max_elements: int, tensor_elements=(), cached=None):
    """A generator of calibration pieces that returns (this rank's figures, the CompressionFigures
    in them, whether those were measured now): every rank runs the same collectives in the same
    order. The networks are always measured (a link's rate can change from job to job on the same
    hosts); the compression costs are taken from `cached` (rank 0's CompressionFigures from the
    cache; a placeholder on the other ranks, whose figures rank 0's replace) where it is complete,
    or where its lower bounds already make the plan of `tensor_elements` all dense on this network;
    otherwise measured. Where rank 0's lower bounds of the compression costs already make the plan
    all dense, those are the figures (`compression_pieces`'s `could_pay`). So they are where the
    compressor is tried in training (`Compressor.tried_steps`) and even those least costs predict
    a gain below `_CLEAR_GAIN`: the plan they make goes to the trial, which is a truer test of a
    small gain than more probes."""
    network = yield from _measure_networks(process_set, max_elements)
    if available_strategies(compressor) == ("dense",):
        return network, None, False
    tensors = [(i, f"gradient_{i}", int(n)) for i, n in enumerate(tensor_elements or [max_elements])]

    def could_pay(lower: CompressionFigures) -> bool:
        """Rank 0's answer, on every rank: whether measuring the rest could change the plan: the
        plan with compression at its least cost compresses (and, for a compressor tried in
        training, gains at least _CLEAR_GAIN)."""
        could = not lower.fitted
        if not could:
            plan = make_plan(tensors, compressor, lower.apply(network))
            gain = all_dense_time(plan) / max(predicted_exchange_time(plan), 1e-12)
            could = bool(plan.compressed) and (compressor.tried_steps == 0 or gain >= _CLEAR_GAIN)
        return _rank0_value(float(could), process_set) == 1.0

    if cached is not None and (cached.complete or not could_pay(cached)):
        return cached.apply(network), cached, False
    figures = yield from compression_pieces(compressor, process_set.size(), max_elements, tensor_elements, could_pay,
                                            process_set)
    if process_set.rank() == 0 and not figures.complete:
        logging.info("tfcomp: calibration: compression cannot pay clearly on this network even at its least "
                     "cost (%.2f ns per element, %.2f ms fixed): the plan is made from those least costs "
                     "(dense, or tried in training), the other costs not measured",
                     1e9 * figures.encode_decode.c1, 1e3 * figures.fixed)
    elif process_set.rank() == 0 and not figures.fitted:
        logging.warning("tfcomp: calibration: the compression probes' times did not grow with their size (a loaded "
                        "machine); compression is priced at the largest probe's whole time per element, not cached")
    return figures.apply(network), figures, True


def calibrate(compressor, process_set=hvd.global_process_set, max_elements: int = 2**23,
              tensor_elements=()) -> ClusterModel:
    """`calibration_pieces` run at once (as the exchange's first step does, unless calibration was
    deferred to run between training steps): the cluster's `ClusterModel`, rank 0's on every rank."""
    return finish(calibration_pieces(compressor, process_set, max_elements, tensor_elements))


def calibration_pieces(compressor, process_set=hvd.global_process_set, max_elements: int = 2**23,
                       tensor_elements=()):
    """A generator that calibrates the cluster for gradients of `max_elements` float32 in tensors
    of `tensor_elements` (ints in backprop order; empty: unknown), one piece per `next()` (a probe
    graph made or called for the first time, or one round of timed calls: at most about a second
    on 4 workers of this machine at 1 Gbit/s), and returns the cluster's `ClusterModel`, rank 0's
    figures on every rank. Runs eagerly; every rank of `process_set` must advance it at the same
    points (the pieces run collectives): at once (`calibrate`), or between training steps
    (`tfcomp.planner.Planner.calibrate_some`). ValueError for a bad size.

    The networks are measured every time; the compression costs, which depend on the hosts and
    the compressor but not on the network, come from rank 0's cache where it has them (`CACHE_ENV`),
    so that every job after a host's first pays for the network probes only."""
    if max_elements < 1:
        raise ValueError(f"max_elements must be a number of float32 elements >= 1, got {max_elements}")
    if any(n < 0 for n in tensor_elements):
        raise ValueError(f"tensor_elements must be element counts >= 0, got {list(tensor_elements)}")
    return _calibration(compressor, process_set, max_elements, tuple(tensor_elements))


def _calibration(compressor, process_set, max_elements: int, tensor_elements: tuple):
    """The generator of `calibration_pieces`, its arguments checked."""
    workers = process_set.size()
    if workers == 1:
        return ClusterModel.unpriced(1)
    path, key = _cache_path(), cache_key(compressor, process_set, max_elements, tensor_elements)
    entry = _read_cache(path, key, workers) if path and process_set.rank() == 0 else None
    # Rank 0's cached compression figures: 0 none, 1 lower bounds, 2 complete (a placeholder elsewhere).
    found, cached = _rank0_value(0.0 if entry is None else 1.0 + float(entry[1]), process_set), None
    if found:
        cached = CompressionFigures.of(entry[0] if entry is not None else ClusterModel.unpriced(workers), found == 2.0)
    model, figures, measured = yield from _measure(compressor, process_set, max_elements, tensor_elements, cached)
    if measured and figures.fitted and path and process_set.rank() == 0:
        _write_cache(path, key, model, figures.complete)
    shared = hvd.broadcast(tf.constant(model.to_list(), tf.float64), 0, process_set=process_set,
                           name="tfcomp_calibration_figures").numpy()
    if process_set.rank() == 0:
        source = "measured" if measured else ("cached" if figures is not None else "not needed (dense only)")
        # How long it took is the caller's to say: between steps, the time from here to there includes training.
        logging.info("tfcomp: calibration done (compression costs %s)", source)
    return ClusterModel.from_list(np.asarray(shared, dtype=np.float64))
