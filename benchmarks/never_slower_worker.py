"""Worker of benchmarks/never_slower.py: plain Horovod against tfcomp's default, on one emulated cluster.

    horovodrun -np 2 -H $TFCOMP_HOSTS --gloo --network-interface eth0 \\
        python -m benchmarks.never_slower_worker --mode=steady --models=many_small,cnn --rounds=100 --json_out=R.json
    ... python -m benchmarks.never_slower_worker --mode=fit --model=cnn --arm=tfcomp --steps=300 --json_out=R.json

The two arms (`ARMS`), built from the same initial weights with the same Keras optimizer (SGD with
momentum 0.9 for many_small and the CNN, Adam for the ViT; the time-to-accuracy benchmark's rates,
`benchmarks.tta_configs`):

  horovod   hvd.DistributedOptimizer(optimizer)
  tfcomp    hvd.DistributedOptimizer(optimizer, compression=tfcomp.DRAGONN()) with
            `tfcomp.keras.Replan()` driving it: tfcomp's default, as README's quick start runs it

Models: `benchmarks.network_worker.MODELS` (many_small: 40 Dense 128 -> 128 layers, on random
inputs; the CNN and the ViT of `examples/models.py` on Fashion-MNIST batches of this worker's shard,
`examples.fashion_mnist.input_pipeline`), batch 32 per worker.

--mode=steady: per model of --models, both arms built, and a second plain Horovod arm
(`horovod_again`, the control: what noise alone gives a ratio); the tfcomp arm is stepped with
`train_on_batch`, its `Replan` driven by hand as `fit` would (`set_model`, `on_train_begin`,
`on_train_batch_end` after each step), until its plan is settled
(`never_slower_report.plan_settled`: no calibration pending, `Replan`'s re-plan with the measured
ready times done, the plan's trial (if any) decided for the plan, and no new plan installed in the
last step; every rank agrees before stopping) or --max_warmup_steps (then reported as capped); the
Horovod arms take as many warm-up steps. Then --rounds rounds, each one step of each arm on the
same batch, in an order shuffled per round (`never_slower_report.round_order`), each step timed on
rank 0 after a barrier; `Replan` runs after the tfcomp arm's step, outside its time (its seconds
are recorded), and a plan it installs during the rounds is counted.

--mode=fit: one arm (--arm) of one model (--model) trained by `model.fit` for --steps steps (one
epoch of steps_per_epoch), with `hvd.callbacks.BroadcastGlobalVariablesCallback(0)` (and `Replan()`
for tfcomp), after a barrier: fit's wall time on rank 0 and each step's (a callback's batch begin to
batch end, the loss fetched; the first includes the trace and tfcomp's first plan), and how many
times Keras traced its last training function (plain Horovod's Keras optimizer traces it twice: its
slots are made in the first trace; tfcomp's exchange builds them beforehand, so once).

Rank 0 writes --json_out.
"""

import argparse
import json
import time

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

import tfcomp
from benchmarks.network_worker import BATCH, MODELS
from benchmarks.never_slower_report import ARMS, STEADY_ARMS, describe_plan, plan_settled, round_order
from benchmarks.never_slower_report import MODELS as BENCHMARK_MODELS
from benchmarks.tables import machine_header
from benchmarks.tta_configs import MOMENTUM, learning_rate
from examples import fashion_mnist
from tfcomp.collectives import barrier as make_barrier

__all__ = []

SEED = 0
_IMAGE_BATCHES = 200  # batches per worker read from Fashion-MNIST, then repeated
_MANY_SMALL_RATE = 0.01  # SGD's, as benchmarks/network_worker.py trains it

_barrier = make_barrier(hvd_tf.global_process_set, "never_slower_barrier")


def _optimizer(model_name: str):
    """The Keras optimizer both arms of `model_name` wrap: Adam for the ViT, else SGD with momentum."""
    if model_name == "vit":
        return tf.keras.optimizers.Adam(learning_rate("vit", hvd.size()))
    rate = _MANY_SMALL_RATE if model_name == "many_small" else learning_rate(model_name, hvd.size())
    return tf.keras.optimizers.SGD(rate, momentum=MOMENTUM)


def _compiled(model_name: str, arm: str) -> tf.keras.Model:
    """`model_name` compiled with `arm`'s distributed optimizer, its weights those of seed SEED."""
    build, _, _ = MODELS[model_name]
    tf.keras.utils.set_random_seed(SEED)
    model = build()
    compression = {"compression": tfcomp.DRAGONN()} if arm == "tfcomp" else {}
    model.compile(optimizer=hvd.DistributedOptimizer(_optimizer(model_name), **compression),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _dataset(model_name: str) -> tf.data.Dataset:
    """This worker's endless batches of ([32, ...] float32, [32] int32) for `model_name`."""
    _, inputs, classes = MODELS[model_name]
    if model_name in ("cnn", "vit"):
        examples = min(fashion_mnist.SPLIT_SIZES["train"], _IMAGE_BATCHES * BATCH * hvd.size())
        return fashion_mnist.input_pipeline(hvd.rank(), hvd.size(), BATCH, SEED, examples=examples).repeat()
    rng = np.random.default_rng(100 + hvd.rank())
    x = rng.standard_normal((_IMAGE_BATCHES * BATCH,) + inputs).astype(np.float32)
    y = rng.integers(0, classes, _IMAGE_BATCHES * BATCH).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True).repeat()


def _exchange(model):
    try:
        return tfcomp.exchange_of(model.optimizer)
    except TypeError:  # plain Horovod
        return None


