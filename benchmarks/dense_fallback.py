"""What tfcomp's exchange costs against plain Horovod when it sends every bucket dense.

    python -m benchmarks.dense_fallback [--hosts=4] [--rates=none,1gbit] [--models=cnn,vit]
        [--rounds=60] [--warmup=5]

For each link rate it brings up `benchmarks.cluster` with --hosts hosts (one worker each, one
TensorFlow thread) and runs this module's worker, which builds each model of `examples/models.py`
(Fashion-MNIST shaped) once per configuration from the same weights and trains each on the same
fixed batch (32 images per worker) with `train_on_batch`, one step of each per round, in an order
shuffled every round (seeded by the round, the same on every rank), medians over --rounds after
--warmup. The optimizers are those of the time-to-accuracy benchmark: SGD with momentum 0.9 for
the CNN, Adam for the ViT.

  horovod             hvd.DistributedOptimizer(optimizer): plain Horovod
  no exchange         the optimizer alone, nothing sent: the least a step can take with any
                      exchange, so horovod / no exchange bounds what compression can gain a step
  tfcomp default      DRAGONN(0.01) with the optimizer's correction (below) and the default plan,
                      stepped until its trial has decided: what a compressed job runs
  tfcomp corrected    DRAGONN(0.01, strategy="dense") with the optimizer's correction (CNN: DGC's
                      momentum kept by the exchange; ViT: Adam's moments kept by the exchange),
                      plain SGD inside: every bucket dense, as the default plan runs when it
                      falls back
  tfcomp plain        DRAGONN(0.01, strategy="dense") around the optimizer itself: the exchange
                      with every bucket dense and the optimizer's own state
  tfcomp dropped      DRAGONN(0.01) with the correction and the default plan, its trial decided
                      for dense before the first timed step: what a job runs after its trial
                      dropped a plan that compresses (the plan's dense twin under the trial's
                      tf.cond). Only where the plan compresses on that network (at 1 Gbit/s, not
                      unshaped); otherwise left out.

Prints a table per rate and model: median step ms and its ratio to plain Horovod's. Needs root
(the cluster).
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
flags.DEFINE_list("models", ["cnn", "vit"], "Models of examples/models.py to train.")
flags.DEFINE_integer("rounds", 60, "Measured rounds.")
flags.DEFINE_integer("warmup", 5, "Discarded rounds.")
flags.DEFINE_string("json_out", None, "Where the worker on rank 0 writes its medians.")

CONFIGS = ("horovod", "no exchange", "tfcomp default", "tfcomp corrected", "tfcomp plain", "tfcomp dropped")
_LEARNING_RATE = {"cnn": 0.01, "vit": 0.001}


def _optimizer(model_kind: str, config: str):
    """The Horovod-wrapped optimizer of `config` for `model_kind` (see the module docstring)."""
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    import tfcomp

    rate = _LEARNING_RATE[model_kind]

    def own():
        if model_kind == "cnn":
            return tf.keras.optimizers.SGD(rate, momentum=0.9)
        return tf.keras.optimizers.Adam(rate)

    correction = {"momentum": 0.9} if model_kind == "cnn" else {"adam": True}
    if config == "horovod":
        return hvd.DistributedOptimizer(own())
    if config == "no exchange":
        return own()
    if config == "tfcomp plain":
        return hvd.DistributedOptimizer(own(), compression=tfcomp.DRAGONN(0.01, strategy="dense"))
    strategy = {"strategy": "dense"} if config == "tfcomp corrected" else {}
    return hvd.DistributedOptimizer(tf.keras.optimizers.SGD(rate),
                                    compression=tfcomp.DRAGONN(0.01, **correction, **strategy))


def _models(x, y) -> dict:
    """{(model kind, config): compiled Keras model}, each kind's from the same initial weights,
    every one stepped once on (x, y) ("tfcomp default" until its trial has decided); "tfcomp
    dropped" only where its plan compresses, with its trial decided for dense."""
    import tensorflow as tf

    import tfcomp
    from examples.models import build_model

    models = {}
    for kind in FLAGS.models:
        for config in CONFIGS:
            tf.keras.utils.set_random_seed(0)
            model = build_model(kind, (28, 28, 1), 10)
            model.compile(_optimizer(kind, config), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            model.train_on_batch(x, y)
            if config == "tfcomp default":
                trial = tfcomp.exchange_of(model.optimizer).trial
                while trial is not None and not trial.read()["decided"]:  # the same step on every rank
                    model.train_on_batch(x, y)
            if config == "tfcomp dropped":
                trial = tfcomp.exchange_of(model.optimizer).trial
                if trial is None:  # the plan is all dense on this network: nothing to drop
                    continue
                # The trial's verdict set by hand (every rank alike): dense from the next step on.
                trial.step.assign(trial.decision_step + 1)
                trial.choice.assign(0)
            models[kind, config] = model
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
    models = _models(x, y)
    times = {key: [] for key in models}
    order = list(models.items())
    for round_ in range(FLAGS.warmup + FLAGS.rounds):
        random.Random(round_).shuffle(order)
        for key, model in order:
            start = time.perf_counter()
            model.train_on_batch(x, y)
            if round_ >= FLAGS.warmup:
                times[key].append(1e3 * (time.perf_counter() - start))
    if hvd.rank() == 0 and FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump({"medians": {kind: {config: statistics.median(values) for (k, config), values in times.items()
                                          if k == kind} for kind in FLAGS.models},
                       "plans": {f"{kind}/{config}": _plan_summary(model) for (kind, config), model in models.items()
                                 if config.startswith("tfcomp")}}, f)


def _plan_summary(model) -> str:
    """How the model's tfcomp exchange sends its gradients now: its buckets' strategies, and its
    trial's verdict."""
    import tfcomp

    exchange = tfcomp.exchange_of(model.optimizer)
    strategies = [b.strategy for b in exchange.plan.buckets]
    summary = ", ".join(f"{strategies.count(s)} {s}" for s in sorted(set(strategies)))
    if exchange.trial is not None:
        verdict = exchange.trial.read()
        if verdict["dense_ms"] == 0.0:  # "tfcomp dropped": decided by hand, nothing timed
            summary += "; trial: set to dense"
        else:
            summary += (f"; trial: {'kept' if verdict['compressed'] else 'dropped'} "
                        f"({verdict['compressed_ms']:.1f} ms with the plan, {verdict['dense_ms']:.1f} ms dense)")
    return summary


def _launch() -> None:
    from benchmarks.cluster import Cluster, exit_unless_available

    exit_unless_available("dense_fallback")
    with tempfile.TemporaryDirectory() as tmp, Cluster(hosts=FLAGS.hosts, rate=None) as cluster:
        for rate in FLAGS.rates:
            cluster.set_rate(None if rate == "none" else rate)
            out = os.path.join(tmp, f"{rate}.json")
            command = cluster.horovodrun_args() + [sys.executable, "-m", "benchmarks.dense_fallback", "--worker",
                                                   f"--rounds={FLAGS.rounds}", f"--warmup={FLAGS.warmup}",
                                                   f"--models={','.join(FLAGS.models)}",
                                                   f"--json_out={out}"]
            done = cluster.run(command, timeout=1800, capture=True)
            if done.returncode != 0 or not os.path.exists(out):
                sys.exit(f"dense_fallback: the {rate} job failed (exit {done.returncode}):\n"
                         f"{(done.stdout or '')[-3000:]}{(done.stderr or '')[-3000:]}")
            with open(out) as f:
                results = json.load(f)
            for kind, medians in results["medians"].items():
                print(f"{FLAGS.hosts} hosts, link {rate}, {kind}: median step ms over {FLAGS.rounds} shuffled rounds")
                for config, median in medians.items():
                    plan = results["plans"].get(f"{kind}/{config}", "")
                    print(f"  {config:18s} {median:8.1f}  {median / medians['horovod']:.3f}x horovod  {plan}")


def main(argv):
    del argv
    if FLAGS.worker:
        _worker()
    else:
        _launch()


if __name__ == "__main__":
    app.run(main)
