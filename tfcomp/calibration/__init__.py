"""Calibration of the cost model on the running cluster: at start-up, or between the first training steps.

`calibrate(compressor, process_set, max_elements, tensor_elements)` returns a
`tfcomp.cost_model.ClusterModel` of the cluster, rank 0's figures on every rank:

  * the allreduce and allgather networks and the per-tensor cost of the collectives
    (`tfcomp.calibration.network`), measured by every job (the same hosts may be linked at another
    rate tomorrow);
  * what compressed buckets cost (`tfcomp.calibration.compression`), each rank's probes agreed
    (every cost the median of the ranks'), taken from rank 0's cache where it has them
    (`tfcomp.calibration.cache`); in two stages where the caller gives the planner's rule for
    stopping early (`could_pay`, `tfcomp.planning.compression_could_pay`): the smallest and the
    largest compression probe first, which bound the costs from below; where even those least
    costs make compressing not pay (clearly), nothing more is measured.

Everything is timed as training runs it (`tfcomp.calibration.timing`): each call one graph, started
right after a barrier, the probes of a kind interleaved round by round in three blocks, the block
that lies furthest out left out, and the medians taken. The ranks agree through
`tfcomp.collectives` alone (broadcasts of rank 0's decisions and figures, an allgather of the
compression costs, barriers).

Calibration comes in pieces: `calibration_pieces` is a generator whose every `next()` runs one
piece (a probe graph made, or called for the first time, which traces it; or one round of timed
calls) and which returns the figures. `calibrate` runs it at once (the first step of an exchange
with a forced strategy does); an exchange that the cost model plans runs a few pieces between
training steps instead, its first steps sending everything dense, so that no step waits for the
whole of it (`tfcomp.controller.PlanController.calibrate_step`, which `tfcomp.keras.Replan` calls).
"""

from __future__ import annotations

import horovod.tensorflow as hvd
from absl import logging

from tfcomp.calibration.cache import (CACHE_ENV, cache_key, cache_path, cached_dense_verdict, cached_ready_times,
                                      cpu_allocator, read_cache, store_dense_verdict, store_ready_times, write_cache)
from tfcomp.calibration.compression import (CompressionFigures, compression_pieces, cost_settings,
                                            measure_compression)
from tfcomp.calibration.network import measure_networks
from tfcomp.calibration.timing import finish
from tfcomp.collectives import broadcast_floats
from tfcomp.cost_model import ClusterModel

__all__ = ["CACHE_ENV", "CompressionFigures", "cache_key", "cached_dense_verdict", "cached_ready_times", "calibrate",
           "calibration_pieces", "compression_pieces", "cost_settings", "cpu_allocator", "finish", "measure_compression",
           "store_dense_verdict", "store_ready_times"]


def _measure(compressor, process_set, max_elements: int, tensor_elements=(), cached=None, could_pay=None):
    """A generator of calibration pieces that returns (this rank's figures, the CompressionFigures
    in them, whether those were measured now): every rank runs the same collectives in the same
    order. The networks are always measured (a link's rate can change from job to job on the same
    hosts); the compression costs are taken from `cached` (rank 0's CompressionFigures from the
    cache; a placeholder on the other ranks, whose figures rank 0's replace) where it is complete,
    or where its lower bounds cannot pay on this network; otherwise measured, and where the lower
    bounds of the first probes cannot pay, those are the figures. Whether lower bounds could pay is
    the caller's `could_pay` (a callable: given the cluster with compression at those least costs,
    whether compressing could pay on it; None: measure every cost), rank 0's answer on every rank."""
    network = yield from measure_networks(process_set, max_elements)
    if not compressor.collective.compresses:
        return network, None, False

    def rank0_could_pay(lower: CompressionFigures) -> bool:
        """Rank 0's answer, on every rank: whether measuring the rest could change the plan (also
        where the lower bounds were not fitted, and so bound nothing)."""
        could = not lower.fitted or could_pay is None or could_pay(lower.apply(network))
        return broadcast_floats([float(could)], process_set, "tfcomp_calibration_decision")[0] == 1.0

    if cached is not None and (cached.complete or not rank0_could_pay(cached)):
        return cached.apply(network), cached, False
    figures = yield from compression_pieces(compressor, process_set.size(), max_elements, tensor_elements,
                                            rank0_could_pay, process_set)
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
              tensor_elements=(), could_pay=None) -> ClusterModel:
    """`calibration_pieces` run at once (as the first step of an exchange with a forced strategy
    does): the cluster's `ClusterModel`, rank 0's on every rank."""
    return finish(calibration_pieces(compressor, process_set, max_elements, tensor_elements, could_pay))


