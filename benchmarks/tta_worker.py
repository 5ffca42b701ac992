"""Worker of benchmarks/time_to_accuracy.py: one training run, test accuracy against wall-clock time.

    horovodrun -np 4 -H $TFCOMP_HOSTS --gloo --network-interface eth0 \\
        python -m benchmarks.tta_worker --model=cnn --config=dragonn_0.01 --seed=0 --json_out=RUN.json

Every worker trains `examples.models.build_model(--model)` on its shard of Fashion-MNIST's training
split (`examples.fashion_mnist`) with `model.fit`, in periods of --eval_every steps. After each
period every worker evaluates its share of the test set (the first --test_examples test images,
every size-th from its rank on) and the accuracies are averaged over the workers. The clock stops
for the evaluation: the times recorded are training wall-clock seconds since the first step began,
including the first step's tracing and tfcomp's calibration.

Optimizers (`MODEL_OPTIMIZERS`): the CNN trains with SGD, momentum 0.9, learning rate 0.025 per
worker of batch 32 (scaled linearly with --batch_size) times the workers, reached by a linear
warm-up from one worker's rate over the first --warmup_steps steps (Goyal et al.'s gradual warm-up
for linearly scaled rates; without it, plain Horovod's run of seed 0 diverged in its first 50
steps); the ViT with Adam at 0.001 (SGD with momentum reached 43 % after 400 steps of batch 128
where Adam reached 77 %).

Configurations (`benchmarks.tta_configs.CONFIGS`): `dense` (stock Horovod allreduce) and `fp16`
(Horovod's fp16 compression); `intquant_8`: `tfcomp.IntQuant(8)` (levels summed by an int32
allreduce) with the default plan and plain error feedback, the optimizer unchanged;
`dragonn_0.01`, `dragonn_0.001`, `dgc_0.01` and `topk_0.01`: the tfcomp compressor with the
default plan (the cost model chooses per bucket whether and how to compress) and error feedback:
for the CNN with DGC's momentum correction (the momentum 0.9 moves into the error feedback, the
optimizer is plain SGD), for the ViT with Adam correction (each worker's Adam moments move into
the exchange, which sends Adam's step direction with error feedback; the optimizer is plain SGD
at Adam's rate). The tfcomp configurations run `tfcomp.keras.Replan()` (--replan, the default) as
examples/train_keras.py does. Rank 0 writes --json_out.
"""

import json
import time

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
from absl import app, flags

import tfcomp
from tfcomp.collectives import barrier as make_barrier
from examples import fashion_mnist
from benchmarks.tta_configs import MODEL_OPTIMIZERS, MOMENTUM, REFERENCE_BATCH, learning_rate, make_compression
from examples.models import build_model

__all__ = ["LinearWarmup", "make_optimizer"]

FLAGS = flags.FLAGS
flags.DEFINE_enum("model", "cnn", ["cnn", "vit"], "Model of examples/models.py.")
flags.DEFINE_string("config", "dense", "One of benchmarks.tta_configs.CONFIGS.")
flags.DEFINE_integer("seed", 0, "Seed of the initial weights and the shuffling.")
flags.DEFINE_integer("steps", 400, "Training steps.")
flags.DEFINE_integer("eval_every", 50, "Steps between evaluations.")
flags.DEFINE_integer("batch_size", REFERENCE_BATCH,
                     "Batch size per worker (a rate scaled by the workers scales with it too).")
flags.DEFINE_float("lr", None, "Learning rate; unset: the model's (MODEL_OPTIMIZERS).")
flags.DEFINE_integer("warmup_steps", 50, "Steps of linear learning-rate warm-up where the rate is scaled by the workers.")
flags.DEFINE_integer("test_examples", 4000, "Test images evaluated (shared out among the workers).")
flags.DEFINE_integer("threads", 1, "TensorFlow intra-op and inter-op threads per worker.")
flags.DEFINE_boolean("replan", True, "tfcomp configurations: tfcomp.keras.Replan() among the callbacks (re-planned "
                     "with the measured ready times after 30 steps, the prediction checked every 20 after), as "
                     "examples/train_keras.py does.")
