"""Thin glue that lets stock Horovod run tfcomp's exchange, installed when this module is imported:
on the first use of a compressor or the optimizer through the `tfcomp` package, or as soon as
Horovod's TensorFlow package is imported after `import tfcomp` (see `tfcomp/__init__.py`).

Importing this module first checks that the installed Horovod is one tfcomp supports
(`SUPPORTED_HOROVOD`), with an error that says what is installed and what to install.

Horovod's `DistributedOptimizer`s (Keras and TF2) and `DistributedGradientTape` build their per-step
reduction with a private factory of `horovod.tensorflow`, and the Keras optimizer class with one of
`horovod._keras` (both named in `HOROVOD_HOOKS`, the only place tfcomp names them). `install()` wraps
both, at run time and without touching Horovod's files or classes; the wrappers bind Horovod's
arguments by the wrapped function's own signature and pass them on unchanged:

  * given a tfcomp compressor, the reduction factory returns a `GradientExchange` instead of
    Horovod's per-tensor allreduce (Horovod's own compressors go to Horovod unchanged), handing it
    Horovod's own function for the same arguments (`horovod_reduction`), which the exchange runs
    whenever its plan sends everything dense. An
    optimizer gets an exchange of its own; tapes, which Horovod's examples build anew in every step
    and every trace, share one exchange per setting (as Horovod caches its function), so the plan
    is made once and the residuals and step counter carry over from step to step;
  * the optimizer factory validates the arguments, then tracks that exchange's state on the new
    optimizer (so checkpoints carry the error-feedback residuals and the step).

A tfcomp compressor class or a string given as `compression`, an optimizer built inside a
`tf.distribute` strategy scope, and TF1 graph mode are refused at construction.
`tfcomp.exchange_of(optimizer_or_tape)` is the public way to reach an exchange (its `describe()`, its
`state` for a `tf.train.Checkpoint` of a custom loop).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect

from packaging import version

__all__ = ["HOROVOD_HOOKS", "HOROVOD_REDUCTION_ATTRIBUTE", "INSTALL_HOROVOD", "SUPPORTED_HOROVOD",
           "check_supported_horovod", "exchange_of", "horovod_reduction", "install", "validate_optimizer_arguments"]

SUPPORTED_HOROVOD = (">=0.28", "<0.29")  # built and tested with 0.28.1
INSTALL_HOROVOD = ("HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 "
                   "HOROVOD_WITHOUT_MXNET=1 CMAKE_POLICY_VERSION_MINIMUM=3.5 "
                   "pip install --no-build-isolation horovod==0.28.1")


def check_supported_horovod(installed: str | None = None) -> None:
    """Raises RuntimeError unless Horovod `installed` (default: the installed distribution's version)
    is within `SUPPORTED_HOROVOD`; the message says what is installed, what is supported and the
    command that installs a supported one."""
    if installed is None:
        try:
            installed = importlib.metadata.version("horovod")
        except importlib.metadata.PackageNotFoundError:
            installed = None
    found = "no Horovod is installed" if installed is None else f"Horovod {installed} is installed"
    low, high = (version.parse(bound.lstrip("<>=")) for bound in SUPPORTED_HOROVOD)
    if installed is None or not low <= version.parse(installed) < high:
        raise RuntimeError(
            f"tfcomp supports Horovod {','.join(SUPPORTED_HOROVOD)} (built and tested with 0.28.1); {found}. "
            f"Install Horovod 0.28.1 built with Gloo and TensorFlow, against the TensorFlow you run: {INSTALL_HOROVOD} "
            "(as scripts/setup.sh does)")


check_supported_horovod()  # before anything imports Horovod's TensorFlow package, whose import may fail otherwise

import horovod.tensorflow as hvd  # noqa: E402  (after the version check)
import tensorflow as tf  # noqa: E402

# tfcomp.exchange is imported by the calls that need it, not here: `import tfcomp` installs this glue as soon as
# Horovod's TensorFlow package is imported, which may be from inside the imports of tfcomp.exchange or of a module
# it imports (tfcomp.collectives, tfcomp.step, ...).
from tfcomp.compressors import FP16, Compressor, check_compression  # noqa: E402
from tfcomp.version import check_supported_stack  # noqa: E402

# Horovod 0.28's private hooks that tfcomp wraps: (module, function, the parameters the wrapper reads).
HOROVOD_HOOKS = {
    "reduction": ("horovod.tensorflow", "_make_allreduce_grads_fn",
                  ("name", "device_dense", "device_sparse", "compression", "sparse_as_dense", "op",
                   "gradient_predivide_factor", "groups", "process_set")),
    "keras_optimizer": ("horovod._keras", "create_distributed_optimizer",
                        ("optimizer", "compression", "gradient_predivide_factor", "op")),
}
# Where Horovod 0.28's optimizers and tapes keep the reduction the factory made (the exchange, with tfcomp).
HOROVOD_REDUCTION_ATTRIBUTE = "_allreduce_grads"
_TAPE_NAME = "DistributedGradientTape"  # the name Horovod's tapes give the reduction factory
_MARK = "_tfcomp_wrapped"
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
    from tfcomp.exchange import check_predivide_factor, check_tf2_mode

    check_tf2_mode()
    _check_no_strategy()
    if compression.collective.compresses and op == hvd.Adasum:
        raise ValueError(
            f"op=hvd.Adasum cannot combine the payloads of {compression!r}: Adasum needs dense tensors. "
            "Use op=hvd.Average or hvd.Sum, or compression=tfcomp.NoCompression()"
        )
    check_predivide_factor(gradient_predivide_factor)


def horovod_reduction(compressor: Compressor, *, name: str, sparse_as_dense: bool, op, gradient_predivide_factor: float,
                      process_set, device_dense: str = "", device_sparse: str = "", groups=None):
    """Horovod's own "allreduce grads" function (what its reduction factory, `HOROVOD_HOOKS`'
    "reduction", builds; a `tf.function` where built eagerly, as Horovod's is) for these arguments,
    with `compression` hvd.Compression.fp16 for `tfcomp.FP16()` and hvd.Compression.none for any
    other tfcomp compressor: what Horovod's optimizer or tape would run for `compressor`'s
    gradients sent dense. Horovod caches it per arguments, so its optimizer and tfcomp's exchange
    of the same arguments share one function."""
    module_name, function_name, _ = HOROVOD_HOOKS["reduction"]
    make = inspect.unwrap(getattr(importlib.import_module(module_name), function_name))
    compression = hvd.Compression.fp16 if isinstance(compressor, FP16) else hvd.Compression.none
    return make(name=name, device_dense=device_dense, device_sparse=device_sparse, compression=compression,
                sparse_as_dense=sparse_as_dense, op=op, gradient_predivide_factor=gradient_predivide_factor,
                groups=groups, process_set=process_set)


def _groups_key(groups):
    """`groups` (None, a number, or lists of variables) as a hashable key."""
    if isinstance(groups, list):
        return tuple(tuple(v.ref() for v in group) for group in groups)
    return groups


def _exchange(given: dict):
    """A new `GradientExchange` for an optimizer, for the reduction factory's arguments `given` (by
    name); for a tape, the one exchange of its settings (all of them: each changes Horovod's own
    function, which the exchange runs for all-dense plans)."""
    from tfcomp.exchange import GradientExchange

    _check_no_strategy()
    compression, name = given["compression"], given["name"]
    settings = {"op": given["op"], "gradient_predivide_factor": given["gradient_predivide_factor"],
                "sparse_as_dense": given["sparse_as_dense"], "process_set": given["process_set"]}

    def make():
        reduction = horovod_reduction(compression, name=name, device_dense=given["device_dense"],
                                      device_sparse=given["device_sparse"], groups=given["groups"], **settings)
        return GradientExchange(compression, name=name or "tfcomp", dense_reduction=reduction, **settings)

    if name != _TAPE_NAME:
        return make()
    key = (compression, given["op"], float(given["gradient_predivide_factor"]), bool(given["sparse_as_dense"]),
           given["process_set"].process_set_id, given["device_dense"], given["device_sparse"],
           _groups_key(given["groups"]))
    if key not in _tape_exchanges:
        _tape_exchanges[key] = make()
    return _tape_exchanges[key]


def _binder(hook: str):
    """(module, the hook's function, a function of (args, kwargs) that gives its arguments by name,
    defaults filled in). RuntimeError where this Horovod's function lacks a parameter tfcomp reads."""
    module_name, function_name, reads = HOROVOD_HOOKS[hook]
    module = importlib.import_module(module_name)
    function = getattr(module, function_name)
    signature = inspect.signature(function)
    missing = [p for p in reads if p not in signature.parameters]
    if missing:
        raise RuntimeError(f"tfcomp cannot wrap {module_name}.{function_name}{signature} of Horovod "
                           f"{importlib.metadata.version('horovod')}: it has no parameter {', '.join(missing)}. "
                           f"Install a supported Horovod: {INSTALL_HOROVOD}")

    def arguments(args, kwargs) -> dict:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return bound.arguments

    return module, function, arguments


