"""Calibration's time and steadiness on the emulated cluster: fresh calibrations, one job each.

    python -m benchmarks.calibration_benchmark [--hosts=4] [--models=cnn,vit] [--rates=1gbit,none]
        [--runs=5] [--compressor_config=dragonn_0.01] [--out_dir=benchmarks/results]

Needs root (benchmarks/cluster.py). For each run, model and rate (interleaved: every model and rate
once before the next run), one `horovodrun` job on --hosts emulated hosts, one worker each, builds
the model of `examples.models` and calibrates tfcomp for its gradients exactly as the exchange's
first step does (`tfcomp.calibration.calibrate` with the gradients' sizes in backprop order, the
compressor of `benchmarks.tta_worker` for --compressor_config, one TensorFlow thread). Without --cached
there is no calibration cache: each job is a fresh process and pays what a job's first step pays
on hosts that never calibrated. With --cached the runs share one cache (in a temporary directory):
a model's first run measures its compression costs, the later ones (as every job after a host's
first) measure the networks only. It reports per model, rate and source of the compression costs the
calibration seconds and the figures calibrated (median, min, max and spread = (max - min) / median
of the per-element compression cost c1 and the fixed cost), and the plan each run made, and writes
calibration_benchmark.json (every run) and calibration_benchmark.md into --out_dir.
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
flags.DEFINE_integer("runs", 5, "Fresh calibrations per model and rate.")
flags.DEFINE_string("compressor_config", "dragonn_0.01", "Compressor configuration of benchmarks/tta_configs.py.")
flags.DEFINE_string("out_dir", "benchmarks/results", "Where the JSON and Markdown go.")
flags.DEFINE_bool("cached", False, "Share one calibration cache among the runs (compression costs measured by "
                  "a model's first run, reused by the others), instead of none.")
flags.DEFINE_string("calibrated_model", "cnn", "Worker: the model (benchmarks.tta_worker's flags are its own).")
flags.DEFINE_string("record", None, "Worker: where rank 0 writes its record.")


def _worker() -> None:
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    from benchmarks.tta_configs import MODEL_OPTIMIZERS, make_compression
    from examples.models import build_model
    from tfcomp import calibration, planning

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    compressor, _ = make_compression(FLAGS.compressor_config, MODEL_OPTIMIZERS[FLAGS.calibrated_model][0])
    model = build_model(FLAGS.calibrated_model, (28, 28, 1), 10)
    tensors = [(i, v.name, int(v.shape.num_elements())) for i, v in reversed(list(enumerate(model.trainable_variables)))]
    sizes = [n for _, _, n in tensors]
    path = calibration._cache_path()
    key = calibration.cache_key(compressor, hvd.global_process_set, sum(sizes), sizes)
    cache_hit = bool(path and hvd.rank() == 0 and calibration._read_cache(path, key, hvd.size()))
    start = time.perf_counter()
    cluster = calibration.calibrate(compressor, hvd.global_process_set, max_elements=sum(sizes), tensor_elements=sizes)
    seconds = time.perf_counter() - start
    plan = planning.make_plan(tensors, compressor, cluster)
    if hvd.rank() == 0 and FLAGS.record:
        with open(FLAGS.record, "w") as f:
            json.dump({"seconds": seconds, "cache_hit": cache_hit, "cpu_allocator": calibration.cpu_allocator(),
                       "figures": cluster.to_list(), "parameters": sum(sizes),
                       "tensors": len(sizes), "plan": [[b.strategy, len(b.positions), b.elements] for b in plan.buckets],
                       "predicted_exchange_s": planning.predicted_exchange_time(plan)}, f)


def _run_one(cluster, model: str, cache: str) -> dict:
    command = cluster.horovodrun_args() + [sys.executable, "-m", "benchmarks.calibration_benchmark", "--role=worker",
                                           f"--calibrated_model={model}", f"--compressor_config={FLAGS.compressor_config}"]
    return cluster.run_json(command, "--record", model,
                            env={"TFCOMP_CALIBRATION_CACHE": cache, "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=600)


def _spread(values) -> str:
    median = statistics.median(values)
    return (f"{median:.3g} ({min(values):.3g} to {max(values):.3g}, spread "
            f"{(max(values) - min(values)) / median:.0%})" if median > 0 else "0")


def summarise(runs: list) -> str:
    """Markdown: per model, rate and source of the compression costs (measured, or from the cache),
    calibration seconds and the figures' medians and spreads."""
    lines = ["| model | rate | compression costs | runs | calibration s | c1 ns/element | fixed ms | "
             "allreduce Gbit/s | plans |", "|---|---|---|---|---|---|---|---|---|"]
    for group_key in dict.fromkeys((r["model"], r["rate"], r.get("cache_hit", False)) for r in runs):
        model, rate, hit = group_key
        group = [r for r in runs if (r["model"], r["rate"], r.get("cache_hit", False)) == group_key]
        figures = [r["figures"] for r in group]  # ClusterModel.to_list order
        plans = sorted({"+".join(f"{s}x{n}" for s, n, _ in r["plan"]) for r in group})
        lines.append(f"| {model} | {rate} | {'cached' if hit else 'measured'} | {len(group)} | "
                     f"{_spread([r['seconds'] for r in group])} | {_spread([1e9 * f[6] for f in figures])} | "
                     f"{_spread([1e3 * f[10] for f in figures])} | {_spread([8 * f[2] / 1e9 for f in figures])} | "
                     f"{'; '.join(plans)} |")
    return "\n".join(lines)


def _launcher() -> None:
    from benchmarks.cluster import Cluster, exit_unless_available

    exit_unless_available("calibration_benchmark")
    runs = []
    cache_dir = tempfile.TemporaryDirectory()
    cache = os.path.join(cache_dir.name, "calibration.json") if FLAGS.cached else "none"
    with cache_dir, Cluster(hosts=FLAGS.hosts, rate=None) as cluster:
        for run in range(FLAGS.runs):
            for model in FLAGS.models:
                for rate in FLAGS.rates:
                    cluster.set_rate(None if rate == "none" else rate)
                    record = _run_one(cluster, model, cache)
                    record.update(model=model, rate=rate, run=run)
                    runs.append(record)
                    print(f"run {run} {model} {rate}: {record['seconds']:.2f} s, c1 {1e9 * record['figures'][6]:.2f} "
                          f"ns, plan {record['plan']}", flush=True)
    write_results(FLAGS.out_dir, "calibration_benchmark",
                  {"hosts": FLAGS.hosts, "config": FLAGS.compressor_config, "runs": runs}, summarise(runs))


def main(argv):
    del argv
    _worker() if FLAGS.role == "worker" else _launcher()


if __name__ == "__main__":
    app.run(main)
