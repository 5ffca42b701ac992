"""Calibration of the cost model on the running cluster, at start-up, in a few seconds.

`calibrate(compressor, process_set, max_elements)` returns a `tfcomp.cost_model.ClusterModel`:

  * the allreduce and allgather networks: latency from a tiny collective (one float32), bandwidth
    from a large one (the size of the gradients, 1 to 16 MiB; an eighth of that for the allgather),
    each the median of a few timed runs after a warm-up, fitted to the ring formulas of
    `tfcomp.cost_model`;
  * what each tensor adds to the exchange's collectives (Horovod's per-tensor negotiation and
    bookkeeping), from a graph of 32 one-element allreduces against one;
  * the compressor's encode+decode time as `c0 + c1 * elements` (plus per-tensor and per-merged-
    element costs), fitted to the median times of compressed buckets in the exchange itself
    (accumulate with the residual, encode, local decode, new residual, the real collective,
    decode of all K workers' payloads) less the collective's modelled time, at sizes from 2^12 up
    to the largest bucket (at most 2^23).

Every rank measures (so that the figures include the contention of all workers computing at once),
and rank 0's figures are broadcast, so every rank plans from the same numbers. Rank 0 caches them
in a JSON file (`TFCOMP_CALIBRATION_CACHE`, default `~/.cache/tfcomp/calibration.json`; "none"
turns the cache off) keyed by the machine (rank 0's host name and CPU), the world layout, the
TensorFlow and tfcomp versions and the compressor's settings; a change of any of them measures again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import statistics
import time

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from tfcomp.cost_model import AffineCost, ClusterModel, Network, StrategyTime, available_strategies

__all__ = ["CACHE_ENV", "cache_key", "calibrate", "measure_compression"]

CACHE_ENV = "TFCOMP_CALIBRATION_CACHE"
_DEFAULT_CACHE = os.path.join("~", ".cache", "tfcomp", "calibration.json")
_LARGE_MIN_ELEMENTS = 2**18  # 1 MiB of float32
_LARGE_MAX_ELEMENTS = 2**22  # 16 MiB
_BOOKKEEPING_TENSORS = 32
_LARGE_PARTS = 4
_ENCODE_SIZES = (2**12, 2**17, 2**20, 2**23)
_MIN_LARGEST_PROBE = 2**20


def _median_seconds(run, repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _rank0_value(value: float, process_set) -> float:
    """Rank 0's float, on every rank (decisions that change the sequence of collectives must agree)."""
    sent = tf.constant([value], tf.float64)
    return float(hvd.broadcast(sent, 0, process_set=process_set, name="tfcomp_calibration_decision").numpy()[0])


def _fit_network(tiny_seconds: float, large_seconds: float, large_bytes: float, hops: float, bytes_per_hop: float) -> Network:
    """Solves t = hops * (alpha + S_hop / B) from a tiny (S ~ 0) and a large measurement. When
    noise makes the tiny one take nearly as long as the large one, at least half of the large time
    is taken as transfer (a lower bandwidth rather than an absurdly high one)."""
    latency = tiny_seconds / hops
    per_byte = max(large_seconds - tiny_seconds, 0.5 * large_seconds) / (hops * bytes_per_hop * large_bytes)
    return Network(latency, 1.0 / per_byte)