flags.DEFINE_string("json_out", None, "Where rank 0 writes the run's record.")

@tf.keras.utils.register_keras_serializable(package="tfcomp_benchmarks")  # Horovod rebuilds the optimizer from its config
class LinearWarmup(tf.keras.optimizers.schedules.LearningRateSchedule):
    """`start` at step 0, rising linearly to `peak` at `steps`, then `peak` (float32 scalar)."""

    def __init__(self, start: float, peak: float, steps: int):
        self.start, self.peak, self.steps = float(start), float(peak), int(steps)

    def __call__(self, step):
        progress = tf.minimum(tf.cast(step, tf.float32) / max(self.steps, 1), 1.0)
        return self.start + (self.peak - self.start) * progress

    def get_config(self):
        return {"start": self.start, "peak": self.peak, "steps": self.steps}


def make_optimizer(model: str, corrected: bool, lr=None, warmup_steps: int = 0, batch_size: int = REFERENCE_BATCH):
    """The inner Keras optimizer of `model` (MODEL_OPTIMIZERS), at `lr` if given: plain SGD where
    the exchange `corrected` the optimizer (keeps its momentum or Adam's moments). A rate scaled
    by the workers (SGD's) is scaled linearly by the global batch, `batch_size` per worker against
    REFERENCE_BATCH (Goyal et al.), and reached by a linear warm-up over `warmup_steps` from one
    worker's rate."""
    kind, _, scaled = MODEL_OPTIMIZERS[model]
    lr = learning_rate(model, hvd.size(), batch_size) if lr is None else lr
    if scaled and warmup_steps > 0:
        lr = LinearWarmup(lr / hvd.size(), lr, warmup_steps)
    if corrected:
        return tf.keras.optimizers.SGD(lr, momentum=0.0)
    if kind == "adam":
        return tf.keras.optimizers.Adam(lr)
    return tf.keras.optimizers.SGD(lr, momentum=MOMENTUM)


_barrier = make_barrier(hvd_tf.global_process_set, "tta_barrier")


class _FirstPlan(tf.keras.callbacks.Callback):
    """What the exchange ran in the first `steps` steps, read at the end of step `steps` (before
    a `Replan` listed after it re-plans there): how many buckets the first plan compressed, and its
    trial's verdict (None: no trial)."""

    def __init__(self, steps: int):
        super().__init__()
        self.steps, self._seen, self.summary = steps, 0, None

    def on_train_batch_end(self, batch, logs=None):
        self._seen += 1
        if self._seen == self.steps:
            exchange = tfcomp.exchange_of(self.model.optimizer)
            self.summary = {"compressed_buckets": len(exchange.plan.compressed),
                            "trial": None if exchange.trial is None else exchange.trial.read()}


class _TimeToAccuracy(tf.keras.callbacks.Callback):
    """Evaluates after every fit epoch (a period of --eval_every steps) with the clock stopped."""

    def __init__(self, x_test, y_test):
        super().__init__()
        self.x_test, self.y_test = x_test, y_test
        self.timeline = []  # [steps, training seconds, test accuracy]
        self.paused = 0.0
        self.start = None

    def on_train_begin(self, logs=None):
        _barrier()
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        _barrier()
        stopped = time.perf_counter()
        _, accuracy = self.model.evaluate(self.x_test, self.y_test, batch_size=250, verbose=0)
        accuracy = float(hvd.allreduce(tf.constant(accuracy, tf.float64), name="tta_accuracy"))
        self.timeline.append([(epoch + 1) * FLAGS.eval_every, stopped - self.start - self.paused, accuracy])
        self.paused += time.perf_counter() - stopped
        if hvd.rank() == 0:
            print(f"step {(epoch + 1) * FLAGS.eval_every}: {self.timeline[-1][1]:.1f} s, "
                  f"test accuracy {accuracy:.4f}", flush=True)


