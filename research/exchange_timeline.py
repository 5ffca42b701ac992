"""The training step's timeline on the emulated cluster: when each gradient is ready, when each
bucket's exchange ends, against the end of the backward pass; and the plan re-made with them.

    python -m research.exchange_timeline [--workers=2] [--rate=1gbit] [--steps=90]
        [--replan_after=30] [--check_every=20] [--out_dir=research/results]

Needs root (benchmarks/cluster.py). One `horovodrun -np K` job (one worker per host) trains the
Fashion-MNIST CNN of examples/models.py on random batches (the timeline does not depend on the
pixels) with model.fit, once per configuration, in this order: every bucket dense (DRAGONN with
strategy="dense": one bucket), the same re-planned after --replan_after steps with the ready
times measured (tfcomp.keras.Replan without checks: dense buckets that overlap the backward pass),
the same with the prediction checked every --check_every steps after that (Replan's default:
re-planned where the measured exchange departs from the prediction by more than 25 %), and DRAGONN
0.01 with its default plan, re-planned, and re-planned and checked. Each reports the exchange's timeline
(tfcomp.timeline: medians over the last 20 steps), the plan's buckets, the plan's predicted end of
the exchange with the measured ready times, and the median training step (from one batch's end to
the next, over the steps after the re-plan and the new plan's trial: from --replan_after + 25 on,
for every configuration alike; the timeline's 20 steps are the last ones), the median of the
last --last_steps steps (after any re-plan by a check), and each check's figures. Writes exchange_timeline.json and
exchange_timeline.md into --out_dir.
"""

import dataclasses
import json
import sys
import time

from absl import app, flags

from benchmarks.tables import write_results

__all__ = ["summarise"]

FLAGS = flags.FLAGS
flags.DEFINE_enum("role", "launcher", ["launcher", "worker"], "launcher: runs the job; worker: one rank of it.")
flags.DEFINE_integer("workers", 2, "Workers K, one host each.")
flags.DEFINE_string("rate", "1gbit", "Link rate per host (e.g. 1gbit), or 'none' (unshaped).")
flags.DEFINE_integer("steps", 90, "Training steps per configuration.")
flags.DEFINE_integer("replan_after", 30, "Steps before the re-planned configuration re-plans.")
flags.DEFINE_integer("batch_size", 32, "Batch size per worker.")
flags.DEFINE_integer("check_every", 20, "Steps between the checked configurations' checks of the prediction.")
flags.DEFINE_integer("last_steps", 30, "The median step of the last this many steps is reported too.")
flags.DEFINE_string("out_dir", "research/results", "Where the JSON and Markdown go.")
flags.DEFINE_string("json_out", None, "Worker: where rank 0 writes the record.")

CONFIGS = ("dense", "dense re-planned", "dense re-planned, checked", "DRAGONN 0.01 default plan",
           "DRAGONN 0.01 re-planned", "DRAGONN 0.01 re-planned, checked")