def _measure_networks(process_set, elements: int) -> tuple:
    """(allreduce Network, allgather Network, seconds per tensor) for this process set: latency
    from one float32, bandwidth from `elements` float32 (the gradients' size, within 1 MiB .. 16 MiB,
    as 4 tensors that Horovod fuses) for the allreduce and an eighth of that for the allgather,
    whose payloads are compressed, and
    what each tensor adds from a graph of 32 one-element allreduces against one."""
    k = process_set.size()

    def allreduce(x):
        return lambda: hvd.allreduce(x, op=hvd.Sum, process_set=process_set, name="tfcomp_calibration_allreduce").numpy()

    def allgather(x):
        return lambda: hvd.allgather(x, process_set=process_set, name="tfcomp_calibration_allgather").numpy()

    tiny = tf.ones([1], tf.float32)
    tiny_ar = _median_seconds(allreduce(tiny), repeats=15, warmup=5)
    tiny_ag = _median_seconds(allgather(tiny), repeats=15, warmup=5)
    # Per-tensor cost: one graph with 32 separate allreduces of one float32 against one with one,
    # the way the exchange and Horovod's optimizer send dense gradients (one allreduce each).
    def separate_allreduces(count):
        graph = tf.function(lambda: [hvd.allreduce(tf.fill([1], float(i)), op=hvd.Sum, process_set=process_set,
                                                   name=f"tfcomp_calibration_tensor_{i}") for i in range(count)])
        return lambda: graph()[0].numpy()

    per_tensor = max(_median_seconds(separate_allreduces(_BOOKKEEPING_TENSORS), repeats=15, warmup=3)
                     - _median_seconds(separate_allreduces(1), repeats=15, warmup=3), 0.0) / (_BOOKKEEPING_TENSORS - 1)
    ar_elements = min(max(elements, _LARGE_MIN_ELEMENTS), _LARGE_MAX_ELEMENTS)
    ag_elements = min(max(elements // 8, _LARGE_MIN_ELEMENTS), _LARGE_MAX_ELEMENTS)
    # The large allreduce as training sends gradients: separate tensors that Horovod fuses, so the
    # copies into and out of its fusion buffer are part of the measured bandwidth.
    parts = [tf.random.stateless_normal([ar_elements // _LARGE_PARTS], seed=[7, i]) for i in range(_LARGE_PARTS)]
    fused = tf.function(lambda: [hvd.allreduce(p * 1.0, op=hvd.Sum, process_set=process_set,
                                               name=f"tfcomp_calibration_large_{i}") for i, p in enumerate(parts)])
    large_ar = _median_seconds(lambda: fused()[0].numpy(), repeats=3)
    ar_elements = _LARGE_PARTS * (ar_elements // _LARGE_PARTS)
    large_ag = _median_seconds(allgather(tf.random.stateless_normal([ag_elements], seed=[7, 2])), repeats=3)
    # ring allreduce: 2 (K-1) hops of S/K bytes; ring allgather: K-1 hops of S bytes.
    return (_fit_network(tiny_ar, large_ar, 4.0 * ar_elements, 2 * (k - 1), 1.0 / k),
            _fit_network(tiny_ag, large_ag, 4.0 * ag_elements, k - 1, 1.0), per_tensor)


def _exchange_seconds(compressor, network: ClusterModel, collectives, buckets) -> float:
    """Median seconds of one exchange call whose plan is `buckets` (lists of tensor sizes), each
    compressed with the compressor's own collective, less the communication the cost model gives
    that collective on `network` (nothing with `LocalCollectives`, which send nothing)."""
    from tfcomp.exchange import GradientExchange
    from tfcomp.planning import Bucket, Plan, predicted_exchange_time

    strategy = "allreduce" if compressor.collective == "allreduce" else "allgather"
    sizes = [n for bucket in buckets for n in bucket]
    positions = iter(range(len(sizes)))
    plan = Plan(tuple(Bucket(tuple(next(positions) for _ in bucket), sum(bucket), strategy, StrategyTime(0.0, 0.0), 0.0)
                      for bucket in buckets),
                {i: f"calibration_{i}" for i in range(len(sizes))}, compressor, network)
    exchange = GradientExchange(compressor, plan=plan, collectives=collectives)
    variables = [tf.Variable(tf.zeros([n]), name="calibration") for n in sizes]
    gradients = [tf.random.stateless_normal([n], seed=[11, n]) for n in sizes]
    # With a network whose compression costs are 0, the plan's predicted time is its communication.
    # Small calls are short and Horovod's cycle quantises them: more repeats (the count depends on
    # the sizes only, so every rank runs the collective as often).
    repeats = 15 if sum(sizes) < 2**20 else 5
    return _median_seconds(lambda: exchange(gradients, variables), repeats=repeats, warmup=2) - predicted_exchange_time(plan)


def measure_compression(compressor, num_workers: int, max_elements: int, network: ClusterModel = None,
                        collectives=None) -> tuple:
    """(AffineCost c0 + c1 * elements, seconds per tensor, seconds per merged element): the work of
    compressed buckets in the exchange itself. With `collectives` (Horovod's, on every rank at
    once) and the calibrated `network`, a step's real collective runs and the cost model's
    communication time is subtracted, so the figures include what training sees (both workers
    computing at once, waiting for the slower one); without, `LocalCollectives(num_workers)`.
    c1 is the slope of one-bucket calls at sizes up to max_elements (at least 2^20, at most 2^23);
    c0 is what one more bucket in the same call adds beyond its elements (8 small buckets against
    1), so the fixed cost of calling the exchange is not counted per bucket; the per-tensor cost
    (each tensor's residual update, cast, reshape) is what 64 tiny tensors in one bucket add over
    one tensor of their size; the per-element cost of merging (concatenate, split) is what 8 tensors
    add over one at the largest size, less their per-tensor costs."""
    from tfcomp.exchange import LocalCollectives

    if collectives is None:
        collectives = LocalCollectives(num_workers)
        network = ClusterModel.unpriced(num_workers)
    network = dataclasses.replace(network, encode_decode=AffineCost(0.0, 0.0), compression_per_tensor=0.0,
                                  merge_per_element=0.0)

    def seconds(buckets):
        return _exchange_seconds(compressor, network, collectives, buckets)

    # Up to the gradients' size, but at least 2^20 elements, so that the slope stands out of the noise.
    largest = min(max(max_elements, _MIN_LARGEST_PROBE), _ENCODE_SIZES[-1])
    sizes = sorted({s for s in _ENCODE_SIZES if s < largest} | {largest})
    single = [seconds([[n]]) for n in sizes]
    slope = AffineCost.fit(sizes, single).c1
    small, large = sizes[0], sizes[-1]
    per_bucket = max((seconds([[small]] * 8) - single[0]) / 7 - slope * small, 0.0)
    # 64 tensors in one bucket against 1 of the same small size: 63 per-tensor costs (merging
    # `small` elements is negligible); 8 against 1 at the largest size: 7 of them plus merging.
    per_tensor = max(seconds([[small // 64] * 64]) - single[0], 0.0) / 63
    merge = max(seconds([[large // 8] * 8]) - single[-1] - 7 * per_tensor, 0.0) / large
    return AffineCost(per_bucket, slope), per_tensor, merge


def cache_key(compressor, process_set) -> str:
    """What the cached figures depend on; any change measures again."""
    layout = [hvd.size(), hvd.local_size(), hvd.cross_size(), process_set.size()]
    parts = [platform.node(), platform.machine(), platform.processor(), str(os.cpu_count()), str(layout),
             tf.__version__, _tfcomp_version(), repr(compressor)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def _tfcomp_version() -> str:
    from tfcomp.version import __version__

    return __version__


def _cache_path():
    setting = os.environ.get(CACHE_ENV, _DEFAULT_CACHE)
    return None if setting.strip().lower() in ("", "none", "off") else os.path.expanduser(setting)


def _read_cache(path, key):
    try:
        with open(path) as f:
            entry = json.load(f).get(key)
        return None if entry is None else ClusterModel.from_list(entry["figures"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cache(path, key, model: ClusterModel) -> None:
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        try:
            with open(path) as f:
                entries = json.load(f)
        except (OSError, ValueError):
            entries = {}
        entries[key] = {"figures": model.to_list(), "host": platform.node(), "time": time.time()}
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "w") as f:
            json.dump(entries, f, indent=1)
        os.replace(temporary, path)
    except OSError as error:  # a read-only home must not stop training
        print(f"tfcomp: could not write the calibration cache {path}: {error}", flush=True)


def _measure(compressor, process_set, max_elements: int) -> ClusterModel:
    """This rank's measurements (every rank runs the same collectives in the same order)."""
    from tfcomp.exchange import HorovodCollectives

    allreduce, allgather, per_tensor = _measure_networks(process_set, max_elements)
    network = ClusterModel(process_set.size(), allreduce, allgather, AffineCost(0.0, 0.0), per_tensor)
    if available_strategies(compressor) == ("dense",):
        return network
    compression, compression_per_tensor, merge = measure_compression(
        compressor, process_set.size(), max_elements, network, HorovodCollectives(process_set))
    return ClusterModel(process_set.size(), allreduce, allgather, compression, per_tensor, compression_per_tensor, merge)


def calibrate(compressor, process_set=hvd.global_process_set, max_elements: int = 2**23) -> ClusterModel:
    """The cluster's figures, rank 0's on every rank. Runs eagerly; every rank of `process_set` must
    call it at the same point (the exchange does, on its first step)."""
    workers = process_set.size()
    if workers == 1:
        return ClusterModel.unpriced(1)
    path, key = _cache_path(), cache_key(compressor, process_set)
    cached = _read_cache(path, key) if path and process_set.rank() == 0 else None
    if _rank0_value(0.0 if cached is None else 1.0, process_set) == 0.0:
        model = _measure(compressor, process_set, max_elements)
        if path and process_set.rank() == 0:
            _write_cache(path, key, model)
    else:
        model = cached if cached is not None else ClusterModel.unpriced(workers)  # replaced by rank 0's below
    figures = tf.constant(model.to_list(), tf.float64)
    shared = hvd.broadcast(figures, 0, process_set=process_set, name="tfcomp_calibration_figures").numpy()
    return ClusterModel.from_list(np.asarray(shared, dtype=np.float64))
