"""Never slower: plain Horovod against tfcomp's default where compression cannot pay (issue 44).

    python -m benchmarks.never_slower --mode=steady [--hosts=2,4] [--rates=none,10gbit,1gbit]
        [--models=many_small,cnn,vit] [--rounds=100] [--max_warmup_steps=400]
    python -m benchmarks.never_slower --mode=first_step [--hosts=4] [--models=cnn,vit] [--jobs=5]
    python -m benchmarks.never_slower --mode=job [--hosts=4] [--models=cnn,vit] [--jobs=5] [--steps=300]
        [--json_out=FILE] [--markdown_out=FILE] [--nopin_cpus] [--calibration_cache=none]

Two arms (`benchmarks/never_slower_worker.py`): `horovod`, hvd.DistributedOptimizer(optimizer);
`tfcomp`, hvd.DistributedOptimizer(optimizer, compression=tfcomp.DRAGONN()) with
`tfcomp.keras.Replan()` (README's quick start), the same Keras optimizer (SGD with momentum 0.9 for
many_small and the CNN, Adam for the ViT) and the same initial weights. Each --hosts value brings up
`benchmarks.cluster` with that many hosts, one worker each (each host on a CPU of its own unless
--nopin_cpus), and each --rates value shapes its links (none: unshaped).

  steady      per (hosts, rate), one job: per model, the tfcomp arm stepped until its plan is
              settled (the horovod arm as many steps), then --rounds interleaved rounds of one step
              each: each arm's median step, the median of the per-round ratios tfcomp / horovod with
              a bootstrap 95 % interval, the same for a second plain Horovod arm against the first
              (the control: the ratio noise alone gives), the plan that ran, the warm-up steps.
  first_step  per (hosts, rate, model), --jobs fresh jobs of each arm, alternating (tfcomp first),
              without a calibration cache: the first `fit` step's wall time on rank 0 (its trace
              and tfcomp's first plan included; the job runs --first_step_steps steps), the medians
              and the overhead tfcomp - horovod.
  job         per (hosts, rate, model), --jobs pairs of --steps-step `fit` jobs (the order within a
              pair alternates): fit's wall time on rank 0 and the whole horovodrun job's, per pair
              tfcomp / horovod and the median.

Rates default to none, 10gbit and 1gbit for steady and to none for the others. Calibration is not
cached (TFCOMP_CALIBRATION_CACHE=none) unless --calibration_cache names a file (never for
first_step). Prints a table (with the command, machine, commit and date above it) and writes
--markdown_out and --json_out. Needs root (the cluster).
"""

import datetime
import json
import os
import subprocess
import sys
import time

from absl import app, flags

from benchmarks import never_slower_report as report
from benchmarks.cluster import Cluster, exit_unless_available, parse_rate
from benchmarks.tables import markdown_table, text_table

__all__ = []

FLAGS = flags.FLAGS
flags.DEFINE_enum("mode", "steady", ["steady", "first_step", "job"], "What to measure (see the docstring).")
flags.DEFINE_list("hosts", ["2", "4"], "Emulated hosts (one worker each), one cluster per value.")
flags.DEFINE_list("rates", None, "Link rates (none: unshaped); default none,10gbit,1gbit for steady, none otherwise.")
flags.DEFINE_list("models", list(report.MODELS), f"Models, of {', '.join(report.MODELS)}.")
flags.DEFINE_integer("rounds", 100, "steady: interleaved rounds per model.")
flags.DEFINE_integer("max_warmup_steps", 400, "steady: the most steps the tfcomp arm takes to settle its plan.")
flags.DEFINE_integer("jobs", 5, "first_step: jobs of each arm; job: pairs of jobs.")
flags.DEFINE_integer("first_step_steps", 2, "first_step: fit steps per job (the first is measured).")
flags.DEFINE_integer("steps", 300, "job: fit steps per job.")
flags.DEFINE_bool("pin_cpus", True, "Each host on a CPU of its own (CPU (i - 1) mod the CPUs), as in "
                  "benchmarks/network_validation.py.")
