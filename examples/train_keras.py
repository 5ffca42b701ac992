"""Data-parallel Keras training with Horovod and a tfcomp gradient compressor.

Two workers on one machine, DRAGONN keeping 1 % of every large gradient, on Fashion-MNIST:

    horovodrun -np 2 -H localhost:2 --gloo python examples/train_keras.py \\
        --compressor=dragonn --ratio=0.01 --model=cnn --epochs=2

(`make run` runs this on two emulated hosts at 1 Gbit/s each; see benchmarks/cluster.py.)

Other settings: `--compressor=dgc --momentum=0.9` (DGC momentum correction: the momentum moves into
the error feedback, so the inner optimizer becomes plain SGD), `--warmup_steps=N` (N dense steps
first), `--planning=off` (compress tensor by tensor instead of the cost model's buckets),
`--strategy=allgather` (force a strategy for every bucket), `--entry=tfcomp`
(`tfcomp.DistributedOptimizer` instead of `hvd.DistributedOptimizer`), `--log_json=PATH` (rank 0
writes the metrics and compression statistics as JSON).

Data: `fashion_mnist` (the default) is tensorflow-datasets' Fashion-MNIST, built offline from
Debian's dataset-fashion-mnist the first time (examples/fashion_mnist.py); every worker reads its
shard of the training split through tf.data (sharded, shuffled, batched, prefetched) and evaluates
on the test split. Where the Debian package is absent it says so in one line and falls back to
`digits`: scikit-learn's 8x8 handwritten digits (1797 images, shipped with the package), split into
train and test sets by `--seed`. `synthetic` is Gaussian inputs labelled by a fixed random linear
teacher. `--train_examples=N` trains on the first N training examples only.

Models (examples/models.py): `cnn`, a ResNet-style CNN with BatchNorm and a wide dense head (3.3 M
parameters on 28x28 images); `vit`, a small Vision Transformer (1.6 M); `mlp`.

Learning rate: `--lr` is the rate for one worker's batch of `--batch_size`; the optimizer runs with
lr * workers (linear scaling for the global batch of batch_size * workers).

`tfcomp.keras.Replan` has the exchange calibrate between the first training steps (they send
everything dense meanwhile; after 10 of them a gate decides whether compression could pay at all,
and only then does calibration run, within a small share of the steps' time), and plan with those
figures; 30 steps later it makes the exchange's plan again with when each gradient became
ready in them (dense buckets that overlap the backward pass), then every 20 steps checks the
exchange's measured end against the prediction and plans again where they part by more than 25 %;
Keras traces the step again wherever the plan changed.

Rank 0 prints the per-epoch metrics, with the compression figures of
`tfcomp.keras.CompressionMonitor` (bytes sent per step against dense, exchange time, residual norm),
the final test accuracy and, when tfcomp ran the exchange, the table of `GradientExchange.describe()`.
"""

import json
import os
import time

# TensorFlow's BFC allocator for CPU tensors: its default passes every tensor to malloc, and glibc
# maps each allocation over 32 MiB afresh, page-faulted on every step (README, "Training on CPUs").
# Set before TensorFlow makes its first tensor.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
from absl import app, flags

import tfcomp
from examples import fashion_mnist
from examples.models import MODELS, build_model
from tfcomp import strategies

__all__ = [
    "build_optimizer",
    "exchange_statistics",
    "load_data",
    "make_compression",
    "shard",
]

FLAGS = flags.FLAGS
flags.DEFINE_enum("compressor", "dragonn",
                  ["dragonn", "dgc", "topk", "randomk", "efsignsgd", "qsgd", "intquant", "fp16", "none"],
                  "Gradient compressor.")
flags.DEFINE_float("ratio", 0.01, "Fraction of elements sent by the sparsifiers (dragonn, dgc, topk, randomk).")
flags.DEFINE_integer("warmup_steps", 0, "Communicating steps sent dense before compression starts.")
flags.DEFINE_enum("planning", "auto", ["auto", "off"],
                  "auto: calibrate and let the cost model choose buckets and strategies; off: compress every "
                  "tensor of >= 1024 elements on its own.")
flags.DEFINE_enum("strategy", None, list(strategies.NAMES),
                  "Force this strategy for every bucket (unset: the cost model chooses; the compressor must "
                  "support it).")
flags.DEFINE_float("momentum", None,
                   "DGC momentum-correction factor in [0, 1); unset: plain residual error feedback.")
flags.DEFINE_enum("entry", "horovod", ["horovod", "tfcomp"],
                  "horovod: hvd.DistributedOptimizer(compression=...); tfcomp: tfcomp.DistributedOptimizer.")
