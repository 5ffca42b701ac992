"""Calibration's time and steadiness on the emulated cluster: fresh calibrations, one job each.

    python -m benchmarks.calibration_benchmark [--hosts=4] [--models=cnn,vit] [--rates=1gbit,none]
        [--modes=first_step,between_steps] [--runs=5]
        [--compressor_config=dragonn_0.01] [--nopin_cpus] [--burst_ms=1] [--out_dir=benchmarks/results]
        [--name=calibration_benchmark]

Needs root (benchmarks/cluster.py). For each run, model, rate and mode (interleaved: every model,
rate and mode once before the next run), one `horovodrun` job on --hosts emulated hosts, one worker
each, builds the model of `examples.models` and has a `tfcomp.GradientExchange` (the compressor of
`benchmarks.tta_worker` for --compressor_config, one TensorFlow thread) exchange gradients of the
model's shapes (random, fixed), calibrating as training does:

  * first_step: the exchange's first call (which plans everything dense), then
    `GradientExchange.calibrate()`, all at once, and the plan (timed together as the first call);
  * between_steps: the first call plans everything dense and calibrates nothing, and after each
    later call `calibrate_step()` runs the gate (after 10 calls: where compression cannot pay,
    nothing is calibrated) and then pieces of the calibration within its budget, until it is done.

Without --cached there is no calibration cache: each job is a fresh process and pays what a job
on hosts that never calibrated pays. With --cached the runs share one cache (in a temporary
directory): a model's first run measures its compression costs, the later ones (as every job after
a host's first) measure the networks only. It reports per model, rate, mode and source of the
compression costs: the first call's seconds (tracing the exchange's step and running it, plus
whatever calibration it does), the calibration's seconds in all, the steps it ran between and the
most it added to one of them, the next call's seconds (which traces the exchange's step again where
calibration between steps installed a plan that compresses) and the median of the 5 calls after it,
the figures calibrated (median, min, max and spread = (max - min) /
median of the per-element compression cost c1 and the fixed cost), and the plan each run made; and
writes NAME.json (every run) and NAME.md into --out_dir.
"""

import json
import os
import statistics
import sys
import tempfile
import time

from absl import app, flags

from benchmarks.tables import write_results

__all__ = []

FLAGS = flags.FLAGS
flags.DEFINE_enum("role", "launcher", ["launcher", "worker"], "launcher: runs the jobs; worker: one calibration.")
flags.DEFINE_integer("hosts", 4, "Emulated hosts, one worker each.")
flags.DEFINE_list("models", ["cnn", "vit"], "Models of examples/models.py.")
flags.DEFINE_list("rates", ["1gbit", "none"], "Link rates per host ('none': unshaped).")
flags.DEFINE_list("modes", ["first_step", "between_steps"], "When the exchange calibrates: on its first call "
                  "(first_step), or in pieces between calls (between_steps).")
flags.DEFINE_bool("pin_cpus", True, "Run host i's processes on CPU (i - 1) mod the CPUs usable, as each host of a real "
                  "cluster computes on its own (benchmarks/cluster.py); --nopin_cpus lets them share all CPUs.")
flags.DEFINE_float("burst_ms", 1.0, "Each link's token bucket, in milliseconds of its rate (benchmarks/cluster.py).")
flags.DEFINE_integer("runs", 5, "Fresh calibrations per model, rate and mode.")
flags.DEFINE_string("compressor_config", "dragonn_0.01", "Compressor configuration of benchmarks/tta_configs.py.")
flags.DEFINE_string("out_dir", "benchmarks/results", "Where the JSON and Markdown go.")
flags.DEFINE_string("name", "calibration_benchmark", "The results' file name, without extension.")
flags.DEFINE_bool("cached", False, "Share one calibration cache among the runs (compression costs measured by "
                  "a model's first run, reused by the others), instead of none.")
flags.DEFINE_string("calibrated_model", "cnn", "Worker: the model (benchmarks.tta_worker's flags are its own).")
_MODES = ("first_step", "between_steps")
flags.DEFINE_enum("mode", "first_step", _MODES, "Worker: when the exchange calibrates.")
flags.register_validator("modes", lambda modes: set(modes) <= set(_MODES), f"--modes: each one of {', '.join(_MODES)}")
flags.DEFINE_string("record", None, "Worker: where rank 0 writes its record.")
_MAX_CALIBRATING_STEPS = 1000  # a worker that has not finished calibrating by then fails (it cannot hang)
_LATER_CALLS = 6  # calls timed after calibration: the first (which traces a new plan), the median of the others


