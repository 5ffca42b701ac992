"""Time to accuracy on an emulated cluster: does the model train to the same accuracy sooner?

    python -m benchmarks.time_to_accuracy [--hosts=4] [--models=cnn,vit] [--seeds=2] [--steps=400]
        [--resume] [--out_dir=benchmarks/results]

Needs root (benchmarks/cluster.py). On --hosts emulated hosts, one Horovod worker each, it trains
each model of --models (examples/models.py) on Fashion-MNIST with every configuration of `RUNS`:

  1 Gbit/s per host  dense, fp16, dragonn_0.01, dragonn_0.001, dgc_0.01, topk_0.01
  10 Gbit/s          dense, dragonn_0.01
  unshaped           dense, dragonn_0.01

(`benchmarks/tta_worker.py` says what each is: `dense` is plain Horovod, the tfcomp ones run
tfcomp's default plan), with seeds 0 .. --seeds-1, interleaved: every seed runs every model and
configuration before the next seed starts, the link rate re-shaped in place between runs. Each run
records test accuracy against training wall-clock time (the clock stops for evaluation; it includes
tracing and tfcomp's calibration).

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
import statistics
import sys
import tempfile
import time
from pathlib import Path

from absl import app, flags

from benchmarks.cluster import Cluster, cluster_unavailable_reason
from benchmarks.tables import markdown_table

__all__ = ["RUNS", "summarise", "time_to_target"]

FLAGS = flags.FLAGS
flags.DEFINE_integer("hosts", 4, "Emulated hosts, one worker each.")
flags.DEFINE_list("models", ["cnn", "vit"], "Models of examples/models.py.")
flags.DEFINE_integer("seeds", 2, "Seeds 0 .. seeds-1 per configuration.")
flags.DEFINE_integer("steps", 400, "Training steps per run.")
flags.DEFINE_integer("eval_every", 50, "Steps between evaluations.")
flags.DEFINE_list("rates", ["1gbit", "10gbit", "none"], "Link rates to run (a subset of RUNS' keys).")
flags.DEFINE_bool("resume", False, "Keep the runs already in the JSON and run only the missing ones.")
flags.DEFINE_string("out_dir", "benchmarks/results", "Where the JSON, Markdown and PNGs go.")
flags.DEFINE_integer("run_timeout", 900, "Seconds before one training run is abandoned.")

RUNS = {
    "1gbit": ("dense", "fp16", "dragonn_0.01", "dragonn_0.001", "dgc_0.01", "topk_0.01"),
    "10gbit": ("dense", "dragonn_0.01"),
    "none": ("dense", "dragonn_0.01"),
}
RATE_NAMES = {"1gbit": "1 Gbit/s", "10gbit": "10 Gbit/s", "none": "unshaped"}
TARGET_MARGIN = 0.005  # the target is dense's final accuracy less half a point


def _key(run: dict) -> tuple:
    return run["model"], run["rate"], run["config"], run["seed"]


def time_to_target(timeline: list, target: float) -> float:
    """Training seconds at the first evaluation whose accuracy is at least `target` (inf if none).
    timeline: [[steps, seconds, accuracy], ...] in training order."""
    return next((seconds for _, seconds, accuracy in timeline if accuracy >= target), float("inf"))


def _mean(values):
    return statistics.fmean(values) if values else float("nan")


def summarise(runs: list) -> tuple:
    """(Markdown text, rows): one row per model, rate and configuration, over its seeds."""
    rows = []
    for model in sorted({r["model"] for r in runs}):
        of_model = [r for r in runs if r["model"] == model]
        dense_final = _mean([r["final_accuracy"] for r in of_model if r["config"] == "dense"])
        target = dense_final - TARGET_MARGIN
        for rate in RUNS:
            dense_runs = [r for r in of_model if r["rate"] == rate and r["config"] == "dense"]
            dense_time = _mean([time_to_target(r["timeline"], target) for r in dense_runs])
            for config in RUNS[rate]:
                seeds = sorted((r for r in of_model if r["rate"] == rate and r["config"] == config),
                               key=lambda r: r["seed"])
                if not seeds:
                    continue
                times = [time_to_target(r["timeline"], target) for r in seeds]
                finals = [r["final_accuracy"] for r in seeds]
                rows.append({
                    "model": model, "rate": rate, "config": config, "target": target, "times": times,
                    "time": _mean(times), "speedup": dense_time / _mean(times),
                    "final": _mean(finals), "finals": finals, "final_vs_dense": _mean(finals) - dense_final,
                    "train_seconds": _mean([r["timeline"][-1][1] for r in seeds]),
                    "sent_fraction": _mean([r["sent_bytes_per_step"] / r["dense_bytes_per_step"] for r in seeds]),
                    "sent_mb": _mean([r["sent_bytes_per_step"] for r in seeds]) / 1e6,
                    "calibration": _mean([r["calibration_seconds"] for r in seeds]),
                })
    seconds = lambda t: "not reached" if t == float("inf") else f"{t:.1f}"
    columns = [
        ("model", 5, lambda r: r["model"]),
        ("link", 9, lambda r: RATE_NAMES[r["rate"]]),
        ("configuration", 14, lambda r: r["config"]),
        ("time to target s (seeds)", 24, lambda r: f"{seconds(r['time'])} ({', '.join(seconds(t) for t in r['times'])})"),
        ("speed-up vs dense", 8, lambda r: "—" if r["time"] == float("inf") else f"{r['speedup']:.2f}x"),
        ("final accuracy % (seeds)", 24, lambda r: f"{100 * r['final']:.2f} ({', '.join(f'{100 * f:.2f}' for f in r['finals'])})"),
        ("vs dense, points", 8, lambda r: f"{100 * r['final_vs_dense']:+.2f}"),
        ("training s", 8, lambda r: f"{r['train_seconds']:.1f}"),
        ("calibration s", 8, lambda r: f"{r['calibration']:.1f}"),
        ("MB sent per step (of dense)", 12, lambda r: f"{r['sent_mb']:.3f} ({100 * r['sent_fraction']:.2f} %)"),
    ]
    targets = sorted({(r["model"], r["target"]) for r in rows})
    text = "Targets: " + ", ".join(f"{m} {100 * t:.2f} %" for m, t in targets) + "\n\n"
    return text + markdown_table(columns, rows, first_left=True), rows


def plot(runs: list, rows: list, out_dir: Path) -> list:
    """One PNG per model and rate: accuracy against training seconds. Returns the paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    targets = {r["model"]: r["target"] for r in rows}
    for model, rate in sorted({(r["model"], r["rate"]) for r in runs}):
        figure, axes = plt.subplots(figsize=(7, 4.5))
        for index, config in enumerate(RUNS[rate]):
            seeds = [r for r in runs if (r["model"], r["rate"], r["config"]) == (model, rate, config)]
            for n, run in enumerate(sorted(seeds, key=lambda r: r["seed"])):
                seconds = [t for _, t, _ in run["timeline"]]
                accuracy = [100 * a for _, _, a in run["timeline"]]
                axes.plot(seconds, accuracy, color=f"C{index}", alpha=0.85, marker=".",
                          label=config if n == 0 else None)
        axes.axhline(100 * targets[model], color="grey", linestyle="--", linewidth=1, label="target")
        axes.set_xlabel("training wall-clock seconds (calibration included, evaluation excluded)")
        axes.set_ylabel("test accuracy %")
        axes.set_ylim(bottom=max(0.0, 100 * targets[model] - 25))
        axes.set_title(f"{model}, Fashion-MNIST, {FLAGS.hosts} hosts, {RATE_NAMES[rate]} per host")
        axes.legend(loc="lower right", fontsize=8)
        axes.grid(alpha=0.3)
        path = out_dir / f"time_to_accuracy_{model}_{rate}.png"
        figure.tight_layout()
        figure.savefig(path, dpi=110)
        plt.close(figure)
        paths.append(path)
    return paths