def _bytes_per_step(optimizer, model, compression) -> tuple:
    """(dense, sent) bytes one worker exchanges per step."""
    try:
        return tfcomp.exchange_of(optimizer).bytes_per_step()
    except TypeError:
        dense = sum(v.shape.num_elements() * v.dtype.size for v in model.trainable_variables)
        return dense, dense // 2 if compression is hvd.Compression.fp16 else dense


def main(argv):
    del argv
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(FLAGS.threads)
    tf.config.threading.set_inter_op_parallelism_threads(FLAGS.threads)
    tf.keras.utils.set_random_seed(FLAGS.seed)
    compression, corrected = make_compression(FLAGS.config, MODEL_OPTIMIZERS[FLAGS.model][0])

    train = fashion_mnist.input_pipeline(hvd.rank(), hvd.size(), FLAGS.batch_size, FLAGS.seed)
    x_test, y_test = fashion_mnist.test_arrays(FLAGS.test_examples)
    x_test, y_test = x_test[hvd.rank()::hvd.size()], y_test[hvd.rank()::hvd.size()]

    optimizer = hvd.DistributedOptimizer(make_optimizer(FLAGS.model, corrected, FLAGS.lr, FLAGS.warmup_steps,
                                                        FLAGS.batch_size),
                                         compression=compression)
    model = build_model(FLAGS.model, x_test.shape[1:], 10)
    model.compile(optimizer=optimizer, metrics=["accuracy"],
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    record = _TimeToAccuracy(x_test, y_test)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), record]
    replan = tfcomp.keras.Replan() if FLAGS.replan and isinstance(compression, tfcomp.Compressor) else None
    first_plan = None if replan is None else _FirstPlan(replan.after_steps)
    if replan is not None:
        callbacks += [first_plan, replan]
    model.fit(train.repeat(), epochs=FLAGS.steps // FLAGS.eval_every, steps_per_epoch=FLAGS.eval_every, verbose=0,
              callbacks=callbacks)

    dense, sent = _bytes_per_step(optimizer, model, compression)
    try:
        exchange = tfcomp.exchange_of(optimizer)
        plan, calibration = exchange.describe(), exchange.calibration_seconds
        trial = None if exchange.trial is None else exchange.trial.read()
        replanned = None if replan is None else {
            "ready_times_cached": exchange.ready_times_cached, "first_plan": first_plan.summary,
            "changed": replan.replanned,
            "checks": [{key: c[key] for key in ("predicted_seconds", "measured_seconds", "departure", "changed",
                                                "overlap_slowdown", "recalibrated")} for c in replan.checks]}
    except TypeError:
        plan, calibration, trial, replanned = "stock Horovod allreduce", 0.0, None, None
    if hvd.rank() == 0:
        print(plan, flush=True)
        result = {"model": FLAGS.model, "config": FLAGS.config, "seed": FLAGS.seed, "workers": hvd.size(),
                  "cpu_allocator": tfcomp.calibration.cpu_allocator(),
                  "parameters": int(sum(np.prod(v.shape) for v in model.trainable_variables)),
                  "steps": FLAGS.steps, "batch_size": FLAGS.batch_size,
                  "optimizer": optimizer.get_config()["name"], "lr": float(optimizer.learning_rate),
                  "warmup_steps": FLAGS.warmup_steps if MODEL_OPTIMIZERS[FLAGS.model][2] else 0,
                  "timeline": record.timeline, "final_accuracy": record.timeline[-1][2],
                  "dense_bytes_per_step": dense, "sent_bytes_per_step": sent,
                  "calibration_seconds": calibration, "plan": plan, "trial": trial, "replan": replanned}
        if FLAGS.json_out:
            with open(FLAGS.json_out, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    app.run(main)