def calibration_pieces(compressor, process_set=hvd.global_process_set, max_elements: int = 2**23,
                       tensor_elements=(), could_pay=None):
    """A generator that calibrates the cluster for gradients of `max_elements` float32 in tensors
    of `tensor_elements` (ints in backprop order; empty: unknown), one piece per `next()` (a probe
    graph made or called for the first time, or one round of timed calls: at most about a second
    on 4 workers of this machine at 1 Gbit/s), and returns the cluster's `ClusterModel`, rank 0's
    figures on every rank. Runs eagerly; every rank of `process_set` must advance it at the same
    points (the pieces run collectives): at once (`calibrate`), or between training steps
    (`tfcomp.planner.Planner.calibrate_some`). ValueError for a bad size.

    `could_pay`: the planner's rule for stopping early (`tfcomp.planning.compression_could_pay`),
    a callable that, given the cluster with the networks measured and compression at the least
    costs its smallest and largest probes allow, says whether compressing could pay on it; where it
    says no on rank 0, no further cost is measured (those lower bounds are the figures: on a fast
    network calibration takes a fraction of the time). None: every cost is measured.

    The networks are measured every time; the compression costs, which depend on the hosts and
    the compressor but not on the network, come from rank 0's cache where it has them (`CACHE_ENV`),
    so that every job after a host's first pays for the network probes only."""
    if max_elements < 1:
        raise ValueError(f"max_elements must be a number of float32 elements >= 1, got {max_elements}")
    if any(n < 0 for n in tensor_elements):
        raise ValueError(f"tensor_elements must be element counts >= 0, got {list(tensor_elements)}")
    return _calibration(compressor, process_set, max_elements, tuple(tensor_elements), could_pay)


def _calibration(compressor, process_set, max_elements: int, tensor_elements: tuple, could_pay):
    """The generator of `calibration_pieces`, its arguments checked."""
    workers = process_set.size()
    if workers == 1:
        return ClusterModel.unpriced(1)
    path, key = cache_path(), cache_key(compressor, process_set, max_elements, tensor_elements)
    entry = read_cache(path, key, workers) if path and process_set.rank() == 0 else None
    # Rank 0's cached compression figures: 0 none, 1 lower bounds, 2 complete (a placeholder elsewhere).
    found = broadcast_floats([0.0 if entry is None else 1.0 + float(entry[1])], process_set,
                             "tfcomp_calibration_decision")[0]
    cached = None
    if found:
        cached = CompressionFigures.of(entry[0] if entry is not None else ClusterModel.unpriced(workers), found == 2.0)
    model, figures, measured = yield from _measure(compressor, process_set, max_elements, tensor_elements, cached,
                                                   could_pay)
    if measured and figures.fitted and path and process_set.rank() == 0:
        write_cache(path, key, model, figures.complete)
    shared = broadcast_floats(model.to_list(), process_set, "tfcomp_calibration_figures")
    if process_set.rank() == 0:
        source = "measured" if measured else ("cached" if figures is not None else "not needed (dense only)")
        # How long it took is the caller's to say: between steps, the time from here to there includes training.
        logging.info("tfcomp: calibration done (compression costs %s)", source)
    return ClusterModel.from_list(shared)
