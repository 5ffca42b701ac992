"""What tfcomp's all-dense plan costs against plain Horovod, step by step, on the emulated cluster.

    python -m benchmarks.dense_fallback [--hosts=4] [--rates=none,1gbit] [--rounds=60] [--warmup=5]

For each link rate it brings up `benchmarks.cluster` with --hosts hosts (one worker each, one
TensorFlow thread) and runs this module's worker, which builds the Fashion-MNIST CNN of
`examples/models.py` three times from the same weights and trains each on the same fixed batch
(32 images per worker) with `train_on_batch`, one step of each per round, in an order shuffled
every round (seeded by the round, the same on every rank), medians over --rounds after --warmup:

  horovod             hvd.DistributedOptimizer(SGD(momentum=0.9)): plain Horovod
  tfcomp corrected    DRAGONN(0.01, momentum=0.9, strategy="dense"): tfcomp's exchange with every
                      bucket dense and DGC's momentum correction (the momentum kept by the
                      exchange, plain SGD inside), as the default plan runs when it falls back
  tfcomp plain        DRAGONN(0.01, strategy="dense") around SGD(momentum=0.9): the exchange with
                      every bucket dense and the optimizer's own momentum

Prints a table per rate: median step ms and its ratio to plain Horovod's. Needs root (the cluster).
"""

import json
import os
import random
import statistics
import sys
import tempfile
import time

from absl import app, flags

__all__ = []

FLAGS = flags.FLAGS
flags.DEFINE_bool("worker", False, "Run as one Horovod worker (the launcher starts these).")
flags.DEFINE_integer("hosts", 4, "Emulated hosts, one worker each.")
flags.DEFINE_list("rates", ["none", "1gbit"], "Link rates (none: unshaped).")
flags.DEFINE_integer("rounds", 60, "Measured rounds.")
flags.DEFINE_integer("warmup", 5, "Discarded rounds.")
flags.DEFINE_string("json_out", None, "Where the worker on rank 0 writes its medians.")

CONFIGS = ("horovod", "tfcomp corrected", "tfcomp plain")


def _models() -> dict:
    """{config: compiled Keras model}, every one from the same initial weights."""
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    import tfcomp
    from examples.models import build_model

    def optimizer(config):
        if config == "horovod":
            return hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01, momentum=0.9))
        if config == "tfcomp corrected":
            return hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01), compression=tfcomp.DRAGONN(
                0.01, momentum=0.9, strategy="dense"))
        return hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01, momentum=0.9),
                                        compression=tfcomp.DRAGONN(0.01, strategy="dense"))

    models = {}
    for config in CONFIGS:
        tf.keras.utils.set_random_seed(0)
        model = build_model("cnn", (28, 28, 1), 10)
        model.compile(optimizer(config), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        models[config] = model
    return models


def _worker() -> None:
    import horovod.tensorflow.keras as hvd
    import numpy as np
    import tensorflow as tf

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    rng = np.random.default_rng(hvd.rank())
    x = tf.constant(rng.standard_normal((32, 28, 28, 1)).astype(np.float32))
    y = tf.constant(rng.integers(0, 10, 32))
    models = _models()
    times = {config: [] for config in models}
    order = list(models.items())
    for round_ in range(FLAGS.warmup + FLAGS.rounds):
        random.Random(round_).shuffle(order)
        for config, model in order:
            start = time.perf_counter()
            model.train_on_batch(x, y)
            if round_ >= FLAGS.warmup:
                times[config].append(1e3 * (time.perf_counter() - start))
    if hvd.rank() == 0 and FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump({config: statistics.median(values) for config, values in times.items()}, f)


def _launch() -> None:
    from benchmarks.cluster import Cluster, exit_unless_available

    exit_unless_available("dense_fallback")
    with tempfile.TemporaryDirectory() as tmp, Cluster(hosts=FLAGS.hosts, rate=None) as cluster:
        for rate in FLAGS.rates:
            cluster.set_rate(None if rate == "none" else rate)
            out = os.path.join(tmp, f"{rate}.json")
            command = cluster.horovodrun_args() + [sys.executable, "-m", "benchmarks.dense_fallback", "--worker",
                                                   f"--rounds={FLAGS.rounds}", f"--warmup={FLAGS.warmup}",
                                                   f"--json_out={out}"]
            done = cluster.run(command, timeout=1800, capture=True)
            if done.returncode != 0 or not os.path.exists(out):
                sys.exit(f"dense_fallback: the {rate} job failed (exit {done.returncode}):\n"
                         f"{(done.stdout or '')[-3000:]}{(done.stderr or '')[-3000:]}")
            with open(out) as f:
                medians = json.load(f)
            print(f"{FLAGS.hosts} hosts, link {rate}: median step ms over {FLAGS.rounds} shuffled rounds")
            for config in CONFIGS:
                print(f"  {config:18s} {medians[config]:8.1f}  {medians[config] / medians['horovod']:.3f}x horovod")


def main(argv):
    del argv
    if FLAGS.worker:
        _worker()
    else:
        _launch()


if __name__ == "__main__":
    app.run(main)
