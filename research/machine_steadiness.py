"""How steady this machine's speed is from one fresh process to the next.

    python -m research.machine_steadiness [--jobs=10] [--cpus=2] [--model=cnn] [--rounds=21]
        [--compressor_config=dragonn_0.01] [--out_dir=research/results] [--name=machine_steadiness]

Issue 13 asks the per-element compression cost c1 to spread at most 20 % over five fresh
calibrations, and calibration measures the machine as it runs at that moment. This benchmark
starts --jobs times --cpus fresh processes at once, each pinned to a CPU of its own (as the pinned
hosts of the emulated cluster compute, `benchmarks/cluster.py`), one TensorFlow and one BLAS
thread each. Each process times, interleaved round by round for --rounds rounds:

  * probe: the compression probe calibration times at its largest size (the model's gradients as
    one bucket, `tfcomp.calibration.compression._exchange_probe` with `LocalCollectives` for 2 workers:
    accumulate with the residual, encode, decode of both payloads, new residual; nothing sent);
  * read: a memory read pass, NumPy's sum of 64 MiB of float32;
  * matmul: a compute pass, a 512 x 512 float32 matrix product.

It reports each process's medians, their spread over all processes ((max - min) / median), the
spread of each job's median probe time over its processes (as calibration takes the median of the
ranks' costs), and the spread of the probe's time over each reference's, taken round by round:
where the ratios are steady and the times are not, the machine's speed moved and the probe
measured it faithfully. And of all the ways to draw 5 of the jobs, how many have their medians
within issue 13's 20 %: how often even a perfect calibration, one that measured exactly this
probe's time, would meet that bound on this machine. Writes NAME.json (every process) and NAME.md
into --out_dir. No Horovod collectives, no root.
"""

import itertools
import json
import os
import statistics
import subprocess
import sys
import time

from absl import app, flags

from research.compression_cost_noise import spread
from benchmarks.tables import machine_header, write_results

__all__ = ["summarise"]

FLAGS = flags.FLAGS
_READ_ELEMENTS = 2**24  # 64 MiB of float32
_MATMUL_SIZE = 512
_WORKER_TIMEOUT_S = 600
_DRAWN_JOBS = 5  # issue 13: c1's spread over five fresh calibrations
_SPREAD_BOUND = 0.2  # at most 20 %


def _worker() -> None:
    os.sched_setaffinity(0, {FLAGS.cpu})
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from benchmarks.tta_configs import compressor_and_model
    from tfcomp import calibration

    compressor, model = compressor_and_model(FLAGS.compressor_config, FLAGS.model)
    elements = sum(int(v.shape.num_elements()) for v in model.trainable_variables)
    probe = calibration.compression._exchange_probe(calibration.cost_settings(compressor), 2, [[elements]])
    rng = np.random.default_rng(FLAGS.cpu)
    data = rng.standard_normal(_READ_ELEMENTS, dtype=np.float32)
    a, b = (rng.standard_normal((_MATMUL_SIZE, _MATMUL_SIZE), dtype=np.float32) for _ in range(2))
    runs = {"probe": probe, "read": lambda: data.sum(), "matmul": lambda: a @ b}
    times = {name: [] for name in runs}
    for round_ in range(FLAGS.rounds + 1):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            if round_:
                times[name].append(time.perf_counter() - start)
    print("RESULT " + json.dumps({"cpu": FLAGS.cpu, "elements": elements, "times_s": times}), flush=True)


def _row(name: str, values, scale: float, unit: str = "") -> list:
    median = statistics.median(values)
    return [name, f"{scale * median:.3g}{' ' + unit if unit else ''}",
            f"{scale * min(values):.3g} to {scale * max(values):.3g}",
            f"{spread(values):.0%}"]