def _run_one(cluster, model, rate, config, seed) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run.json")
        command = cluster.horovodrun_args() + [
            sys.executable, "-m", "benchmarks.tta_worker", f"--model={model}", f"--config={config}",
            f"--seed={seed}", f"--steps={FLAGS.steps}", f"--eval_every={FLAGS.eval_every}",
            f"--json_out={out}"]
        started = time.perf_counter()
        # No calibration cache: every run calibrates, as a job's first run does (the cache is keyed
        # by host and layout, not by the link rate this benchmark changes).
        done = cluster.run(command, env={"TFCOMP_CALIBRATION_CACHE": "none"}, timeout=FLAGS.run_timeout, capture=True)
        if done.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"{model} {rate} {config} seed {seed} failed (exit {done.returncode}):\n"
                               f"{(done.stdout or '')[-3000:]}{(done.stderr or '')[-3000:]}")
        with open(out) as f:
            run = json.load(f)
    run.update(rate=rate, job_seconds=time.perf_counter() - started)
    return run


def main(argv):
    del argv
    reason = cluster_unavailable_reason()
    if reason:
        sys.exit(f"time_to_accuracy: {reason}")
    out_dir = Path(FLAGS.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "time_to_accuracy.json"
    runs = json.loads(json_path.read_text())["runs"] if FLAGS.resume and json_path.exists() else []
    done = {_key(r) for r in runs}
    todo = [(model, rate, config, seed) for seed in range(FLAGS.seeds) for model in FLAGS.models
            for rate in FLAGS.rates for config in RUNS[rate] if (model, rate, config, seed) not in done]
    started = time.time()
    with Cluster(hosts=FLAGS.hosts, rate=None) as cluster:
        for n, (model, rate, config, seed) in enumerate(todo):
            cluster.set_rate(None if rate == "none" else rate)
            run = _run_one(cluster, model, rate, config, seed)
            runs.append(run)
            json_path.write_text(json.dumps({"hosts": FLAGS.hosts, "steps": FLAGS.steps, "runs": runs}, indent=1))
            print(f"[{n + 1}/{len(todo)}, {(time.time() - started) / 60:.1f} min] {model} {rate} {config} seed {seed}: "
                  f"final {100 * run['final_accuracy']:.2f} %, {run['timeline'][-1][1]:.1f} s training, "
                  f"{run['job_seconds']:.0f} s job", flush=True)
    text, rows = summarise(runs)
    (out_dir / "time_to_accuracy.md").write_text(text + "\n")
    for path in plot(runs, rows, out_dir):
        print(f"wrote {path}")
    print(text)


if __name__ == "__main__":
    app.run(main)