flags.DEFINE_enum("model", "cnn", list(MODELS), "Model of examples/models.py.")
flags.DEFINE_enum("dataset", "fashion_mnist", ["fashion_mnist", "digits", "synthetic"], "Training data.")
flags.DEFINE_integer("train_examples", None, "Train on the first N training examples only (unset: all).")
flags.DEFINE_integer("epochs", 20, "Training epochs.")
flags.DEFINE_integer("batch_size", 32, "Batch size per worker.")
flags.DEFINE_float("lr", 0.05, "Learning rate for one worker (multiplied by the number of workers).")
flags.DEFINE_integer("seed", 0, "Seed of the train/test split, the initial weights and the shuffling.")
flags.DEFINE_enum("optimizer", None, ["momentum", "sgd"],
                  "momentum: SGD with momentum 0.9; sgd: plain SGD. Unset: momentum, or sgd when "
                  "--momentum is given (the momentum then lives in the error feedback).")
flags.DEFINE_string("log_json", None, "If set, rank 0 writes the final metrics as JSON to this path.")

_SPARSIFIERS = {"dragonn": tfcomp.DRAGONN, "dgc": tfcomp.DGC, "topk": tfcomp.TopK, "randomk": tfcomp.RandomK}
_OPTIMIZER_MOMENTUM = 0.9
_TEST_FRACTION = 0.2
_SYNTHETIC_SIZES = (4096, 1024)  # train, test
_NUM_CLASSES = 10
_LOGGED_FLAGS = ("compressor", "ratio", "warmup_steps", "planning", "strategy", "momentum", "entry", "model", "dataset",
                 "train_examples", "epochs", "batch_size", "lr", "seed", "optimizer")


def _log(message: str) -> None:
    """Prints on rank 0 only."""
    if hvd.rank() == 0:
        print(message, flush=True)


def _load_digits(seed: int):
    """scikit-learn's 8x8 digits in [0, 1], shape [n, 8, 8, 1], split by a stratified seeded shuffle."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., None]
    y = digits.target.astype(np.int32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=_TEST_FRACTION, random_state=seed, stratify=y)
    return (x_train, y_train), (x_test, y_test)


def _synthetic(seed: int):
    """Gaussian 8x8x1 inputs labelled by the argmax of a fixed random linear map."""
    rng = np.random.default_rng(seed)
    teacher = rng.standard_normal((64, _NUM_CLASSES)).astype(np.float32)
    sets = []
    for n in _SYNTHETIC_SIZES:
        x = rng.standard_normal((n, 8, 8, 1)).astype(np.float32)
        sets.append((x, np.argmax(x.reshape(n, 64) @ teacher, axis=1).astype(np.int32)))
    return sets


def load_data(name: str, seed: int, batch_size: int, train_examples=None):
    """(this worker's training tf.data.Dataset of ([batch, h, w, 1] float32, [batch] int32), its
    examples, (x_test, y_test)) of the dataset `name`; the test images are [n, h, w, 1] float32."""
    if name == "fashion_mnist":
        try:
            train = fashion_mnist.input_pipeline(hvd.rank(), hvd.size(), batch_size, seed, train_examples)
            examples = (train_examples or fashion_mnist.SPLIT_SIZES["train"]) // hvd.size() // batch_size * batch_size
            return train, examples, fashion_mnist.test_arrays()
        except fashion_mnist.DatasetUnavailable as reason:
            _log(f"{reason}: falling back to --dataset=digits")
            name = "digits"
    (x_train, y_train), test = _load_digits(seed) if name == "digits" else _synthetic(seed)
    x_shard, y_shard = shard(x_train[:train_examples], y_train[:train_examples], hvd.rank(), hvd.size())
    train = (tf.data.Dataset.from_tensor_slices((x_shard, y_shard))
             .shuffle(len(x_shard), seed=seed + hvd.rank())
             .batch(batch_size)
             .prefetch(tf.data.AUTOTUNE))
    return train, len(x_shard), test


def shard(x: np.ndarray, y: np.ndarray, rank: int, size: int):
    """This worker's shard: every size-th example from `rank` on, cut so all shards are equally long
    (equal steps per epoch on every worker, which the collectives need)."""
    length = len(x) // size
    return x[rank::size][:length], y[rank::size][:length]


def make_compression(name: str, ratio: float, warmup_steps: int, momentum, planning="auto", strategy=None):
    """The `compression=` argument: a tfcomp compressor, or Horovod's Compression.none / .fp16."""
    if name in ("none", "fp16"):
        if momentum is not None or warmup_steps or strategy:
            raise app.UsageError("--momentum, --warmup_steps and --strategy need a compressing --compressor")
        return hvd.Compression.none if name == "none" else hvd.Compression.fp16
    kwargs = {"warmup_steps": warmup_steps, "momentum": momentum, "planning": planning, "strategy": strategy}
    if name in _SPARSIFIERS:
        return _SPARSIFIERS[name](ratio, **kwargs)
    if name == "efsignsgd":
        return tfcomp.EFSignSGD(**kwargs)
    if name == "intquant":
        return tfcomp.IntQuant(8, **kwargs)
    # QSGD is unbiased and runs without error feedback unless momentum correction asks for it.
    return tfcomp.QSGD(error_feedback=momentum is not None, **kwargs)