def summarise(processes: list) -> str:
    """Markdown: per measurement (probe, read, matmul, the probe's median over each job's processes,
    and the probe over each reference, round by round), the median over the processes (or jobs) of
    their medians, the range and the spread. `processes`: the workers' records, each with "job"."""
    medians = {name: [statistics.median(p["times_s"][name]) for p in processes] for name in ("probe", "read", "matmul")}
    rows = [_row("probe", medians["probe"], 1e3, "ms"), _row("read", medians["read"], 1e3, "ms"),
            _row("matmul", medians["matmul"], 1e3, "ms")]
    jobs = sorted({p["job"] for p in processes})
    per_job = [statistics.median(statistics.median(p["times_s"]["probe"]) for p in processes if p["job"] == job)
               for job in jobs]
    rows.append(_row("probe, each job's median over its processes", per_job, 1e3, "ms"))
    for reference in ("read", "matmul"):
        ratios = [statistics.median(x / y for x, y in zip(p["times_s"]["probe"], p["times_s"][reference]))
                  for p in processes]
        rows.append(_row(f"probe / {reference}", ratios, 1.0))
    header = "| measurement | median of the processes' medians | range | spread |\n|---|---:|---|---:|"
    lines = [header] + ["| " + " | ".join(row) + " |" for row in rows]
    if len(per_job) >= _DRAWN_JOBS:
        drawn = list(itertools.combinations(per_job, _DRAWN_JOBS))
        within = sum(spread(jobs_drawn) <= _SPREAD_BOUND for jobs_drawn in drawn)
        lines.append(f"\nOf the {len(drawn)} ways to draw {_DRAWN_JOBS} of the {len(per_job)} jobs, {within} "
                     f"({within / len(drawn):.0%}) have their probe medians within a spread of {_SPREAD_BOUND:.0%}.")
    return "\n".join(lines)


def _launch_job() -> list:
    command = [sys.executable, "-m", "research.machine_steadiness", "--role=worker", f"--model={FLAGS.model}",
               f"--rounds={FLAGS.rounds}", f"--compressor_config={FLAGS.compressor_config}"]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2")
    started = [subprocess.Popen(command + [f"--cpu={cpu}"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True) for cpu in range(FLAGS.cpus)]
    results = []
    try:
        for process in started:
            stdout, stderr = process.communicate(timeout=_WORKER_TIMEOUT_S)
            lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
            if process.returncode != 0 or not lines:
                raise RuntimeError(f"worker failed (exit {process.returncode}):\n{stdout[-2000:]}{stderr[-2000:]}")
            results.append(json.loads(lines[-1][len("RESULT "):]))
    finally:  # a failed or timed-out worker leaves none of the job's others running
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait()
    return results


def _launcher() -> None:
    usable = len(os.sched_getaffinity(0))
    if FLAGS.cpus > usable:
        sys.exit(f"--cpus must be at most the {usable} CPUs this process may use, got {FLAGS.cpus}")
    processes = []
    for job in range(FLAGS.jobs):
        for result in _launch_job():
            result["job"] = job
            processes.append(result)
            medians = {name: 1e3 * statistics.median(t) for name, t in result["times_s"].items()}
            print(f"job {job} cpu {result['cpu']}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in medians.items()),
                  flush=True)
    text = summarise(processes)
    write_results(FLAGS.out_dir, FLAGS.name, {"machine": machine_header(), "jobs": FLAGS.jobs, "cpus": FLAGS.cpus,
                                              "model": FLAGS.model, "config": FLAGS.compressor_config,
                                              "rounds": FLAGS.rounds, "processes": processes}, text)


def main(argv):
    del argv
    _worker() if FLAGS.role == "worker" else _launcher()


def _define_flags() -> None:
    """The flags, defined when this module runs (not on import: the tests import its summary beside
    other benchmarks that define flags of the same names)."""
    flags.DEFINE_enum("role", "launcher", ["launcher", "worker"],
                      "launcher: starts the processes; worker: one of them.")
    flags.DEFINE_integer("jobs", 10, "How many times --cpus fresh processes are started at once.", lower_bound=1)
    flags.DEFINE_integer("cpus", 2, "Processes started at once, one per CPU (CPUs 0 .. cpus - 1).", lower_bound=1)
    flags.DEFINE_integer("rounds", 21, "Timed rounds per process (after one untimed).", lower_bound=1)
    flags.DEFINE_string("model", "cnn", "The model of examples/models.py whose gradients size the probe.")
    flags.DEFINE_string("compressor_config", "dragonn_0.01", "Compressor configuration of benchmarks/tta_configs.py.")
    flags.DEFINE_string("out_dir", "research/results", "Where the JSON and Markdown go.")
    flags.DEFINE_string("name", "machine_steadiness", "The results' file name, without extension.")
    flags.DEFINE_integer("cpu", 0, "Worker: the CPU it runs on.")


if __name__ == "__main__":
    _define_flags()
    app.run(main)
