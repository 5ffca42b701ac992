"""The compression fit of calibration: what compressed buckets cost in the exchange itself.

The compressor's encode+decode time as `c0 + c1 * elements` per bucket, plus per-tensor,
per-merged-element and fixed costs, fitted to the times of compressed buckets in the exchange's own
step graph (accumulate with the residual, encode, local decode, new residual, decode of all K
workers' payloads) with stand-in collectives that send nothing (`LocalCollectives`: every worker's
payload taken to be this one's), every rank at once, at sizes from 2^12 up to the largest bucket (at
most 2^22); for the sparsifiers, what the partitioned allreduce's and AR-Topk's work adds per payload
slot. In two stages where the caller gives a `could_pay` test: the smallest and the largest probe
first, which bound the costs from below; where compression could not pay even at those least costs,
nothing more is measured. The ranks' figures are agreed through `tfcomp.collectives` (every cost the
median of the ranks').
"""

from __future__ import annotations

import copy
import dataclasses
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tfcomp.calibration.timing import BARRIER_NAME, finish, graph_call, without_outlying_block
from tfcomp.collectives import LocalCollectives, allgather_rows, barrier
from tfcomp.compressors import DEFAULT_MIN_ELEMENTS, DEFAULT_TRIAL_STEPS, DEFAULT_UNION_LIMIT
from tfcomp.cost_model import AffineCost, ClusterModel, StrategyTime
from tfcomp.memory import ExchangeState
from tfcomp.planning import Bucket, Plan
from tfcomp.step import StepGraph
from tfcomp.strategies import STRATEGIES

__all__ = ["CompressionFigures", "compression_pieces", "cost_settings", "largest_compression_probe",
           "measure_compression", "merge_probe"]

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


def _per_slot_probes(compressor) -> tuple:
    """The compressor's strategies that have a probe of their own (`Strategy.per_slot_field`: the
    sparsifiers' partitioned allreduce and AR-Topk), timed at the largest size beside its own
    collective: what their work adds per payload slot."""
    return tuple(strategy for strategy in compressor.strategies if strategy.per_slot_field is not None)


def merge_probe(largest: int, tensor_elements=()) -> tuple:
    """The tensor sizes of the merge probe's one bucket: the gradients' own (`tensor_elements`,
    ints), where they are 2 to 512 tensors, none empty, of 2^16 to 2^22 elements in all, since what
    a bucket of many tensors costs beyond its per-tensor costs grows faster than its elements (its
    working set leaves the cache); otherwise `largest` elements as 8 tensors."""
    sizes = tuple(int(n) for n in tensor_elements)
    (fewest, most), (least, greatest) = _OWN_MERGE_PROBE_TENSORS, _OWN_MERGE_PROBE_ELEMENTS
    if fewest <= len(sizes) <= most and least <= sum(sizes) <= greatest and min(sizes) >= 1:
        return sizes
    return (largest // 8,) * 7 + (largest - 7 * (largest // 8),)


def largest_compression_probe(max_elements: int) -> int:
    """The largest compression probe, in float32 elements: the gradients' size, but at least 2^20
    (so that the slope stands out of the noise) and at most 2^22."""
    return min(max(max_elements, _MIN_LARGEST_PROBE), _ENCODE_SIZES[-1])


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
    strategy = strategy or compressor.collective
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
    return graph_call(lambda: step(plan, gradients, variables, runtime))


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
    per_slot = {strategy.per_slot_field: float(np.median(seconds[strategy] - seconds[largest])) / slots
                for strategy in STRATEGIES.values() if strategy.per_slot_field is not None and strategy in seconds}
    return CompressionFigures(AffineCost(float(per_bucket), single.c1), float(per_tensor), float(merge), float(fixed),
                              bool(fitted), True, **per_slot)


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
    per-tensor costs; where the gradients are too few or too large for that (`merge_probe`), the
    largest size as 8 tensors, measured at the size of the largest bucket, where merging costs the
    most. For the sparsifiers, the largest size also with the partitioned allreduce and with
    AR-Topk: what each one's work adds to the allgather's probe, per payload slot, signed.

    With `could_pay` (a callable that every rank calls at once: given `_lower_bound_figures`,
    whether compression could pay with costs that low), the smallest and the largest probe are
    timed first; where it says no, those lower bounds are returned (`complete` False) and nothing
    more is measured: no further cost could make compression pay."""
    compressor = cost_settings(compressor)
    largest = largest_compression_probe(max_elements)
    merged = merge_probe(largest, tensor_elements)
    sizes = sorted({_ENCODE_SIZES[0], _PER_TENSOR_PROBE_ELEMENTS, largest, sum(merged)})
    small = sizes[0]
    plans = {**{n: [[n]] for n in sizes}, "buckets": [[small]] * _BUCKETS_PROBE_BUCKETS,
             "many": [[_PER_TENSOR_PROBE_ELEMENTS // _PER_TENSOR_PROBE_TENSORS] * _PER_TENSOR_PROBE_TENSORS],
             "merged": [list(merged)]}
    own_probes = _per_slot_probes(compressor)
    for strategy in own_probes:
        plans[strategy] = [[largest]]
    probes = {}
    for name, buckets in plans.items():
        probes[name] = _exchange_probe(compressor, num_workers, buckets, name if name in own_probes else None)
        yield
    synchronise = None if process_set is None else barrier(process_set, BARRIER_NAME)
    # Short calls are noisy and cheap, long ones steadier and costly: each set its own rounds (the
    # differences taken below are of probes in the same set, paired round by round).
    long_rounds = min(_SHORT_PROBE_ROUNDS, max(_LONG_PROBE_ROUNDS, _LONG_PROBE_ROUNDS * _ENCODE_SIZES[-1] // largest))

    def timed(names) -> dict:
        sets = []
        for long_calls, rounds in ((False, _SHORT_PROBE_ROUNDS), (True, long_rounds)):
            chosen = {name: probes[name] for name in names
                      if (sum(map(sum, plans[name])) >= _MIN_LARGEST_PROBE) == long_calls}
            sets += [(chosen, rounds)] if chosen else []
        return (yield from without_outlying_block(sets, synchronise))

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
    as the jobs' own speed, research/notebook.md), `fitted` rank 0's (its decisions follow it),
    `complete` alike on every rank. Every rank of `process_set` must call it at once."""
    costs = [figures.encode_decode.c0, figures.encode_decode.c1, figures.per_tensor, figures.merge_per_element,
             figures.fixed, figures.partitioned_per_slot, figures.artopk_per_slot]
    gathered = allgather_rows([tf.constant([*costs, float(figures.fitted)], tf.float64)], process_set,
                              "tfcomp_calibration_compression_figures")[0].numpy()
    c0, c1, per_tensor, merge, fixed, partitioned, artopk = (float(x) for x in np.median(gathered[:, :-1], axis=0))
    return CompressionFigures(AffineCost(c0, c1), per_tensor, merge, fixed, bool(gathered[0, -1]), figures.complete,
                              partitioned, artopk)
