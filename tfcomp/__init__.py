"""tfcomp: gradient compression that pays in Horovod/Keras data-parallel training.

    import horovod.tensorflow.keras as hvd
    import tfcomp
    hvd.init()
    opt = hvd.DistributedOptimizer(opt, compression=tfcomp.DRAGONN(ratio=0.001))
    # or: opt = tfcomp.DistributedOptimizer(opt, compression=tfcomp.DRAGONN(ratio=0.001))

tfcomp teaches stock Horovod to run tfcomp's exchange for tfcomp compressors (see
`tfcomp.horovod_glue`). `import tfcomp` itself is quick: it loads only the cost model
(`tfcomp.cost_model`, `tfcomp.planning`); the first use of any other public name (a compressor,
`DistributedOptimizer`, `tfcomp.keras`, ...) imports TensorFlow and Horovod and installs that glue,
before the name can reach Horovod. The op library (`tfcomp.ops`) is loaded on the first op call. On
the first step the exchange calibrates the cluster (`tfcomp.calibration`) and plans buckets and
strategies on the cost model (`tfcomp.planning`, `tfcomp.cost_model`); `python -m tfcomp.whatif`
asks the same model about other clusters without importing TensorFlow.
"""

import importlib

from tfcomp import cost_model, planning
from tfcomp.version import __version__

# Public names that need TensorFlow and Horovod, and the modules that define them.
_NAMES = {
    "Compressor": "compressors", "DGC": "compressors", "DRAGONN": "compressors", "EFSignSGD": "compressors",
    "FP16": "compressors", "IntQuant": "compressors", "NoCompression": "compressors", "QSGD": "compressors", "RandomK": "compressors",
    "TopK": "compressors", "DistributedOptimizer": "optimizer", "GradientExchange": "exchange",
    "exchange_of": "exchange",
}
_MODULES = ("calibration", "checkpointing", "counters", "keras", "ops")

__all__ = sorted([*_NAMES, *_MODULES, "__version__", "cost_model", "planning"])


def __getattr__(name: str):
    """The public name `name`, imported on first use. A compressor, `DistributedOptimizer`,
    `GradientExchange` or `exchange_of` installs the Horovod glue first (every way into Horovod
    passes one of them); a module is only imported."""
    if name in _MODULES:
        return importlib.import_module(f"tfcomp.{name}")
    if name not in _NAMES:
        raise AttributeError(f"module 'tfcomp' has no attribute {name!r}")
    from tfcomp.horovod_glue import install

    install()
    value = getattr(importlib.import_module(f"tfcomp.{_NAMES[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
