"""Thin glue that lets stock Horovod run tfcomp's exchange (installed by `import tfcomp`).

Horovod's Keras `DistributedOptimizer` builds its per-step reduction with
`horovod.tensorflow._make_allreduce_grads_fn(...)` and its optimizer class with
`horovod._keras.create_distributed_optimizer(...)`. `install()` wraps both, at run time and without
touching Horovod's files:

  * given a tfcomp compressor, `_make_allreduce_grads_fn` returns a `GradientExchange` instead of
    Horovod's per-tensor allreduce (any other compression goes to Horovod unchanged);
  * `create_distributed_optimizer` validates the arguments, then tracks that exchange on the new
    optimizer (so checkpoints carry the error-feedback residuals).

So `hvd.DistributedOptimizer(opt, compression=tfcomp.DRAGONN())` and
`tfcomp.DistributedOptimizer(opt, compression=tfcomp.DRAGONN())` build the very same optimizer.
`hvd.DistributedGradientTape(tape, compression=tfcomp.DRAGONN())` also runs the exchange.
"""

from __future__ import annotations

import functools

import horovod._keras as horovod_keras_impl
import horovod.tensorflow as hvd

from tfcomp.compressors import Compressor
from tfcomp.exchange import GradientExchange
from tfcomp.version import check_supported_stack

__all__ = ["install", "validate_optimizer_arguments"]

_MARK = "_tfcomp_wrapped"


def validate_optimizer_arguments(optimizer, compression, op) -> None:
    """Raises TypeError / ValueError naming the argument that cannot work with tfcomp."""
    check_supported_stack()
    import tensorflow as tf

    keras_optimizers = (tf.keras.optimizers.Optimizer, tf.keras.optimizers.legacy.Optimizer)
    if not isinstance(optimizer, keras_optimizers):
        raise TypeError(
            "optimizer must be a Keras optimizer (tf.keras.optimizers.Optimizer or "
            f"tf.keras.optimizers.legacy.Optimizer), got {type(optimizer).__module__}.{type(optimizer).__name__}"
        )
    if isinstance(compression, Compressor) and compression.collective != "dense" and op == hvd.Adasum:
        raise ValueError(
            f"op=hvd.Adasum cannot combine the payloads of {compression!r}: Adasum needs dense tensors. "
            "Use op=hvd.Average or hvd.Sum, or compression=tfcomp.NoCompression()"
        )


def install() -> None:
    """Wraps Horovod's factory functions once; calling it again does nothing."""
    original_make = hvd._make_allreduce_grads_fn
    if getattr(original_make, _MARK, False):
        return

    @functools.wraps(original_make)
    def make_allreduce_grads_fn(name, device_dense, device_sparse, compression, sparse_as_dense, op,
                                gradient_predivide_factor, groups, process_set=hvd.global_process_set):
        if not isinstance(compression, Compressor):
            return original_make(name, device_dense, device_sparse, compression, sparse_as_dense, op,
                                 gradient_predivide_factor, groups, process_set=process_set)
        return GradientExchange(compression, op=op, gradient_predivide_factor=gradient_predivide_factor,
                                sparse_as_dense=sparse_as_dense, process_set=process_set, name=name or "tfcomp")

    setattr(make_allreduce_grads_fn, _MARK, True)
    hvd._make_allreduce_grads_fn = make_allreduce_grads_fn

    original_create = horovod_keras_impl.create_distributed_optimizer

    @functools.wraps(original_create)
    def create_distributed_optimizer(keras, optimizer, name, device_dense, device_sparse, compression,
                                     sparse_as_dense, gradient_predivide_factor, op, *args, **kwargs):
        if isinstance(compression, Compressor):
            validate_optimizer_arguments(optimizer, compression, op)
        distributed = original_create(keras, optimizer, name, device_dense, device_sparse, compression,
                                      sparse_as_dense, gradient_predivide_factor, op, *args, **kwargs)
        exchange = getattr(distributed, "_allreduce_grads", None)
        if isinstance(exchange, GradientExchange):
            distributed._track_trackable(exchange, name="tfcomp_exchange", overwrite=True)
        return distributed

    horovod_keras_impl.create_distributed_optimizer = create_distributed_optimizer
