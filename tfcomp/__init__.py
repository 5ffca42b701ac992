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
before the name can reach Horovod. The glue is also installed as soon as both `tfcomp` and Horovod's
TensorFlow package are imported, in either order, so that Horovod's entry points refuse a
`compression` neither can run (such as a string) at construction even where the program uses no
other tfcomp name first. The op library (`tfcomp.ops`) is loaded on the first op call. On
the first step the exchange calibrates the cluster (`tfcomp.calibration`) and plans buckets and
strategies on the cost model (`tfcomp.planning`, `tfcomp.cost_model`); `python -m tfcomp.whatif`
asks the same model about other clusters without importing TensorFlow.
"""

import importlib
import importlib.abc
import importlib.util
import sys

from tfcomp import cost_model, planning
from tfcomp.version import __version__

# Public names that need TensorFlow and Horovod, and the modules that define them.
_NAMES = {
    "Compressor": "compressors", "DGC": "compressors", "DRAGONN": "compressors", "EFSignSGD": "compressors",
    "FP16": "compressors", "IntQuant": "compressors", "NoCompression": "compressors", "QSGD": "compressors", "RandomK": "compressors",
    "TopK": "compressors", "DistributedOptimizer": "optimizer", "GradientExchange": "exchange",
    "exchange_of": "horovod_glue",
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
    _install_glue()
    value = getattr(importlib.import_module(f"tfcomp.{_NAMES[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))


_HOROVOD_TENSORFLOW = "horovod.tensorflow"


def _install_glue() -> None:
    """Imports tfcomp.horovod_glue, which installs itself (where Horovod's TensorFlow package is imported from
    inside the glue's own imports, the glue is already in sys.modules and installs itself when it is done)."""
    importlib.import_module("tfcomp.horovod_glue")


class _GlueAfterHorovod(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Installs the glue right after Horovod's TensorFlow package is imported: finds that package's
    spec with the other finders, and runs its own loader, then `install()` (once: it leaves
    `sys.meta_path` on its first use and hands the module its own loader back)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _HOROVOD_TENSORFLOW:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__spec__.loader = module.__loader__ = self._loader
        self._loader.exec_module(module)
        _install_glue()


if _HOROVOD_TENSORFLOW in sys.modules:
    _install_glue()
else:
    sys.meta_path.insert(0, _GlueAfterHorovod())