def build_optimizer(compression, entry: str, lr: float, optimizer: str, momentum):
    """SGD (with momentum 0.9, or plain) at lr * workers, wrapped by the chosen entry point."""
    if optimizer is None:
        optimizer = "sgd" if momentum is not None else "momentum"
    inner = tf.keras.optimizers.SGD(lr * hvd.size(), momentum=_OPTIMIZER_MOMENTUM if optimizer == "momentum" else 0.0)
    _log(f"optimizer: SGD, lr {lr:g} x {hvd.size()} workers, momentum {float(inner.momentum):g}")
    if entry == "tfcomp":
        return tfcomp.DistributedOptimizer(inner, compression=compression)
    return hvd.DistributedOptimizer(inner, compression=compression)


def exchange_statistics(optimizer, model: tf.keras.Model, compression) -> dict:
    """Bytes one worker sends per step against dense, and the compressed tensors. From tfcomp's
    exchange records when tfcomp ran the exchange; for stock Horovod, its dense (or fp16) allreduce
    of every trainable variable."""
    try:
        exchange = tfcomp.exchange_of(optimizer)
    except TypeError:
        exchange = None
    if exchange is not None:
        dense, sent = exchange.bytes_per_step()
        compressed = exchange.compressed_tensors()
    else:
        dense = sum(v.shape.num_elements() * v.dtype.size for v in model.trainable_variables)
        sent = dense // 2 if compression is hvd.Compression.fp16 else dense
        compressed = []
    return {"dense_bytes_per_step": dense, "sent_bytes_per_step": sent,
            "sent_fraction_of_dense": sent / max(dense, 1), "compressed_tensors": compressed}


def main(argv):
    """Trains on this worker's shard, evaluates, prints the compression statistics, writes --log_json."""
    del argv
    hvd.init()
    tf.keras.utils.set_random_seed(FLAGS.seed)
    train, examples, (x_test, y_test) = load_data(FLAGS.dataset, FLAGS.seed, FLAGS.batch_size, FLAGS.train_examples)

    compression = make_compression(FLAGS.compressor, FLAGS.ratio, FLAGS.warmup_steps, FLAGS.momentum,
                                   FLAGS.planning, FLAGS.strategy)
    optimizer = build_optimizer(compression, FLAGS.entry, FLAGS.lr, FLAGS.optimizer, FLAGS.momentum)
    model = build_model(FLAGS.model, x_test.shape[1:])
    model.compile(optimizer=optimizer, metrics=["accuracy"],
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    _log(f"{hvd.size()} workers, {examples} training examples each, {len(x_test)} test examples; "
         f"compression={compression!r}, entry={FLAGS.entry}")

    start = time.perf_counter()
    history = model.fit(
        train, epochs=FLAGS.epochs, verbose=2 if hvd.rank() == 0 else 0,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
                   tfcomp.keras.CompressionMonitor(),
                   tfcomp.keras.Replan()],
    )
    seconds = time.perf_counter() - start
    test_loss, test_accuracy = model.evaluate(x_test, y_test, batch_size=256, verbose=0)
    _log(f"test accuracy {test_accuracy:.4f} (loss {test_loss:.4f}) after {FLAGS.epochs} epochs, {seconds:.1f} s")

    try:
        _log(tfcomp.exchange_of(optimizer).describe())
    except TypeError:
        _log(f"stock Horovod allreduce ({FLAGS.compressor}): no tfcomp exchange, no compression table")
    if FLAGS.log_json and hvd.rank() == 0:
        metrics = {
            "flags": {name: FLAGS[name].value for name in _LOGGED_FLAGS},
            "workers": hvd.size(),
            "train_loss": [float(v) for v in history.history["loss"]],
            "train_accuracy": [float(v) for v in history.history["accuracy"]],
            "test_loss": float(test_loss),
            "test_accuracy": float(test_accuracy),
            "train_seconds": seconds,
            "monitor": {k: [float(x) for x in v] for k, v in history.history.items() if k.startswith("tfcomp_")},
            **exchange_statistics(optimizer, model, compression),
        }
        with open(FLAGS.log_json, "w") as f:
            json.dump(metrics, f, indent=2)


if __name__ == "__main__":
    app.run(main)
