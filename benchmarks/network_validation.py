"""Validation of the cost model: measured against predicted time per training step on emulated networks.

It brings up an emulated cluster of --hosts hosts (2 by default; benchmarks/cluster.py: one
network namespace per host, each with its own full-duplex link and, unless --nopin_cpus, its own CPU
where the machine has enough: host i on CPU (i - 1) mod the CPUs), and for each network setting
shapes every link to that rate (`tc ... tbf`; "unshaped" leaves them alone) and runs
`benchmarks/network_worker.py` under `horovodrun -np <hosts> -H <hosts> --gloo --network-interface eth0`, one worker per host. The worker
calibrates tfcomp on that network, interleaves the configurations round by round, and reports
measured and predicted times per step (see its docstring). Calibration is not cached across
settings (TFCOMP_CALIBRATION_CACHE=none): each setting is a different network.

(Until 2026-11-23 both workers shared one shaped loopback, so the rate was split between them; the
results recorded before then are of that set-up. Until 2026-11-27 the hosts shared all CPUs: on 2
hosts, 2 interleaved pairs of runs gave median errors of 6.3 and 3.7 % pinned, 12.7 and 7.0 % not.)

Needs root. Run from the repository root:

  python -m benchmarks.network_validation [--hosts=2] [--settings=unshaped,500mbit,1gbit,2gbit,5gbit,10gbit]
      [--models=giant,many_small,cnn,vit] [--rounds=11] [--steps=6] [--nopin_cpus] [--burst_ms=1]
      [--horovod_cache_capacity=0] [--json_out=FILE]
      [--markdown_out=benchmarks/results/network_validation.md]
"""

import datetime
import json
import os
import platform
import statistics
import sys
import tempfile

from absl import app, flags

from benchmarks.cluster import Cluster, cluster_unavailable_reason

__all__ = ["summarise"]

FLAGS = flags.FLAGS
flags.DEFINE_list("settings", ["unshaped", "500mbit", "1gbit", "2gbit", "5gbit", "10gbit"],
                  "Link rates of the hosts (e.g. 1gbit), or 'unshaped'.")
flags.DEFINE_integer("hosts", 2, "Emulated hosts, one worker each.")
flags.DEFINE_bool("pin_cpus", True, "Run host i's processes on CPU (i - 1) mod the CPUs usable, as each host of a real "
                  "cluster computes on its own (benchmarks/cluster.py); --nopin_cpus lets them share all CPUs.")
flags.DEFINE_float("burst_ms", 1.0, "Each link's token bucket, in milliseconds of its rate (benchmarks/cluster.py).")
flags.DEFINE_integer("rounds", 11, "Interleaved rounds per setting (the median is reported).")
flags.DEFINE_integer("steps", 6, "Training steps per configuration per round.")
flags.DEFINE_list("models", ["giant", "many_small", "cnn", "vit"], "Models to train (see benchmarks/network_worker.py).")
flags.DEFINE_list("configs", None, "Only these configurations (default: all; 'compute' or 'compute_synced' is "
                  "needed for predictions).")
flags.DEFINE_integer("horovod_cache_capacity", None, "HOROVOD_CACHE_CAPACITY for the workers (0: Horovod's response "
                     "cache off; unset: Horovod's default, 1024). With it off, a K = 2 grid's timed exchanges kept "
                     "within 0.91 to 1.34x of what each job measured in its warm-up; on, 0.70 to 2.47x (2026-11-27).")
flags.DEFINE_string("markdown_out", None, "Write the tables to this markdown file.")
flags.DEFINE_string("json_out", None, "Write every setting's raw results to this JSON file.")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _strategies(result: dict) -> str:
    """The strategies of a configuration's plan, as the tables print them ('dense' without a plan)."""
    return "+".join(result.get("strategies", ["dense"]))


