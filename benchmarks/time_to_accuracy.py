"""Time to accuracy on an emulated cluster: does the model train to the same accuracy sooner?

    python -m benchmarks.time_to_accuracy [--hosts=4] [--models=cnn,vit] [--seeds=2] [--steps=400]
        [--batch_size=32] [--test_examples=4000]
        [--rates=1gbit,10gbit,none] [--configs=dense,...] [--calibration_cache=warm|none] [--resume]
        [--out_dir=benchmarks/results]

Needs root (benchmarks/cluster.py). On --hosts emulated hosts, one Horovod worker each, it trains
each model of --models (examples/models.py) on Fashion-MNIST with every configuration of `RUNS`:

  1 Gbit/s per host  dense, fp16, dragonn_0.01, dragonn_0.001, dgc_0.01, topk_0.01, intquant_8
  10 Gbit/s          dense, dragonn_0.01
  unshaped           dense, dragonn_0.01

(`benchmarks/tta_worker.py` says what each is: `dense` is plain Horovod, the tfcomp ones run
tfcomp's default plan), with seeds 0 .. --seeds-1, interleaved: every seed runs every model and
configuration before the next seed starts, the link rate re-shaped in place between runs. Each run
records test accuracy against training wall-clock time (the clock stops for evaluation; it includes
tracing and tfcomp's calibration). With --calibration_cache=warm (default) the compression costs
and each model's gradient-ready times come from a cache filled before the timed runs (each run
still measures its networks), as in every job after a host's first; with none, every run measures
everything.

The target accuracy of a model is the mean final accuracy of its dense runs (all rates) less 0.5
point. A run's time to target is the training time at the first evaluation at or above the target.
The summary gives per model, rate and configuration: time to target (mean over seeds, each seed
listed), its speed-up over dense at the same rate, final accuracy and its difference to dense, and
the bytes one worker sends per step. It writes time_to_accuracy.json (every run; --resume skips
the runs already there), time_to_accuracy.md and one PNG per model and rate (accuracy against
wall-clock, one colour per configuration, one line per seed) into --out_dir.
"""

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from absl import app, flags

from benchmarks.cluster import Cluster, exit_unless_available
from benchmarks.tta_report import RUNS, plot, summarise

__all__ = []

FLAGS = flags.FLAGS
flags.DEFINE_integer("hosts", 4, "Emulated hosts, one worker each.")
flags.DEFINE_list("models", ["cnn", "vit"], "Models of examples/models.py.")
flags.DEFINE_integer("seeds", 2, "Seeds 0 .. seeds-1 per configuration.")
flags.DEFINE_integer("steps", 400, "Training steps per run.")
flags.DEFINE_integer("eval_every", 50, "Steps between evaluations.")
flags.DEFINE_integer("batch_size", 32, "Batch size per worker (the CNN's SGD rate scales with it).")
flags.DEFINE_integer("test_examples", 4000, "Test images evaluated, shared out among the workers.")
flags.DEFINE_list("rates", ["1gbit", "10gbit", "none"], "Link rates to run (a subset of RUNS' keys).")
flags.DEFINE_list("configs", None, "Configurations to run (default: every one of RUNS at each rate).")
flags.DEFINE_bool("resume", False, "Keep the runs already in the JSON and run only the missing ones.")
flags.DEFINE_string("out_dir", "benchmarks/results", "Where the JSON, Markdown and PNGs go.")
flags.DEFINE_integer("run_timeout", 900, "Seconds before one training run is abandoned.")
flags.DEFINE_integer("warmup_job_steps", 40, "--calibration_cache=warm: steps of each model's training job that "
                     "measures its gradients' ready times (Replan caches them after 30).")
flags.DEFINE_enum("calibration_cache", "warm", ["warm", "none"],
                  "warm: the runs share one calibration cache, filled before the timed runs by one calibration "
                  "job per model and tfcomp configuration and one short training job per model (its gradients' "
                  "ready times), so that every run measures its networks and takes the compression costs and "
                  "the ready times from the cache, as every job after a host's first does; none: no cache, "
                  "every run measures everything, as a job on hosts that never calibrated does.")

_UNCOMPRESSED = ("dense", "fp16")  # plain Horovod: no calibration

def _key(run: dict) -> tuple:
    return run["model"], run["rate"], run["config"], run["seed"]