def _plan_record(model, replan=None) -> dict:
    """What the model's exchange runs now: {"plan" (in words), "strategies", "trial",
    "calibration_s", and with `replan` "calibrated_at", "replanned", "checks"}; for plain Horovod
    {"plan": "Horovod's allreduce"}."""
    exchange = _exchange(model)
    if exchange is None or exchange.plan is None:
        return {"plan": "Horovod's allreduce" if exchange is None else "no plan yet"}
    strategies = [str(b.strategy) for b in exchange.plan.buckets]
    trial = None if exchange.trial is None else exchange.trial.read()
    record = {"plan": describe_plan(strategies, trial), "strategies": strategies, "trial": trial,
              "calibration_s": exchange.calibration_seconds}
    if replan is not None:
        record.update(calibrated_at=replan.calibrated_at, replanned=replan.replanned,
                      checks=[{k: v for k, v in c.items() if isinstance(v, (bool, int, float))} for c in replan.checks])
    return record


def _on_every_rank(flag: bool) -> bool:
    """Whether `flag` holds on every rank (one allreduce)."""
    return bool(hvd_tf.allreduce(tf.constant([int(flag)], tf.int32), op=hvd_tf.Min, name="never_slower_all").numpy()[0])


def _steady(model_name: str, rounds: int, max_warmup_steps: int) -> dict:
    """One model's warm-up and interleaved rounds (see the module docstring)."""
    models = {arm: _compiled(model_name, arm) for arm in STEADY_ARMS}  # horovod_again: plain Horovod again
    batches = iter(_dataset(model_name))
    replan = tfcomp.keras.Replan()
    replan.set_model(models["tfcomp"])
    replan.on_train_begin()
    steps, capped, previous = 0, False, None
    while True:
        x, y = next(batches)
        models["tfcomp"].train_on_batch(x, y)
        replan.on_train_batch_end(steps)
        steps += 1
        exchange = _exchange(models["tfcomp"])
        if _on_every_rank(plan_settled(exchange, replan, previous)):
            break
        if steps >= max_warmup_steps:
            capped = True
            break
        previous = exchange.last_entry
    for _ in range(steps):
        x, y = next(batches)
        models["horovod"].train_on_batch(x, y)
        models["horovod_again"].train_on_batch(x, y)
    times = {arm: [] for arm in STEADY_ARMS}
    replan_s, plan_changes = [], 0
    for round_index in range(rounds):
        x, y = next(batches)
        for arm in round_order(round_index, STEADY_ARMS):
            _barrier()
            start = time.perf_counter()
            models[arm].train_on_batch(x, y)
            times[arm].append(1e3 * (time.perf_counter() - start))
            if arm == "tfcomp":
                entry = exchange.last_entry
                start = time.perf_counter()
                replan.on_train_batch_end(steps + round_index)
                replan_s.append(time.perf_counter() - start)
                plan_changes += exchange.last_entry is not entry
    return {"times_ms": times, "warmup_steps": steps, "capped": capped, "plan_changes": plan_changes,
            "replan_callback_s": replan_s, **_plan_record(models["tfcomp"], replan)}


class _StepTimes(tf.keras.callbacks.Callback):
    """Each training batch's begin and end (perf_counter seconds), the end after the loss is fetched."""

    def __init__(self):
        super().__init__()
        self.begins, self.ends = [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.begins.append(time.perf_counter())

    def on_train_batch_end(self, batch, logs=None):
        float(logs["loss"])  # the step has finished
        self.ends.append(time.perf_counter())


def _fit(model_name: str, arm: str, steps: int) -> dict:
    """One arm's `model.fit` of `steps` steps (see the module docstring)."""
    model = _compiled(model_name, arm)
    timer = _StepTimes()
    callbacks = [timer, hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    replan = tfcomp.keras.Replan() if arm == "tfcomp" else None
    if replan is not None:
        callbacks.append(replan)
    data = _dataset(model_name)
    _barrier()
    start = time.perf_counter()
    model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=callbacks)
    fit_s = time.perf_counter() - start
    step_s = [end - begin for begin, end in zip(timer.begins, timer.ends)]
    return {"arm": arm, "model": model_name, "steps": steps, "fit_s": fit_s, "first_step_s": step_s[0],
            "until_first_step_s": timer.begins[0] - start, "step_s": step_s,
            "traces": model.train_function.experimental_get_tracing_count(), **_plan_record(model, replan)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=("steady", "fit"), required=True)
    parser.add_argument("--models", default="many_small,cnn,vit", help="steady: the models, comma-separated")
    parser.add_argument("--rounds", type=int, default=100, help="steady: interleaved rounds per model")
    parser.add_argument("--max_warmup_steps", type=int, default=400, help="steady: the most warm-up steps")
    parser.add_argument("--model", choices=BENCHMARK_MODELS, help="fit: the model")
    parser.add_argument("--arm", choices=ARMS, help="fit: the arm")
    parser.add_argument("--steps", type=int, default=300, help="fit: training steps")
    parser.add_argument("--json_out", required=True)
    args = parser.parse_args()
    # One CPU per host: one thread for ops, two for independent ops (Horovod's collectives wait in the
    # inter-op pool), as benchmarks/network_worker.py runs.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    hvd.init()
    if args.mode == "steady":
        models = args.models.split(",")
        unknown = [m for m in models if m not in BENCHMARK_MODELS]
        if unknown:
            parser.error(f"--models: unknown model {unknown[0]!r} (one of {', '.join(BENCHMARK_MODELS)})")
        record = {"models": {m: _steady(m, args.rounds, args.max_warmup_steps) for m in models}}
    else:
        if args.model is None or args.arm is None:
            parser.error("--mode=fit needs --model and --arm")
        record = _fit(args.model, args.arm, args.steps)
    if hvd.rank() == 0:
        record.update(workers=hvd.size(), machine=machine_header())
        with open(args.json_out, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
