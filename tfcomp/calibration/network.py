"""The network fit of calibration: the allreduce's and the allgather's latency and bandwidth, and
what each tensor adds to the exchange's collectives, measured as training runs them.

Latency from a tiny collective (one float32), bandwidth from a large one (the size of the
gradients, 1 to 16 MiB; an eighth of that, at most 4 MiB, for the allgather), fitted to the ring
formulas of `tfcomp.cost_model`; the per-tensor cost from a graph of 64 one-element allreduces
against one. The probes are Horovod's own collectives, timed (`tfcomp.calibration.timing`); the
figures are rank 0's, shared by `tfcomp.calibration.calibrate`.
"""

from __future__ import annotations

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from tfcomp.calibration.timing import BARRIER_NAME, graph_call, without_outlying_block
from tfcomp.collectives import barrier
from tfcomp.cost_model import AffineCost, ClusterModel, Network

__all__ = ["measure_networks", "network_probe_elements"]

_LARGE_MIN_ELEMENTS = 2**18  # 1 MiB of float32
# 16 MiB: at 1 Gbit/s a ring allreduce of it takes 150 to 220 ms (2 to 4 workers). Smaller, the
# emulated links' token-bucket burst (the first 0.5 MB at 1 Gbit/s, 1 MB at 2 go at once) inflated
# the bandwidth: two workers, 2 Gbit/s links, 2.08 to 2.20 Gbit/s from 4 MiB and 1.75 to 1.81 from
# 16, where larger transfers ran at 1.74 (research/notebook.md), so larger dense exchanges were priced low.
_LARGE_MAX_ELEMENTS = 2**22
_LARGE_ALLGATHER_MAX_ELEMENTS = 2**20  # 4 MiB: the allgather carries compressed payloads
_BOOKKEEPING_TENSORS = 64
_LARGE_PARTS = 4
_LARGE_ROUNDS_ELEMENTS = 2**23  # the large collectives run about a third of this many elements per block (2 to 5 rounds)
_TINY_BYTES = 4.0  # the tiny collectives send one float32
_MIN_TRANSFER_SECONDS = 1e-6  # the least transfer time a fit accepts (a finite bandwidth)


def _fit_network(tiny_seconds: float, large_seconds: float, large_bytes: float, hops: float, bytes_per_hop: float) -> Network:
    """Solves t = hops * (alpha + S_hop / B) from a tiny (one float32) and a large measurement. When
    noise makes the tiny one take nearly as long as the large one (or longer), at least half of the
    larger time is taken as transfer (a lower bandwidth rather than an absurdly high one); figures
    that noise and the subtraction of per-tensor costs made negative still give a valid Network."""
    transfer = max(large_seconds - tiny_seconds, 0.5 * max(large_seconds, tiny_seconds), _MIN_TRANSFER_SECONDS)
    bandwidth = hops * bytes_per_hop * (large_bytes - _TINY_BYTES) / transfer
    latency = max(tiny_seconds / hops - bytes_per_hop * _TINY_BYTES / bandwidth, 0.0)
    return Network(latency, bandwidth)


def network_probe_elements(elements: int) -> tuple:
    """(large allreduce, large allgather) float32 elements for gradients of `elements`: their size
    within 1 MiB .. 16 MiB (a multiple of _LARGE_PARTS), and an eighth of it, within 1 MiB .. 4 MiB,
    for the allgather, whose payloads are compressed."""
    allreduce = min(max(elements, _LARGE_MIN_ELEMENTS), _LARGE_MAX_ELEMENTS) // _LARGE_PARTS * _LARGE_PARTS
    return allreduce, min(max(elements // 8, _LARGE_MIN_ELEMENTS), _LARGE_ALLGATHER_MAX_ELEMENTS)


def measure_networks(process_set, elements: int):
    """A generator of calibration pieces that returns the `ClusterModel` of the collectives for
    this process set (no compression figures), timed as
    training runs them (in a graph, the workers synchronised just before): latency from one float32,
    bandwidth from `elements` float32 (the gradients' size, within 1 MiB .. 16 MiB, as 4 tensors
    that Horovod fuses) for the allreduce and an eighth of that for the allgather, whose payloads
    are compressed; and what each tensor adds from 64 one-element allreduces against one."""
    k = process_set.size()

    def allreduces(tensors, name):
        return graph_call(lambda: [hvd.allreduce(t * 1.0, op=hvd.Sum, process_set=process_set, name=f"{name}_{i}")
                                    for i, t in enumerate(tensors)])

    def allgather(tensor, name):
        return graph_call(lambda: [hvd.allgather(tensor * 1.0, process_set=process_set, name=name)])

    synchronise = barrier(process_set, BARRIER_NAME)
    tiny_allreduce = allreduces([tf.ones([1])], "tfcomp_calibration_tiny")
    tiny_allgather = allgather(tf.ones([1]), "tfcomp_calibration_tiny_allgather")
    # Per-tensor cost: separate allreduces in one graph, the way Horovod's optimizer sends dense
    # gradients (one allreduce each, fused by Horovod; the exchange's grouped allreduce pays less).
    small = {
        "one_float_allreduce": tiny_allreduce,
        "one_float_allgather": tiny_allgather,
        "tensors": allreduces([tf.fill([1], float(i)) for i in range(_BOOKKEEPING_TENSORS)], "tfcomp_calibration_tensor"),
    }
    ar_elements, ag_elements = network_probe_elements(elements)
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
    t = yield from without_outlying_block([(small, 5), (large, large_rounds)], synchronise, warmup=3)
    per_tensor = max(np.median(t["tensors"] - t["one_float_allreduce"]), 0.0) / (_BOOKKEEPING_TENSORS - 1)
    # Transfer times, each large collective against the tiny one of its round; the cost model adds
    # per_tensor for every tensor of a dense bucket, so it comes out of the allreduce's figures.
    tiny_ar, tiny_ag = np.median(t["one_float_allreduce"]) - per_tensor, np.median(t["one_float_allgather"])
    large_ar = tiny_ar + np.median(t["large_allreduce"] - t["tiny_allreduce"]) - (_LARGE_PARTS - 1) * per_tensor
    large_ag = tiny_ag + np.median(t["large_allgather"] - t["tiny_allgather"])
    # ring allreduce: 2 (K-1) hops of S/K bytes; ring allgather: K-1 hops of S bytes.
    return ClusterModel(k, _fit_network(float(tiny_ar), float(large_ar), 4.0 * ar_elements, 2 * (k - 1), 1.0 / k),
                        _fit_network(float(tiny_ag), float(large_ag), 4.0 * ag_elements, k - 1, 1.0),
                        AffineCost(0.0, 0.0), float(per_tensor))