flags.DEFINE_string("calibration_cache", "none", "TFCOMP_CALIBRATION_CACHE of steady and job runs (first_step: none).")
flags.DEFINE_integer("job_timeout", 3600, "Seconds one horovodrun may take.")
flags.DEFINE_string("json_out", None, "Write every job's record and the summaries to this JSON file.")
flags.DEFINE_string("markdown_out", None, "Write the table, with its header, to this Markdown file.")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DEFAULT_RATES = {"steady": ["none", "10gbit", "1gbit"], "first_step": ["none"], "job": ["none"]}


def _worker_env(cache: str) -> dict:
    return {"TFCOMP_CALIBRATION_CACHE": cache, "TF_CPP_MIN_LOG_LEVEL": "3",
            "PYTHONPATH": os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")]))}


def _worker(cluster, label: str, cache: str, *args) -> dict:
    """Runs the worker under horovodrun on every host of `cluster`; returns rank 0's record with
    "job_s", the horovodrun job's wall time."""
    command = cluster.horovodrun_args() + [sys.executable, "-m", "benchmarks.never_slower_worker", *args]
    start = time.perf_counter()
    record = cluster.run_json(command, "--json_out", label, env=_worker_env(cache), timeout=FLAGS.job_timeout)
    record["job_s"] = time.perf_counter() - start
    return record


def _steady(cluster, hosts: int, rate: str) -> tuple:
    record = _worker(cluster, f"steady, {hosts} hosts, {rate}", FLAGS.calibration_cache, "--mode=steady",
                     f"--models={','.join(FLAGS.models)}", f"--rounds={FLAGS.rounds}",
                     f"--max_warmup_steps={FLAGS.max_warmup_steps}")
    rows = []
    for model, run in record["models"].items():
        rows.append({"hosts": hosts, "rate": rate, "model": model, "plan": run["plan"],
                     "warmup_steps": run["warmup_steps"], "capped": run["capped"], "plan_changes": run["plan_changes"],
                     **report.steady_summary(run["times_ms"]["horovod"], run["times_ms"]["tfcomp"],
                                             run["times_ms"].get("horovod_again"))})
        print(text_table(report.steady_table(), rows[-1:]), flush=True)
    return rows, [record]


def _first_step(cluster, hosts: int, rate: str) -> tuple:
    rows, records = [], []
    for model in FLAGS.models:
        jobs = []
        for i, arm in enumerate(report.first_step_order(FLAGS.jobs)):
            jobs.append(_worker(cluster, f"first step, {model} {arm} job {i // 2}", "none", "--mode=fit",
                                f"--model={model}", f"--arm={arm}", f"--steps={FLAGS.first_step_steps}"))
            print(f"{hosts} hosts, {rate}, {model}, {arm}: first step {jobs[-1]['first_step_s']:.2f} s", flush=True)
        plan = next(j["plan"] for j in jobs if j["arm"] == "tfcomp")
        rows.append({"hosts": hosts, "rate": rate, "model": model, "plan": plan,
                     "traces": report.trace_counts(jobs), **report.first_step_summary(jobs)})
        records += jobs
    return rows, records


def _job(cluster, hosts: int, rate: str) -> tuple:
    rows, records = [], []
    for model in FLAGS.models:
        pairs = []
        for i, order in enumerate(report.job_order(FLAGS.jobs)):
            pair = {arm: _worker(cluster, f"job, {model} {arm} pair {i}", FLAGS.calibration_cache, "--mode=fit",
                                 f"--model={model}", f"--arm={arm}", f"--steps={FLAGS.steps}") for arm in order}
            pairs.append(pair)
            print(f"{hosts} hosts, {rate}, {model}, pair {i}: fit {pair['tfcomp']['fit_s']:.1f} s (tfcomp) against "
                  f"{pair['horovod']['fit_s']:.1f} s (horovod)", flush=True)
        rows.append({"hosts": hosts, "rate": rate, "model": model, "steps": FLAGS.steps,
                     "plan": pairs[-1]["tfcomp"]["plan"], **report.job_summary(pairs)})
        records += pairs
    return rows, records


_MODES = {"steady": (_steady, report.steady_table), "first_step": (_first_step, report.first_step_table),
          "job": (_job, report.job_table)}
_MODE_TEXT = {
    "steady": "{rounds} interleaved rounds per model after the tfcomp arm's plan settled (one step of each arm a "
              "round, order shuffled per round), rank 0's step times; the ratio is the median of the per-round ratios "
              "tfcomp / horovod, its interval a bootstrap 95 % interval",
    "first_step": "{jobs} fresh jobs of each arm per model, alternating, no calibration cache: the first fit step "
                  "on rank 0 (trace included), medians over the jobs",
    "job": "{jobs} pairs of {steps}-step fit jobs per model: fit's wall time on rank 0 and the whole horovodrun "
           "job's, per pair tfcomp / horovod, medians over the pairs",
}


def _commit() -> str:
    done = subprocess.run(["git", "-C", REPO_ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", REPO_ROOT, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return (done.stdout.strip() or "unknown") + (" with local changes" if dirty else "")


def _header(machine: str, started: datetime.datetime) -> str:
    command = " ".join(["python -m benchmarks.never_slower", *sys.argv[1:]])
    pinned = "each host on a CPU of its own" if FLAGS.pin_cpus else "hosts sharing all CPUs"
    cache = "none" if FLAGS.mode == "first_step" else FLAGS.calibration_cache
    return (f"Never slower, --mode={FLAGS.mode}: " + _MODE_TEXT[FLAGS.mode].format(
                rounds=FLAGS.rounds, jobs=FLAGS.jobs, steps=FLAGS.steps) +
            f". Emulated hosts ({pinned}), one worker each (1 intra-op, 2 inter-op threads), batch 32 per worker; "
            f"tfcomp = DRAGONN() with Replan(); calibration cache: {cache}. Command: `{command}`; "
            f"commit {_commit()}; {started:%Y-%m-%d %H:%M} UTC. Workers' machine: {machine}")


def _flat(records: list) -> list:
    """The worker records in `records`, a pair of them ({arm: record}) counted as two."""
    return [r for item in records for r in (item.values() if "machine" not in item else [item])]


def _write(rows: list, records: list, started: datetime.datetime, final: bool) -> None:
    """Writes --json_out and --markdown_out with what has been measured so far (after every
    cluster setting, so a run that fails later keeps it); `final`: also prints the table."""
    machine = next((r["machine"] for r in _flat(records)), "unknown")
    header = _header(machine, started)
    columns = _MODES[FLAGS.mode][1]()
    if final:
        print(f"\n{header}\n\n{text_table(columns, rows)}")
    if FLAGS.markdown_out:
        with open(FLAGS.markdown_out, "w") as f:
            f.write(f"{header}\n\n{markdown_table(columns, rows)}\n")
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump({"header": header, "summaries": rows, "records": records}, f, indent=1)


def _checked_flags() -> tuple:
    """(hosts, rates) from the flags; app.UsageError for a bad flag."""
    unknown = [m for m in FLAGS.models if m not in report.MODELS]
    if unknown:
        raise app.UsageError(f"--models: {unknown[0]!r} is not one of {', '.join(report.MODELS)}")
    hosts = []
    for value in FLAGS.hosts:
        if not value.isdigit() or int(value) < 2:
            raise app.UsageError(f"--hosts: {value!r} is not a number of hosts >= 2")
        hosts.append(int(value))
    for name in ("rounds", "jobs", "steps", "first_step_steps", "max_warmup_steps"):
        if getattr(FLAGS, name) < 1:
            raise app.UsageError(f"--{name}: {getattr(FLAGS, name)} is not >= 1")
    rates = FLAGS.rates or _DEFAULT_RATES[FLAGS.mode]
    for rate in rates:
        try:
            parse_rate(rate)
        except ValueError:
            raise app.UsageError(f"--rates: {rate!r} is not a link rate such as 1gbit, 10gbit or none") from None
    return hosts, rates


def main(argv):
    del argv
    hosts, rates = _checked_flags()
    exit_unless_available("never_slower")
    measure = _MODES[FLAGS.mode][0]
    started = datetime.datetime.now(datetime.timezone.utc)
    rows, records = [], []
    for count in hosts:
        with Cluster(hosts=count, pin_cpus=FLAGS.pin_cpus) as cluster:
            for rate in rates:
                cluster.set_rate(None if rate == "none" else rate)
                new_rows, new_records = measure(cluster, count, rate)
                rows += new_rows
                records += new_records
                _write(rows, records, started, final=False)
    _write(rows, records, started, final=True)


if __name__ == "__main__":
    app.run(main)
