"""`tfcomp.DistributedOptimizer`: Horovod's Keras DistributedOptimizer with a tfcomp compressor.

It validates its arguments, then calls Horovod's own `horovod.tensorflow.keras.DistributedOptimizer`,
which `tfcomp.horovod_glue` has taught to run tfcomp's exchange: both entry points build the same
optimizer and give the same results.
"""

from __future__ import annotations

import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvd_keras

from tfcomp.compressors import DRAGONN, as_compressor
from tfcomp.horovod_glue import validate_optimizer_arguments  # importing the glue installs it

__all__ = ["DistributedOptimizer"]


def DistributedOptimizer(optimizer, compression=None, *, name=None, device_dense="", device_sparse="",  # noqa: N802
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=hvd.Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False, groups=None,
                         process_set=hvd.global_process_set, scale_local_gradients=True):
    """Wraps a Keras optimizer so that gradients are exchanged with tfcomp's compressed exchange.

    Args:
      optimizer: a Keras optimizer (new or legacy); `TypeError` otherwise.
      compression: a tfcomp compressor, or `hvd.Compression.none` / `.fp16`. Default `tfcomp.DRAGONN()`.
      Other arguments: as `horovod.tensorflow.keras.DistributedOptimizer`. `op` must be
        `hvd.Average` or `hvd.Sum` with a sparse or quantising compressor. `groups` applies only to
        Horovod's own path; tfcomp groups every step's payloads into one collective.

    Returns:
      An optimizer of the same class as `optimizer` (so a saved model restores without Horovod).
    """
    compressor = DRAGONN() if compression is None else as_compressor(compression)
    validate_optimizer_arguments(optimizer, compressor, op, gradient_predivide_factor)
    return hvd_keras.DistributedOptimizer(
        optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse, compression=compressor,
        sparse_as_dense=sparse_as_dense, gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, groups=groups, process_set=process_set,
        scale_local_gradients=scale_local_gradients,
    )