def install() -> None:
    """Wraps Horovod's two factories (`HOROVOD_HOOKS`) once; calling it again does nothing."""
    reduction_module, original_make, reduction_arguments = _binder("reduction")
    if getattr(original_make, _MARK, False):
        return

    @functools.wraps(original_make)
    def make_allreduce_grads_fn(*args, **kwargs):
        given = reduction_arguments(args, kwargs)
        if not isinstance(check_compression(given["compression"]), Compressor):
            return original_make(*args, **kwargs)
        return _exchange(given)

    keras_module, original_create, keras_arguments = _binder("keras_optimizer")

    @functools.wraps(original_create)
    def create_distributed_optimizer(*args, **kwargs):
        given = keras_arguments(args, kwargs)
        validate_optimizer_arguments(given["optimizer"], given["compression"], given["op"],
                                     given["gradient_predivide_factor"])
        distributed = original_create(*args, **kwargs)
        if isinstance(given["compression"], Compressor):
            exchange = exchange_of(distributed)
            distributed._track_trackable(exchange, name="tfcomp_exchange", overwrite=True)
            exchange.serve_keras_optimizer(distributed)
        return distributed

    for wrapper in (make_allreduce_grads_fn, create_distributed_optimizer):
        setattr(wrapper, _MARK, True)
    setattr(reduction_module, HOROVOD_HOOKS["reduction"][1], make_allreduce_grads_fn)
    setattr(keras_module, HOROVOD_HOOKS["keras_optimizer"][1], create_distributed_optimizer)


def exchange_of(distributed):
    """The tfcomp exchange behind a distributed optimizer or tape built with a tfcomp compressor
    (or `distributed` itself, if it is one), also behind a Keras `LossScaleOptimizer`
    (mixed_float16) wrapping such an optimizer. Its `state` holds the residuals and step counter
    (give it to a `tf.train.Checkpoint` of a custom loop with a tape); `describe()` tells how each
    gradient is exchanged; `counters` what it sent and how long it took. TypeError for anything
    that runs no tfcomp exchange."""
    from tfcomp.exchange import GradientExchange

    while not isinstance(distributed, GradientExchange) and hasattr(distributed, "inner_optimizer"):
        distributed = distributed.inner_optimizer
    exchange = distributed if isinstance(distributed, GradientExchange) else \
        getattr(distributed, HOROVOD_REDUCTION_ATTRIBUTE, None)
    if not isinstance(exchange, GradientExchange):
        raise TypeError(f"{type(distributed).__name__} does not run a tfcomp exchange: build it with "
                        "compression=<a tfcomp compressor>")
    return exchange


install()