def _warm_cache(cluster, cache, todo) -> None:
    """Fills `cache` as the jobs before a host's later jobs would have: the compression costs of
    every model and tfcomp configuration in `todo`, one calibration job each
    (benchmarks/calibration_benchmark.py's worker), and each model's gradient-ready times, one
    short training job each (`tta_worker` for --warmup_job_steps steps, whose `Replan` measures
    them after 30 steps and caches them for the first plan of the next job of the model: they are
    the backward pass's, whatever the configuration). All on the slowest link rate of the runs,
    where the costs are measured in full (on a fast one a first stage may find that compression
    cannot pay there and measure no more)."""
    rates = [rate for rate in ("1gbit", "10gbit", "none") if any(t[1] == rate for t in todo)]
    cluster.set_rate(None if rates[0] == "none" else rates[0])
    compressed = dict.fromkeys((model, config) for model, _, config, _ in todo if config not in _UNCOMPRESSED)
    for model, config in compressed:
        _run_warming_job(cluster, cache, f"calibrating {model} {config}", [
            "benchmarks.calibration_benchmark", "--role=worker", f"--calibrated_model={model}",
            f"--compressor_config={config}"])
        print(f"calibration cache: {model} {config} measured", flush=True)
    first_config = {}
    for model, config in compressed:
        first_config.setdefault(model, config)
    for model, config in first_config.items():
        _run_warming_job(cluster, cache, f"ready times of {model}", [
            "benchmarks.tta_worker", f"--model={model}", f"--config={config}", "--seed=1000",
            f"--steps={FLAGS.warmup_job_steps}", f"--eval_every={FLAGS.warmup_job_steps}",
            f"--batch_size={FLAGS.batch_size}", "--test_examples=400"])
        print(f"calibration cache: {model} ready times measured ({config}, {FLAGS.warmup_job_steps} steps)",
              flush=True)


def _run_warming_job(cluster, cache, what: str, module_args: list) -> None:
    command = cluster.horovodrun_args() + [sys.executable, "-m", *module_args]
    done = cluster.run(command, env={"TFCOMP_CALIBRATION_CACHE": cache}, timeout=FLAGS.run_timeout, capture=True)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {done.returncode}):\n"
                           f"{(done.stdout or '')[-3000:]}{(done.stderr or '')[-3000:]}")


def _run_one(cluster, model, rate, config, seed, cache) -> dict:
    command = cluster.horovodrun_args() + [
        sys.executable, "-m", "benchmarks.tta_worker", f"--model={model}", f"--config={config}",
        f"--seed={seed}", f"--steps={FLAGS.steps}", f"--eval_every={FLAGS.eval_every}",
        f"--batch_size={FLAGS.batch_size}", f"--test_examples={FLAGS.test_examples}"]
    started = time.perf_counter()
    run = cluster.run_json(command, "--json_out", f"{model} {rate} {config} seed {seed}",
                           env={"TFCOMP_CALIBRATION_CACHE": cache}, timeout=FLAGS.run_timeout)
    run.update(rate=rate, job_seconds=time.perf_counter() - started, calibration_cache=FLAGS.calibration_cache)
    return run


def main(argv):
    del argv
    exit_unless_available("time_to_accuracy")
    out_dir = Path(FLAGS.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "time_to_accuracy.json"
    runs = json.loads(json_path.read_text())["runs"] if FLAGS.resume and json_path.exists() else []
    done = {_key(r) for r in runs}
    todo = [(model, rate, config, seed) for seed in range(FLAGS.seeds) for model in FLAGS.models
            for rate in FLAGS.rates for config in RUNS[rate]
            if (model, rate, config, seed) not in done and (FLAGS.configs is None or config in FLAGS.configs)]
    started = time.time()
    cache_dir = tempfile.TemporaryDirectory()
    cache = os.path.join(cache_dir.name, "calibration.json") if FLAGS.calibration_cache == "warm" else "none"
    with cache_dir, Cluster(hosts=FLAGS.hosts, rate=None) as cluster:
        if FLAGS.calibration_cache == "warm" and todo:
            _warm_cache(cluster, cache, todo)
        for n, (model, rate, config, seed) in enumerate(todo):
            cluster.set_rate(None if rate == "none" else rate)
            run = _run_one(cluster, model, rate, config, seed, cache)
            runs.append(run)
            json_path.write_text(json.dumps({"hosts": FLAGS.hosts, "steps": FLAGS.steps, "runs": runs}, indent=1))
            print(f"[{n + 1}/{len(todo)}, {(time.time() - started) / 60:.1f} min] {model} {rate} {config} seed {seed}: "
                  f"final {100 * run['final_accuracy']:.2f} %, {run['timeline'][-1][1]:.1f} s training, "
                  f"{run['job_seconds']:.0f} s job", flush=True)
    text, rows = summarise(runs)
    (out_dir / "time_to_accuracy.md").write_text(text + "\n")
    for path in plot(runs, rows, out_dir, FLAGS.hosts):
        print(f"wrote {path}")
    print(text)


if __name__ == "__main__":
    app.run(main)
