"""Thin glue that lets stock Horovod run tfcomp's exchange (installed on the first use of a
compressor or the optimizer through the `tfcomp` package).

Horovod's `DistributedOptimizer`s (Keras and TF2) and `DistributedGradientTape` build their per-step
reduction with `horovod.tensorflow._make_allreduce_grads_fn(...)`, and the Keras optimizer class
with `horovod._keras.create_distributed_optimizer(...)`. `install()` wraps both, at run time and
without touching Horovod's files:

  * given a tfcomp compressor, `_make_allreduce_grads_fn` returns a `GradientExchange` instead of
    Horovod's per-tensor allreduce (Horovod's own compressors go to Horovod unchanged). An
    optimizer gets an exchange of its own; tapes, which Horovod's examples build anew in every step
    and every trace, share one exchange per setting (as Horovod caches its function), so the plan
    is made once and the residuals and step counter carry over from step to step;
  * `create_distributed_optimizer` validates the arguments, then tracks that exchange's state on
    the new optimizer (so checkpoints carry the error-feedback residuals and the step).

A tfcomp compressor class or a string given as `compression`, an optimizer built inside a
`tf.distribute` strategy scope, and TF1 graph mode are refused at construction.
`tfcomp.exchange_of(optimizer_or_tape)` is the public way to reach an exchange (its `describe()`, its
`state` for a `tf.train.Checkpoint` of a custom loop).
"""

from __future__ import annotations

import functools

import horovod._keras as horovod_keras_impl
import horovod.tensorflow as hvd
import tensorflow as tf

from tfcomp.compressors import Compressor, check_compression
from tfcomp.exchange import GradientExchange, check_predivide_factor, check_tf2_mode
from tfcomp.version import check_supported_stack

__all__ = ["install", "validate_optimizer_arguments"]

_MARK = "_tfcomp_wrapped"
_TAPE_NAME = "DistributedGradientTape"  # the name Horovod's tape gives _make_allreduce_grads_fn
_tape_exchanges = {}


def _check_no_strategy() -> None:
    if tf.distribute.has_strategy():
        raise RuntimeError(
            f"tfcomp runs under Horovod, one process per worker (horovodrun), not under a tf.distribute "
            f"strategy: build the optimizer or tape outside {type(tf.distribute.get_strategy()).__name__}'s scope")


def validate_optimizer_arguments(optimizer, compression, op, gradient_predivide_factor=1.0) -> None:
    """Raises TypeError / ValueError / RuntimeError naming the argument that cannot work with tfcomp."""
    check_supported_stack()
    check_compression(compression)
    keras_optimizers = (tf.keras.optimizers.Optimizer, tf.keras.optimizers.legacy.Optimizer)
    if not isinstance(optimizer, keras_optimizers):
        raise TypeError(
            "optimizer must be a Keras optimizer (tf.keras.optimizers.Optimizer or "
            f"tf.keras.optimizers.legacy.Optimizer), got {type(optimizer).__module__}.{type(optimizer).__name__}"
        )
    if not isinstance(compression, Compressor):
        return
    check_tf2_mode()
    _check_no_strategy()
    if compression.collective != "dense" and op == hvd.Adasum:
        raise ValueError(
            f"op=hvd.Adasum cannot combine the payloads of {compression!r}: Adasum needs dense tensors. "
            "Use op=hvd.Average or hvd.Sum, or compression=tfcomp.NoCompression()"
        )
    check_predivide_factor(gradient_predivide_factor)


def _exchange(name, compression, sparse_as_dense, op, gradient_predivide_factor, process_set) -> GradientExchange:
    """A new exchange for an optimizer; for a tape, the one exchange of its settings."""
    _check_no_strategy()
    if name != _TAPE_NAME:
        return GradientExchange(compression, op=op, gradient_predivide_factor=gradient_predivide_factor,
                                sparse_as_dense=sparse_as_dense, process_set=process_set, name=name or "tfcomp")
    key = (compression, op, float(gradient_predivide_factor), bool(sparse_as_dense), process_set.process_set_id)
    if key not in _tape_exchanges:
        _tape_exchanges[key] = GradientExchange(compression, op=op, gradient_predivide_factor=gradient_predivide_factor,
                                                sparse_as_dense=sparse_as_dense, process_set=process_set, name=name)
    return _tape_exchanges[key]


def install() -> None:
    """Wraps Horovod's factory functions once; calling it again does nothing."""
    original_make = hvd._make_allreduce_grads_fn
    if getattr(original_make, _MARK, False):
        return

    @functools.wraps(original_make)
    def make_allreduce_grads_fn(name, device_dense, device_sparse, compression, sparse_as_dense, op,
                                gradient_predivide_factor, groups, process_set=hvd.global_process_set):
        check_compression(compression)
        if not isinstance(compression, Compressor):
            return original_make(name, device_dense, device_sparse, compression, sparse_as_dense, op,
                                 gradient_predivide_factor, groups, process_set=process_set)
        return _exchange(name, compression, sparse_as_dense, op, gradient_predivide_factor, process_set)

    setattr(make_allreduce_grads_fn, _MARK, True)
    hvd._make_allreduce_grads_fn = make_allreduce_grads_fn

    original_create = horovod_keras_impl.create_distributed_optimizer

    @functools.wraps(original_create)
    def create_distributed_optimizer(keras, optimizer, name, device_dense, device_sparse, compression,
                                     sparse_as_dense, gradient_predivide_factor, op, *args, **kwargs):
        validate_optimizer_arguments(optimizer, compression, op, gradient_predivide_factor)
        distributed = original_create(keras, optimizer, name, device_dense, device_sparse, compression,
                                      sparse_as_dense, gradient_predivide_factor, op, *args, **kwargs)
        exchange = getattr(distributed, "_allreduce_grads", None)
        if isinstance(exchange, GradientExchange):
            distributed._track_trackable(exchange, name="tfcomp_exchange", overwrite=True)
            exchange.serve_keras_optimizer(distributed)
            # Horovod's optimizer class is made on the fly in horovod._keras, where Keras cannot find
            # it again: a model saved in the .keras format then loads with the inner optimizer's class.
            type(distributed).__module__ = type(optimizer).__module__
        return distributed

    horovod_keras_impl.create_distributed_optimizer = create_distributed_optimizer
