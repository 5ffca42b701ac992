"""The configurations of the time-to-accuracy runs (`benchmarks/tta_worker.py`), without flags, so
that tests and other benchmarks can import them: each name's compression and whether the exchange
takes over the optimizer's state."""

import horovod.tensorflow.keras as hvd

import tfcomp

__all__ = ["CONFIGS", "MODEL_OPTIMIZERS", "MOMENTUM", "REFERENCE_BATCH", "compressor_and_model", "learning_rate",
           "make_compression"]

MOMENTUM = 0.9
REFERENCE_BATCH = 32  # per worker, the batch of MODEL_OPTIMIZERS' rates
# model -> (optimizer, learning rate per worker of REFERENCE_BATCH, scaled by the workers and the batch)
MODEL_OPTIMIZERS = {"cnn": ("sgd", 0.025, True), "vit": ("adam", 0.001, False)}
_SPARSIFIERS = {"dragonn": tfcomp.DRAGONN, "dgc": tfcomp.DGC, "topk": tfcomp.TopK}
CONFIGS = ("dense", "fp16", "dragonn_0.01", "dragonn_0.001", "dgc_0.01", "topk_0.01", "intquant_8",
           "dragonn_0.01_partitioned")


def learning_rate(model: str, workers: int, batch_size: int = REFERENCE_BATCH) -> float:
    """The peak learning rate of `model`: an SGD rate (MODEL_OPTIMIZERS' scaled ones) times the
    workers and times `batch_size` / REFERENCE_BATCH, the linear scaling rule for the global batch
    (Goyal et al.); Adam's rate as it is."""
    _, rate, scaled = MODEL_OPTIMIZERS[model]
    return rate * workers * batch_size / REFERENCE_BATCH if scaled else rate


def make_compression(config: str, optimizer: str):
    """(compression argument, whether the exchange corrects the optimizer) of a configuration
    name for a model trained with `optimizer` ("sgd" or "adam"): the tfcomp sparsifiers with DGC's
    momentum correction under SGD, with Adam correction under Adam (both: the optimizer's state
    moves into the exchange, the inner optimizer is plain SGD). A sparsifier's name ending in
    "_partitioned" forces the hash-partitioned sparse allreduce for its compressed buckets."""
    if config == "dense":
        return hvd.Compression.none, False
    if config == "fp16":
        return hvd.Compression.fp16, False
    config, forced = (config[:-len("_partitioned")], "partitioned") if config.endswith("_partitioned") else (config, None)
    name, _, parameter = config.partition("_")
    if name == "intquant" and parameter in ("4", "8", "16") and forced is None:
        # The optimizer keeps its own state and the exchange does plain error feedback. (With
        # momentum correction, before quantisers kept their momentum, factor masking cleared it
        # wherever a level went, and the CNN reached 83.95 % against dense's 87.15 %.)
        return tfcomp.IntQuant(int(parameter)), False
    correction = {"momentum": MOMENTUM} if optimizer == "sgd" else {"adam": True}
    if name not in _SPARSIFIERS or not parameter:
        raise ValueError(f"--config: {config!r} is not one of {', '.join(CONFIGS)} (or <sparsifier>_<ratio>, "
                         "intquant_<bits>, <sparsifier>_<ratio>_partitioned)")
    return _SPARSIFIERS[name](float(parameter), strategy=forced, **correction), True


def compressor_and_model(config: str, model: str):
    """(compressor, Keras model) of the calibration benchmarks: `config`'s compression for `model`'s
    optimizer (`make_compression`), and `examples.models`' `model` for Fashion-MNIST's 28x28x1
    images and 10 classes."""
    from examples.models import build_model

    compressor, _ = make_compression(config, MODEL_OPTIMIZERS[model][0])
    return compressor, build_model(model, (28, 28, 1), 10)