def _worker() -> None:
    import horovod.tensorflow.keras as hvd
    import numpy as np
    import tensorflow as tf

    import tfcomp
    from examples.models import build_model
    from tfcomp import planning
    from tfcomp.trial import trial_schedule

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    rng = np.random.default_rng(hvd.rank())
    n = FLAGS.batch_size * FLAGS.steps
    x = rng.random([n, 28, 28, 1], dtype=np.float32)
    y = rng.integers(0, 10, n)
    # After a re-plan, a plan that compresses is tried (23 steps, 11 of them dense): not timed.
    timed_from = FLAGS.replan_after + len(trial_schedule(tfcomp.DRAGONN(0.01).trial_steps)) + 2

    class StepClock(tf.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.ends = []

        def on_train_batch_end(self, batch, logs=None):
            self.ends.append(time.perf_counter())

    record = {}
    for config in CONFIGS:
        tf.keras.utils.set_random_seed(0)
        model = build_model("cnn", (28, 28, 1))
        compression = tfcomp.DRAGONN(0.01, strategy="dense") if config.startswith("dense") else tfcomp.DRAGONN(0.01)
        opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01), compression=compression)
        model.compile(opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        clock = StepClock()
        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), clock]
        replan = None
        if "re-planned" in config:
            replan = tfcomp.keras.Replan(after_steps=FLAGS.replan_after,
                                         check_every=FLAGS.check_every if config.endswith("checked") else None)
            callbacks.append(replan)
        model.fit(x, y, batch_size=FLAGS.batch_size, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
        exchange = tfcomp.exchange_of(opt)
        measured = exchange.timeline.read()
        plan = exchange.plan
        ready = measured["ready_seconds"]
        priced = dataclasses.replace(plan, ready={p: ready[p] for b in plan.buckets for p in b.positions})
        steps = np.diff(clock.ends)[timed_from - 1:]
        trial = exchange.trial.read() if exchange.trial is not None else None
        record[config] = {
            "backward_ms": 1e3 * measured["backward_seconds"],
            "ready_ms": [1e3 * t for t in ready],
            "buckets": [{"strategy": b.strategy, "tensors": len(b.positions), "elements": b.elements,
                         "ready_ms": 1e3 * max(ready[p] for p in b.positions), "end_ms": 1e3 * end}
                        for b, end in zip(plan.buckets, measured["bucket_end_seconds"])],
            "predicted_end_ms": 1e3 * planning.predicted_exchange_time(priced),
            "step_ms": 1e3 * float(np.median(steps)),
            "last_steps_ms": 1e3 * float(np.median(np.diff(clock.ends)[-FLAGS.last_steps:])),
            "trial": trial,
            "checks": [] if replan is None else [
                {key: c[key] for key in ("predicted_seconds", "measured_seconds", "departure", "changed",
                                         "overlap_slowdown", "recalibrated")} for c in replan.checks],
        }
    if hvd.rank() == 0:
        with open(FLAGS.json_out, "w") as f:
            json.dump(record, f, indent=1)


def summarise(record: dict) -> str:
    """Markdown: per configuration, the backward pass, each bucket's ready and end times, the
    predicted and measured end of the exchange, and the median step."""
    lines = ["| configuration | backward ends (ms) | buckets: strategy, tensors, ready -> end (ms) | exchange ends, "
             "measured (ms) | predicted (ms) | median step (ms) | last steps (ms) | checks: measured / predicted "
             "(ms), slowdown, plan changed |", "|---|---|---|---|---|---|---|---|"]
    for config, r in record.items():
        buckets = "; ".join(f"{b['strategy']} x{b['tensors']}: {b['ready_ms']:.1f} -> {b['end_ms']:.1f}"
                            for b in r["buckets"])
        end = max([b["end_ms"] for b in r["buckets"]] + [r["backward_ms"]])
        checks = "; ".join(f"{1e3 * c['measured_seconds']:.1f} / {1e3 * c['predicted_seconds']:.1f}, "
                           f"{c['overlap_slowdown']:.2f}x{', recalibrated' if c['recalibrated'] else ''}"
                           f"{', changed' if c['changed'] else ''}" for c in r.get("checks", [])) or "—"
        last = r.get("last_steps_ms")
        lines.append(f"| {config} | {r['backward_ms']:.1f} | {buckets} | {end:.1f} | {r['predicted_end_ms']:.1f} | "
                     f"{r['step_ms']:.1f} | {'—' if last is None else f'{last:.1f}'} | {checks} |")
    return "\n".join(lines)


def _launcher() -> None:
    from benchmarks.cluster import Cluster, exit_unless_available

    exit_unless_available("exchange_timeline")
    with Cluster(hosts=FLAGS.workers, rate=None if FLAGS.rate == "none" else FLAGS.rate) as cluster:
        command = cluster.horovodrun_args(np=FLAGS.workers) + [
            sys.executable, "-m", "research.exchange_timeline", "--role=worker", f"--steps={FLAGS.steps}",
            f"--replan_after={FLAGS.replan_after}", f"--batch_size={FLAGS.batch_size}",
            f"--check_every={FLAGS.check_every}", f"--last_steps={FLAGS.last_steps}"]
        record = cluster.run_json(command, "--json_out", "the timeline job", env={"TF_CPP_MIN_LOG_LEVEL": "2"},
                                  timeout=1800)
    write_results(FLAGS.out_dir, f"exchange_timeline_{FLAGS.rate}_k{FLAGS.workers}",
                  {"workers": FLAGS.workers, "rate": FLAGS.rate, "steps": FLAGS.steps, "record": record},
                  summarise(record))


def main(argv):
    del argv
    _worker() if FLAGS.role == "worker" else _launcher()


if __name__ == "__main__":
    app.run(main)
