"""Worker side of tests/test_entry_points.py: Horovod's TF2 custom-loop patterns with tfcomp
compressors, run under horovodrun; writes one JSON of findings per rank.

    horovodrun -np 2 -H localhost:2 --gloo python -m tests.entry_points_worker --out DIR [--mismatch KIND]

Every pattern trains on rank-dependent random data and records numbers (spreads across ranks,
differences from plain Horovod, counts of exchanges, plans and steps); the pytest side asserts on
them. With --mismatch the ranks are given different compressors or models on purpose and the
worker records the error each rank raised and how long it took.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

import tfcomp
from tfcomp import horovod_glue, planner

__all__ = []

STEPS = 4
COMPRESSORS = {
    "NoCompression": tfcomp.NoCompression,
    "FP16": tfcomp.FP16,
    "TopK ratio 1": lambda: tfcomp.TopK(1.0, strategy="allgather", min_elements=1),
    "TopK": lambda: tfcomp.TopK(0.05, planning="off", min_elements=256),
    "DRAGONN": lambda: tfcomp.DRAGONN(0.05, planning="off", min_elements=256),
    "DGC": lambda: tfcomp.DGC(0.05, planning="off", min_elements=256),
}
# What plain Horovod's tape gives for the same training, where tfcomp must equal it.
HOROVOD_EQUIVALENT = {"NoCompression": hvd.Compression.none, "FP16": hvd.Compression.fp16,
                      "TopK ratio 1": hvd.Compression.none}


def make_model(seed: int = 0) -> tf.keras.Model:
    tf.keras.utils.set_random_seed(seed)
    return tf.keras.Sequential([tf.keras.layers.Dense(24, activation="tanh", input_shape=(32,)),
                                tf.keras.layers.Dense(4)])


def local_batches():
    rng = np.random.default_rng(2000 + hvd.rank())
    return [(tf.constant(rng.standard_normal((16, 32)), tf.float32), tf.constant(rng.standard_normal((16, 4)), tf.float32))
            for _ in range(STEPS)]


def spread(arrays) -> float:
    """Max |value - value on rank 0| over the arrays, the same on every rank."""
    worst = 0.0
    for a in arrays:
        root = hvd.broadcast(tf.constant(a), root_rank=0).numpy()
        worst = max(worst, float(np.max(np.abs(a - root))))
    return float(hvd.allreduce(tf.constant(worst), op=hvd.Max).numpy())


def train_with_tape(make_compression, in_function: bool, partial: bool = False):
    """Horovod's examples/tensorflow2 loop: the DistributedGradientTape is built inside the step,
    which runs as a tf.function or eagerly. Returns the trained weights."""
    model = make_model()
    opt = tf.keras.optimizers.SGD(0.05)

    def step(x, y, first):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
        if partial:
            tape = hvd.PartialDistributedGradientTape(tape, compression=make_compression(),
                                                      local_layers=[model.layers[-1]])
        else:
            tape = hvd.DistributedGradientTape(tape, compression=make_compression())
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables(), root_rank=0)
        return loss

    run = tf.function(step) if in_function else step
    for n, (x, y) in enumerate(local_batches()):
        run(x, y, n == 0)
    return model.get_weights()


def check_tapes(report):
    """Every compressor with the tape inside and outside a tf.function: one exchange per setting,
    one plan, the step counter and residuals carried over, weights the same on every rank, and
    the lossless ones equal to plain Horovod's tape."""
    plans_made = []
    original_plan = planner.Planner.plan

    def counted(self, *args, **kwargs):
        plans_made.append(1)
        return original_plan(self, *args, **kwargs)

    planner.Planner.plan = counted
    try:
        for name, make in COMPRESSORS.items():
            for in_function in (True, False):
                label = f"{name} {'tf.function' if in_function else 'eager'}"
                horovod_glue._tape_exchanges.clear()
                plans_made.clear()
                weights = train_with_tape(make, in_function)
                exchanges = list(horovod_glue._tape_exchanges.values())
                report[f"spread/{label}"] = spread(weights)
                report[f"exchanges/{label}"] = len(exchanges)
                report[f"plans/{label}"] = len(plans_made)
                report[f"steps/{label}"] = int(exchanges[0].step.numpy())
                report[f"residuals/{label}"] = len(exchanges[0].memory.residuals)
                if name in HOROVOD_EQUIVALENT:
                    plain = train_with_tape(lambda: HOROVOD_EQUIVALENT[name], in_function)
                    report[f"horovod_differs/{label}"] = max(float(np.max(np.abs(a - b))) for a, b in zip(weights, plain))
    finally:
        planner.Planner.plan = original_plan
    horovod_glue._tape_exchanges.clear()
    weights = train_with_tape(COMPRESSORS["DRAGONN"], True, partial=True)
    report["spread/partial tape, global layer"] = spread(weights[:2])
    report["spread/partial tape, local layer"] = spread(weights[2:])