def _cpu_times() -> tuple:
    """(steal, total) jiffies of all CPUs since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return fields[7], sum(fields[:8])  # user nice system idle iowait irq softirq steal


def run_setting(cluster: Cluster, setting: str) -> dict:
    """One horovodrun on the cluster's hosts, their links shaped to `setting`; returns the worker's
    JSON, with `cpu_steal`: the share of this machine's CPU time the host took for others during
    the run."""
    cluster.set_rate(None if setting == "unshaped" else setting)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        env = {"TFCOMP_CALIBRATION_CACHE": "none", "TF_CPP_MIN_LOG_LEVEL": "3",
               "PYTHONPATH": os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")]))}
        if FLAGS.horovod_cache_capacity is not None:
            env["HOROVOD_CACHE_CAPACITY"] = str(FLAGS.horovod_cache_capacity)
        command = cluster.horovodrun_args() + [
            sys.executable, "-m", "benchmarks.network_worker", "--out", out,
            f"--rounds={FLAGS.rounds}", f"--steps={FLAGS.steps}", f"--models={','.join(FLAGS.models)}"]
        if FLAGS.configs:
            command.append(f"--configs={','.join(FLAGS.configs)}")
        steal_before, total_before = _cpu_times()
        result = cluster.run(command, env=env, capture=True, timeout=1800)
        steal_after, total_after = _cpu_times()
        if result.returncode != 0:
            log = os.path.join(tempfile.gettempdir(), f"tfcomp_validation_{setting}.log")
            with open(log, "w") as f:
                f.write(result.stdout + "\n" + result.stderr)
            raise RuntimeError(f"{setting}: horovodrun failed (whole output in {log})\n{result.stderr[-3000:]}")
        with open(out) as f:
            data = json.load(f)
        data["cpu_steal"] = (steal_after - steal_before) / max(total_after - total_before, 1)
        return data


COMPUTE_LABELS = {"compute": "compute only", "compute_synced": "compute + one-float allreduce"}


def _cache_text(flag, environment) -> str:
    """How the workers ran Horovod's response cache: from --horovod_cache_capacity, else the
    HOROVOD_CACHE_CAPACITY they inherit, else Horovod's default."""
    capacity = flag if flag is not None else environment
    if capacity is None:
        return "on (Horovod's default capacity)"
    return "off" if int(capacity) == 0 else f"capacity {capacity}"


def _row(results, model, config):
    return next((r for r in results if r["model"] == model and r["config"] == config), None)


def _trial_text(trials) -> str:
    """The warm-up's trials of a plan (`tfcomp.trial.PlanTrial.read` each), as text."""
    return "; ".join(f"{'kept' if t['compressed'] else 'dropped'} ({t['compressed_ms']:.1f} against "
                     f"{t['dense_ms']:.1f} ms dense)" for t in trials) or "none"


AGAINST_HOROVOD = ("plan", "forced_dense")  # the tfcomp configurations tabled against plain Horovod


def _plan_against_horovod(by_setting: dict) -> str:
    """A table: per network, model and tfcomp configuration of `AGAINST_HOROVOD` that ran, its step
    against plain Horovod's, as the ratio of their medians and round by round (the two run in every
    round, so the ratio of a round cancels what drifts between rounds: its median and range), with
    the plan's strategies and its trials in warm-up."""
    lines = ["| network | model | config | strategies | trials in warm-up | / Horovod, medians | "
             "same, round by round: median (min to max) |", "|---|---|---|---|---|---|---|"]
    for setting, data in by_setting.items():
        for model in dict.fromkeys(r["model"] for r in data["results"]):
            horovod = _row(data["results"], model, "horovod_dense")
            for config in AGAINST_HOROVOD:
                run = _row(data["results"], model, config)
                if run is None or horovod is None:
                    continue
                paired = [a / b for a, b in zip(run["samples_s"], horovod["samples_s"])]
                lines.append(f"| {setting} | {model} | {config} | {_strategies(run)} | "
                             f"{_trial_text(run.get('trials', []))} | {run['measured_s'] / horovod['measured_s']:.3f} | "
                             f"{statistics.median(paired):.3f} ({min(paired):.2f} to {max(paired):.2f}) |")
    return "\n".join(lines)