def _worker() -> None:
    import horovod.tensorflow.keras as hvd
    import numpy as np
    import tensorflow as tf

    import tfcomp
    from benchmarks.tta_configs import compressor_and_model
    from tfcomp import calibration, planning

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    compressor, model = compressor_and_model(FLAGS.compressor_config, FLAGS.calibrated_model)
    variables = model.trainable_variables
    rng = np.random.default_rng(hvd.rank())
    gradients = [tf.constant(rng.standard_normal(v.shape).astype(np.float32)) for v in variables]
    sizes = [int(v.shape.num_elements()) for v in reversed(variables)]
    path = calibration.cache.cache_path()
    key = calibration.cache_key(compressor, hvd.global_process_set, sum(sizes), sizes)
    cache_hit = bool(path and hvd.rank() == 0 and calibration.cache.read_cache(path, key, hvd.size()))
    exchange = tfcomp.GradientExchange(compressor)
    start = time.perf_counter()
    exchange(gradients, variables)
    if FLAGS.mode == "first_step":
        exchange.calibrate()
    first_call = time.perf_counter() - start
    first_calibration = exchange.calibration_seconds
    step_seconds = []  # calibrate_step's seconds after each call
    while exchange.calibration_pending:
        if len(step_seconds) == _MAX_CALIBRATING_STEPS:
            raise RuntimeError(f"calibration not done after {_MAX_CALIBRATING_STEPS} steps")
        exchange(gradients, variables)
        start = time.perf_counter()
        exchange.calibrate_step()
        step_seconds.append(time.perf_counter() - start)
    calls = []  # the next calls: the first traces the plan calibration installed, if it installed one
    for _ in range(_LATER_CALLS):
        start = time.perf_counter()
        exchange(gradients, variables)
        calls.append(time.perf_counter() - start)
    plan = exchange.plan
    if hvd.rank() == 0 and FLAGS.record:
        with open(FLAGS.record, "w") as f:
            json.dump({"mode": FLAGS.mode, "first_call_seconds": first_call, "first_call_calibration_seconds":
                       first_calibration, "seconds": exchange.calibration_seconds, "step_seconds": step_seconds,
                       "next_call_seconds": calls[0], "later_call_seconds": float(np.median(calls[1:])),
                       "cache_hit": cache_hit, "cpu_allocator": calibration.cpu_allocator(),
                       "figures": plan.cluster.to_list(), "parameters": sum(sizes), "tensors": len(sizes),
                       "plan": [[b.strategy, len(b.positions), b.elements] for b in plan.buckets],
                       "predicted_exchange_s": planning.predicted_exchange_time(plan)}, f)


def _run_one(cluster, model: str, mode: str, cache: str) -> dict:
    command = cluster.horovodrun_args() + [sys.executable, "-m", "benchmarks.calibration_benchmark", "--role=worker",
                                           f"--calibrated_model={model}", f"--mode={mode}",
                                           f"--compressor_config={FLAGS.compressor_config}"]
    return cluster.run_json(command, "--record", f"{model} {mode}",
                            env={"TFCOMP_CALIBRATION_CACHE": cache, "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=900)


def _spread(values) -> str:
    median = statistics.median(values)
    return (f"{median:.3g} ({min(values):.3g} to {max(values):.3g}, spread "
            f"{(max(values) - min(values)) / median:.0%})" if median > 0 else "0")


def summarise(runs: list) -> str:
    """Markdown: per model, rate, mode and source of the compression costs (measured, or from the
    cache), the first call's seconds, calibration's seconds in all, the steps calibration ran
    between and the most it added to one, and the figures' medians and spreads."""
    lines = ["| model | rate | mode | compression costs | runs | first call s | calibration s | steps | "
             "most added to a step s | next call s | later calls s | c1 ns/element | fixed ms | allreduce Gbit/s | "
             "plans |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for group_key in dict.fromkeys((r["model"], r["rate"], r["mode"], r["cache_hit"]) for r in runs):
        model, rate, mode, hit = group_key
        group = [r for r in runs if (r["model"], r["rate"], r["mode"], r["cache_hit"]) == group_key]
        figures = [r["figures"] for r in group]  # ClusterModel.to_list order
        plans = sorted({"+".join(f"{s}x{n}" for s, n, _ in r["plan"]) for r in group})
        steps = [len(r["step_seconds"]) for r in group]
        most = [max(r["step_seconds"], default=0.0) for r in group]
        lines.append(f"| {model} | {rate} | {mode} | {'cached' if hit else 'measured'} | {len(group)} | "
                     f"{_spread([r['first_call_seconds'] for r in group])} | {_spread([r['seconds'] for r in group])} | "
                     f"{_spread(steps)} | {_spread(most)} | {_spread([r['next_call_seconds'] for r in group])} | "
                     f"{_spread([r['later_call_seconds'] for r in group])} | {_spread([1e9 * f[6] for f in figures])} | "
                     f"{_spread([1e3 * f[10] for f in figures])} | {_spread([8 * f[2] / 1e9 for f in figures])} | "
                     f"{'; '.join(plans)} |")
    return "\n".join(lines)


def _launcher() -> None:
    from benchmarks.cluster import Cluster, exit_unless_available

    exit_unless_available("calibration_benchmark")
    runs = []
    cache_dir = tempfile.TemporaryDirectory()
    cache = os.path.join(cache_dir.name, "calibration.json") if FLAGS.cached else "none"
    with cache_dir, Cluster(hosts=FLAGS.hosts, rate=None, pin_cpus=FLAGS.pin_cpus,
                            burst_seconds=FLAGS.burst_ms / 1e3) as cluster:
        for run in range(FLAGS.runs):
            for model in FLAGS.models:
                for rate in FLAGS.rates:
                    cluster.set_rate(None if rate == "none" else rate)
                    for mode in FLAGS.modes:
                        record = _run_one(cluster, model, mode, cache)
                        record.update(model=model, rate=rate, run=run)
                        runs.append(record)
                        print(f"run {run} {model} {rate} {mode}: first call {record['first_call_seconds']:.2f} s, "
                              f"calibration {record['seconds']:.2f} s over {len(record['step_seconds'])} steps "
                              f"(at most {max(record['step_seconds'], default=0.0):.2f} s), c1 "
                              f"{1e9 * record['figures'][6]:.2f} ns, plan {record['plan']}", flush=True)
    write_results(FLAGS.out_dir, FLAGS.name, {"hosts": FLAGS.hosts, "cpus": cluster.cpus, "burst_ms": FLAGS.burst_ms,
                                              "config": FLAGS.compressor_config, "runs": runs},
                  summarise(runs))


def main(argv):
    del argv
    _worker() if FLAGS.role == "worker" else _launcher()


if __name__ == "__main__":
    app.run(main)
