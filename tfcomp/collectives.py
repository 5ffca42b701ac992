"""The collectives tfcomp runs, and the one way ranks agree on figures and digests.

`HorovodCollectives` (over a Horovod process set) and `LocalCollectives` (stand-ins that send
nothing, for timing the compression work alone) give the step graph the same interface: grouped
allgather, grouped sum allreduce, broadcast and alltoall, inside or outside a `tf.function`.
`allgather_integers`, `allgather_rows`, `broadcast_floats` and `barrier` run eagerly, outside any
training step, on every rank of a process set at the same point: they are the only way ranks agree
outside the step graph (the plan's agreement checks; calibration's decisions, figures, cached ready
times and barriers; the checkpoint's gathered memory), and the benchmarks' timings use them.
"""

from __future__ import annotations

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

__all__ = ["HorovodCollectives", "LocalCollectives", "allgather_integers", "allgather_rows", "barrier",
           "broadcast_floats", "grouped_by_dtype"]


def grouped_by_dtype(collective, tensors, **kwargs):
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
        return grouped_by_dtype(hvd.grouped_allgather, tensors, process_set=self.process_set)

    def allreduce_sum(self, tensors):
        return grouped_by_dtype(hvd.grouped_allreduce, tensors, op=hvd.Sum, process_set=self.process_set)

    def broadcast(self, tensor, root: int, name: str):
        return hvd.broadcast(tensor, root, process_set=self.process_set, name=name)

    def alltoall(self, tensor, splits):
        """(received, received_splits): rows splits[r] of `tensor`, in order, go to rank r; every
        rank's rows for this one arrive in rank order."""
        return hvd.alltoall(tensor, splits=splits, process_set=self.process_set)


class LocalCollectives:
    """Stand-ins that communicate nothing, for timing the compression work of `size` workers
    (calibration): allgather returns this worker's tensor repeated `size` times, allreduce returns
    it as it is, broadcast returns the tensor, alltoall rank 0's rows repeated `size` times."""

    def __init__(self, size: int):
        self.size, self.rank = size, 0

    def allgather(self, tensors):
        return [tf.concat([t] * self.size, axis=0) for t in tensors]

    def allreduce_sum(self, tensors):
        return [tf.identity(t) for t in tensors]

    def broadcast(self, tensor, root: int, name: str):
        del root, name
        return tf.identity(tensor)

    def alltoall(self, tensor, splits):
        """Rank 0's share of `tensor` (its first splits[0] rows), as if every worker sent the same."""
        mine = tensor[:splits[0]]
        return tf.concat([mine] * self.size, axis=0), tf.fill([self.size], splits[0])

    def included(self) -> bool:
        return True


def allgather_integers(values, process_set, name: str) -> np.ndarray:
    """int64 [ranks, len(values)]: every rank's `values` (ints of at most 63 bits), eagerly."""
    with tf.init_scope():
        mine = tf.constant([list(values)], tf.int64)
        return hvd.allgather(mine, process_set=process_set, name=name).numpy()


def allgather_rows(vectors, process_set, name: str) -> list:
    """For each [n] tensor of `vectors`, [ranks, n]: every rank's, in rank order (one grouped
    allgather, eagerly; every rank must give vectors of the same sizes)."""
    if not vectors:
        return []
    with tf.init_scope():
        rows = [tf.reshape(v, [1, -1]) for v in vectors]
        return grouped_by_dtype(hvd.grouped_allgather, rows, process_set=process_set, name=name)


def broadcast_floats(values, process_set, name: str, root: int = 0) -> np.ndarray:
    """float64 [len(values)]: `root`'s `values` on every rank, eagerly."""
    with tf.init_scope():
        mine = tf.constant(np.asarray(values, dtype=np.float64))
        return np.asarray(hvd.broadcast(mine, root, process_set=process_set, name=name).numpy(), dtype=np.float64)


def barrier(process_set, name: str):
    """A callable that returns once every rank of `process_set` has called it: a one-float
    allreduce named `name`, run eagerly. Not a `tf.function` of an allreduce of a constant: Horovod
    0.28.1 does not mark its ops stateful, so TensorFlow's constant folding runs such an allreduce
    once while it optimizes the graph, and later calls return the folded value without
    communicating (`research/folded_collectives.py` on 2 emulated hosts at 1 Gbit/s: 56 bytes and
    0.053 ms a call, against about 1.7 kB and 1.08 ms for the same allreduce of a captured tensor, a
    variable or run eagerly; research/notebook.md, "Horovod ops on constants are folded"). Making it runs
    nothing (a module may make its barrier before TensorFlow's threads are configured)."""

    def wait() -> None:
        with tf.init_scope():
            hvd.allreduce(tf.zeros([1], tf.float32), op=hvd.Sum, process_set=process_set, name=name).numpy()

    return wait