def summarise(by_setting: dict) -> tuple:
    """(markdown text, {"errors": [...], "checks": {...}}) from {setting: worker JSON}."""
    lines = ["| network | per-worker Gbit/s (calibrated) | model | config | strategies | measured ms | "
             "predicted ms | error |", "|---|---|---|---|---|---|---|---|"]
    errors = []
    for setting, data in by_setting.items():
        for r in data["results"]:
            if r["config"] in COMPUTE_LABELS:
                lines.append(f"| {setting} | | {r['model']} | {COMPUTE_LABELS[r['config']]} | | "
                             f"{1e3 * r['measured_s']:.1f} | | |")
                continue
            if "predicted_s" not in r:  # plain Horovod is priced with the plan configuration's figures
                lines.append(f"| {setting} | | {r['model']} | {r['config']} | {_strategies(r)} | "
                             f"{1e3 * r['measured_s']:.1f} | — | |")
                continue
            error = r["predicted_s"] / r["measured_s"] - 1
            if r["config"] in ("horovod_dense", "dragonn", "plan"):
                errors.append(abs(error))
            gbits = r["cluster"][2] * 8 / 1e9
            lines.append(f"| {setting} | {gbits:.2f} | {r['model']} | {r['config']} | "
                         f"{_strategies(r)} | {1e3 * r['measured_s']:.1f} | "
                         f"{1e3 * r['predicted_s']:.1f} | {100 * error:+.1f}% |")
    text = "\n".join(lines) + "\n\n" + _plan_against_horovod(by_setting)
    checks = {}
    if errors:
        checks["prediction_error_median"] = statistics.median(errors)
        checks["prediction_error_max"] = max(errors)
    ratios = {"unshaped_many_small_plan_over_horovod": ("unshaped", "many_small", "plan", "horovod_dense"),
              "1gbit_giant_horovod_over_plan": ("1gbit", "giant", "horovod_dense", "plan"),
              "1gbit_giant_plan_over_compute": ("1gbit", "giant", "plan", "compute"),
              "1gbit_many_small_per_tensor_over_plan": ("1gbit", "many_small", "per_tensor", "plan")}
    for name, (network, model, numerator, denominator) in ratios.items():
        results = by_setting.get(network, {}).get("results", [])
        top, bottom = _row(results, model, numerator), _row(results, model, denominator)
        if top and bottom:
            checks[name] = top["measured_s"] / bottom["measured_s"]
            # The two were timed one after the other in every round: the ratio round by round
            # cancels what drifts between rounds on a shared machine.
            checks[name + "_paired"] = statistics.median(
                a / b for a, b in zip(top["samples_s"], bottom["samples_s"]))
    steal = [f"{setting} {100 * data['cpu_steal']:.0f} %" for setting, data in by_setting.items() if "cpu_steal" in data]
    if steal:
        text += "\n\nCPU time the host took for other machines during each setting (steal): " + ", ".join(steal) + "."
    text += ("\n\n| check | measured |\n|---|---|\n" + "\n".join(
        f"| {name} | {value:.3f} |" if "error" not in name else f"| {name} | {100 * value:.1f}% |"
        for name, value in checks.items()) +
        "\n\nA ratio is of the two medians; `_paired` is the median of the ratios round by round.")
    return text, checks


def main(argv):
    del argv
    reason = cluster_unavailable_reason()
    if reason:
        raise app.UsageError(reason)
    by_setting = {}
    with Cluster(hosts=FLAGS.hosts, pin_cpus=FLAGS.pin_cpus, burst_seconds=FLAGS.burst_ms / 1e3) as cluster:
        for setting in FLAGS.settings:
            print(f"{setting} ...", flush=True)
            by_setting[setting] = run_setting(cluster, setting)
    text, _ = summarise(by_setting)
    pinned = f", pinned to CPUs {','.join(map(str, cluster.cpus))}" if cluster.cpus else ""
    header = (f"Network validation, {datetime.date.today()}, {platform.node()} ({os.cpu_count()} vCPUs), "
              f"{FLAGS.hosts} workers on {FLAGS.hosts} emulated hosts{pinned}, {FLAGS.rounds} interleaved rounds of "
              f"{FLAGS.steps} steps (many_small: 3x the rounds, "
              f"4x the steps), medians. Command: "
              f"`python -m benchmarks.network_validation --hosts={FLAGS.hosts} --settings={','.join(FLAGS.settings)} "
              f"--models={','.join(FLAGS.models)} --rounds={FLAGS.rounds} --steps={FLAGS.steps}"
              f"{'' if FLAGS.pin_cpus else ' --nopin_cpus'} --burst_ms={FLAGS.burst_ms:g}"
              f"{' --configs=' + ','.join(FLAGS.configs) if FLAGS.configs else ''}"
              f"{'' if FLAGS.horovod_cache_capacity is None else f' --horovod_cache_capacity={FLAGS.horovod_cache_capacity}'}`"
              f"; Horovod's response cache "
              f"{_cache_text(FLAGS.horovod_cache_capacity, os.environ.get('HOROVOD_CACHE_CAPACITY'))}\n\n")
    print(header + text)
    if FLAGS.markdown_out:
        with open(FLAGS.markdown_out, "w") as f:
            f.write(header + text + "\n")
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump(by_setting, f, indent=1)


if __name__ == "__main__":
    app.run(main)
