"""The time-to-accuracy benchmark's configurations, summary table and plots (no flags: the driver,
benchmarks/time_to_accuracy.py, and the tests import it)."""

import statistics
from pathlib import Path

from benchmarks.tables import markdown_table

__all__ = ["RATE_NAMES", "RUNS", "TARGET_MARGIN", "plot", "summarise", "time_to_target"]

RUNS = {
    "1gbit": ("dense", "fp16", "dragonn_0.01", "dragonn_0.001", "dgc_0.01", "topk_0.01", "intquant_8",
              "dragonn_0.01_partitioned"),
    "10gbit": ("dense", "dragonn_0.01"),
    "none": ("dense", "dragonn_0.01"),
}
RATE_NAMES = {"1gbit": "1 Gbit/s", "10gbit": "10 Gbit/s", "none": "unshaped"}
TARGET_MARGIN = 0.005  # the target is dense's final accuracy less half a point


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


def plot(runs: list, rows: list, out_dir: Path, hosts: int) -> list:
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
        axes.set_title(f"{model}, Fashion-MNIST, {hosts} hosts, {RATE_NAMES[rate]} per host")
        axes.legend(loc="lower right", fontsize=8)
        axes.grid(alpha=0.3)
        path = out_dir / f"time_to_accuracy_{model}_{rate}.png"
        figure.tight_layout()
        figure.savefig(path, dpi=110)
        plt.close(figure)
        paths.append(path)
    return paths
