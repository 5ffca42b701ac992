"""tfcomp: gradient compression that pays in Horovod/Keras data-parallel training.

    import horovod.tensorflow.keras as hvd
    import tfcomp
    hvd.init()
    opt = hvd.DistributedOptimizer(opt, compression=tfcomp.DRAGONN(ratio=0.001))
    # or: opt = tfcomp.DistributedOptimizer(opt, compression=tfcomp.DRAGONN(ratio=0.001))

Importing tfcomp teaches stock Horovod to run tfcomp's exchange for tfcomp compressors (see
`tfcomp.horovod_glue`). The op library (`tfcomp.ops`) is loaded lazily, on the first op call. On the
first step the exchange calibrates the cluster (`tfcomp.calibration`) and plans buckets and
strategies on the cost model (`tfcomp.planning`, `tfcomp.cost_model`); `python -m tfcomp.whatif`
asks the same model about other clusters.
"""

from tfcomp import calibration, checkpointing, cost_model, counters, ops, planning
from tfcomp.compressors import DGC, DRAGONN, FP16, QSGD, Compressor, EFSignSGD, NoCompression, RandomK, TopK
from tfcomp.exchange import GradientExchange, exchange_of
from tfcomp.horovod_glue import install as _install_horovod_glue
from tfcomp import keras
from tfcomp.optimizer import DistributedOptimizer
from tfcomp.version import __version__

_install_horovod_glue()

__all__ = [
    "Compressor",
    "DGC",
    "DRAGONN",
    "DistributedOptimizer",
    "EFSignSGD",
    "FP16",
    "GradientExchange",
    "NoCompression",
    "QSGD",
    "RandomK",
    "TopK",
    "__version__",
    "calibration",
    "checkpointing",
    "cost_model",
    "counters",
    "exchange_of",
    "keras",
    "ops",
    "planning",
]