def check_watched_tensors(report):
    """A tape over watched tensors (no variables): error feedback keyed by position, carried over
    eager calls and retraces; float64 gradients reduced as Horovod reduces them."""
    rng = np.random.default_rng(hvd.rank())
    x = tf.constant(rng.standard_normal(2000).astype(np.float32))
    base = np.array([1e300, 1.0, -2.0] * 100)
    wide = tf.constant(base * (1 + hvd.rank()), tf.float64)  # beyond float32's range

    def gradients():
        with tf.GradientTape() as tape:
            tape.watch(x)
            tape.watch(wide)
            losses = [tf.reduce_sum(x ** 3), 0.5 * tf.reduce_sum(wide ** 2)]
        tape = hvd.DistributedGradientTape(tape, compression=tfcomp.TopK(0.1, planning="off", min_elements=256))
        return tape.gradient(losses, [x, wide])

    horovod_glue._tape_exchanges.clear()
    for run in (gradients, tf.function(gradients)):
        for _ in range(3):
            gx, gw = run()
    exchange, = horovod_glue._tape_exchanges.values()
    report["watched/steps"] = int(exchange.step.numpy())
    report["watched/residuals"] = len(exchange.memory.residuals)
    report["watched/residual_nonzero"] = bool(np.any(exchange.memory.residuals[0].numpy() != 0))
    report["watched/spread"] = spread([gx.numpy()])
    average = base * (1 + 2) / 2  # ranks 0 and 1
    report["watched/float64_dtype"] = gw.dtype.name
    report["watched/float64_relative_error"] = float(np.max(np.abs(gw.numpy() - average) / np.abs(average)))


def check_rank0_checkpoint(report, directory: str):
    """Horovod's usual pattern: only rank 0 saves, every rank restores its file. With
    gather_state on every rank before the save, the resumed run equals the uninterrupted one;
    without it, each rank goes on with rank 0's memory."""
    batches = local_batches() * 2  # 8 steps, saved after 4

    def fresh(name):
        model = make_model()
        model(batches[0][0][:1])
        make = COMPRESSORS[name] if name != "DGC+momentum" else (
            lambda: tfcomp.DGC(0.05, momentum=0.9, planning="off", min_elements=256))
        opt = tfcomp.DistributedOptimizer(tf.keras.optimizers.SGD(0.05), compression=make())
        return model, opt

    def train(model, opt, part):
        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            opt.minimize(loss, model.trainable_variables, tape=tape)

        for x, y in part:
            step(x, y)

    for name in ("DRAGONN", "DGC", "TopK", "DGC+momentum"):
        straight = fresh(name)
        train(*straight, batches)
        for gather in (True, False):
            label = f"{name}{'' if gather else ' without gather_state'}"
            model, opt = fresh(name)
            train(model, opt, batches[:4])
            if gather:
                tfcomp.checkpointing.gather_state(opt)
            prefix = os.path.join(directory, label.replace(" ", "_"), "ckpt")
            path = tf.train.Checkpoint(model=model, optimizer=opt).save(prefix) if hvd.rank() == 0 else ""
            path = hvd.broadcast_object(path, root_rank=0)  # also a barrier: the file is written
            resumed, resumed_opt = fresh(name)
            tf.train.Checkpoint(model=resumed, optimizer=resumed_opt).restore(path)
            train(resumed, resumed_opt, batches[4:])
            report[f"rank0_resume_differs/{label}"] = max(
                float(np.max(np.abs(a - b))) for a, b in zip(straight[0].get_weights(), resumed.get_weights()))
            report[f"rank0_resume_step/{label}"] = int(tfcomp.exchange_of(resumed_opt).step.numpy())


def check_mismatch(report, kind: str):
    """Ranks that disagree: every rank must raise PlanMismatchError, quickly."""
    rng = np.random.default_rng(hvd.rank())
    width = 64 if kind == "model" and hvd.rank() == 1 else 48
    variables = [tf.Variable(tf.zeros([width, 300])), tf.Variable(tf.zeros([300]))]
    grads = [tf.constant(rng.standard_normal(v.shape).astype(np.float32)) for v in variables]
    compressor = tfcomp.TopK(0.01) if kind == "compressor" and hvd.rank() == 1 else tfcomp.DRAGONN(0.01)
    start = time.perf_counter()
    try:
        tfcomp.GradientExchange(compressor)(grads, variables)
        report["mismatch/error"] = ""
    except tfcomp.planning.PlanMismatchError as error:
        report["mismatch/error"] = str(error)
    report["mismatch/seconds"] = time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--mismatch", choices=["compressor", "model"])
    args = parser.parse_args()
    hvd.init()
    report = {"size": hvd.size(), "rank": hvd.rank()}
    if args.mismatch:
        check_mismatch(report, args.mismatch)
    else:
        check_tapes(report)
        check_watched_tensors(report)
        check_rank0_checkpoint(report, args.out)
    with open(os.path.join(args.out, f"rank{hvd.rank()}.json"), "w") as f:
        json.dump(report, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
