"""Memory benchmark: the extra peak resident memory of one gradient exchange step, per compressor.

For each configuration a fresh `horovodrun -np 2 -H localhost:2 --gloo` job (so that peaks of
different configurations never mix) runs this module as a worker, which:

  * creates one float32 variable of --elements elements (a Dense kernel, [elements / 1024, 1024])
    and its gradient, a standard-normal tensor materialised once, before anything is measured;
  * wraps plain SGD in `hvd.DistributedOptimizer(SGD, compression=...)`: plain Horovod's
    `hvd.Compression.none` for the configuration `none`, else the tfcomp compressor with
    planning="off" (one bucket, the compressor's own collective: allgather, or allreduce for
    RandomK) and ratio 0.001 for the sparsifiers;
  * runs the optimizer's exchange alone, `optimizer._allreduce([grad], [var])` (what the optimizer
    runs between the gradient and the apply; the apply is never run), once untimed to trace it, let
    Horovod negotiate and allocate its fusion buffer and create the error-feedback residual;
  * then --steps times: waits for both ranks (a one-float allreduce) and for RSS to settle (Horovod's
    background thread frees the last step's tensors a moment after the step returns), reads VmRSS,
    resets the peak (writes "5" to /proc/self/clear_refs, which
    sets VmHWM to the current RSS), runs one exchange step, reads VmHWM, drops the result.

The extra peak of a step is VmHWM after it less VmRSS before it: every buffer the step holds at its
worst moment, the reduced gradient it returns included, and Horovod's and Gloo's buffers, but not
what existed before (variable, gradient, residual, fusion buffer). So that RSS follows the live
buffers, the workers run with
  TF_ENABLE_ONEDNN_OPTS=0: with oneDNN (the default on x86) TensorFlow allocates CPU tensors from a
    BFC pool that never gives memory back, so after the first step RSS would not move;
  MALLOC_MMAP_THRESHOLD_=1048576: glibc mmaps every allocation of 1 MiB or more and unmaps it when
    freed (by default only above a threshold that grows up to 32 MiB). The table gives,
per configuration, the median over steps of extra peak / gradient bytes (4 * elements), the largest
of the two ranks, with the strategy the exchange ran (tfcomp's `describe()`).

Run from the repository root, with the op library built (about 15 s per configuration):

  python -m benchmarks.memory_benchmark [--elements=67108864] [--steps=5]
      [--compressors=none,NoCompression,FP16,DRAGONN,DGC,TopK,RandomK,EFSignSGD,QSGD]
      [--markdown_out=benchmarks/results/memory_benchmark.md]

A worker alone: horovodrun -np 2 -H localhost:2 --gloo python -m benchmarks.memory_benchmark
--worker=DRAGONN --json_out=PATH.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.cluster import horovodrun_executable
from benchmarks.tables import markdown_table, text_table

__all__ = []

WORKERS = 2
RATIO = 0.001
COLUMNS_PER_ROW = 1024
# TensorFlow's plain CPU allocator (not oneDNN's BFC pool) on glibc malloc mapping and unmapping
# every allocation of 1 MiB or more: RSS then follows the live buffers (see the docstring).
WORKER_ENV = {"TF_ENABLE_ONEDNN_OPTS": "0", "MALLOC_MMAP_THRESHOLD_": str(2**20)}
SETTLE_SECONDS = 0.25
CONFIGS = ("none", "NoCompression", "FP16", "DRAGONN", "DGC", "TopK", "RandomK", "EFSignSGD", "QSGD")
REPO_ROOT = Path(__file__).resolve().parent.parent


def _compression(config: str):
    """The `compression` argument of hvd.DistributedOptimizer for a configuration."""
    import horovod.tensorflow.keras as hvd

    import tfcomp

    if config == "none":
        return hvd.Compression.none
    if config in ("NoCompression", "FP16"):
        return getattr(tfcomp, config)()
    if config in ("DRAGONN", "DGC", "TopK", "RandomK"):
        return getattr(tfcomp, config)(RATIO, planning="off")
    return getattr(tfcomp, config)(planning="off")


def _memory_kib() -> dict:
    """{'VmRSS': KiB, 'VmHWM': KiB} of this process."""
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {key: int(fields[key].split()[0]) for key in ("VmRSS", "VmHWM")}


def _reset_peak() -> None:
    """Sets VmHWM to the current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _settle() -> None:
    """Waits until VmRSS holds still for SETTLE_SECONDS (at most 20 times that)."""
    last = _memory_kib()["VmRSS"]
    for _ in range(20):
        time.sleep(SETTLE_SECONDS)
        now = _memory_kib()["VmRSS"]
        if now == last:
            return
        last = now


def run_worker(config: str, elements: int, steps: int, json_out: str) -> None:
    """One Horovod worker: measures `steps` exchange steps; rank 0 writes both ranks' results."""
    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    import tfcomp

    hvd.init()
    _reset_peak()
    before = _memory_kib()
    if before["VmHWM"] != before["VmRSS"]:
        raise RuntimeError("writing 5 to /proc/self/clear_refs did not reset VmHWM; cannot measure peaks here")
    var = tf.Variable(tf.zeros([elements // COLUMNS_PER_ROW, COLUMNS_PER_ROW]), name="kernel")
    grad = tf.random.normal(var.shape, seed=hvd.rank())
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01), compression=_compression(config))
    reduced = optimizer._allreduce([grad], [var])  # traces, negotiates, creates residuals and buffers
    strategy = "horovod allreduce" if config == "none" else tfcomp.exchange_of(optimizer).records[0].strategy
    del reduced
    ratios = []
    for _ in range(steps):
        hvd_tf.allreduce(tf.zeros([1]), op=hvd_tf.Sum, name="memory_benchmark_barrier")
        _settle()
        start = _memory_kib()["VmRSS"]
        _reset_peak()
        reduced = optimizer._allreduce([grad], [var])
        peak = _memory_kib()["VmHWM"]
        del reduced
        ratios.append((peak - start) * 1024 / (4 * elements))
    result = {"rank": hvd.rank(), "ratios": ratios, "strategy": strategy}
    results = hvd_tf.allgather_object(result)
    if hvd.rank() == 0:
        with open(json_out, "w") as f:
            json.dump({"config": config, "elements": elements, "ranks": results}, f)


def run_config(config: str, elements: int, steps: int) -> dict:
    """One fresh horovodrun job for `config`; returns its row of the table."""
    with tempfile.TemporaryDirectory() as tmp:
        json_out = os.path.join(tmp, "result.json")
        command = [horovodrun_executable(), "-np", str(WORKERS), "-H", f"localhost:{WORKERS}", "--gloo", sys.executable, "-m",
                   "benchmarks.memory_benchmark", f"--worker={config}", f"--elements={elements}", f"--steps={steps}",
                   f"--json_out={json_out}"]
        env = {**os.environ, **WORKER_ENV}
        result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0 or not os.path.exists(json_out):
            raise RuntimeError(f"{' '.join(command)} failed (exit {result.returncode}):\n"
                               f"{(result.stdout + result.stderr)[-4000:]}")
        with open(json_out) as f:
            raw = json.load(f)
    medians = [statistics.median(r["ratios"]) for r in raw["ranks"]]
    return {"config": config, "strategy": raw["ranks"][0]["strategy"], "ranks": medians, "peak": max(medians),
            "spread": max(max(r["ratios"]) - min(r["ratios"]) for r in raw["ranks"])}


# (heading, width, cell(row) -> str)
_COLUMNS = [
    ("config", 13, lambda r: r["config"]),
    ("strategy", 22, lambda r: r["strategy"]),
    ("rank 0", 6, lambda r: f"{r['ranks'][0]:.2f}"),
    ("rank 1", 6, lambda r: f"{r['ranks'][1]:.2f}"),
    ("extra peak / grad", 17, lambda r: f"{r['peak']:.2f}"),
    ("step spread", 11, lambda r: f"{r['spread']:.2f}"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--elements", type=int, default=2**26, help="Gradient elements (a multiple of 1024).")
    parser.add_argument("--steps", type=int, default=5, help="Measured exchange steps per configuration.")
    parser.add_argument("--compressors", default=",".join(CONFIGS),
                        help=f"Comma-separated configurations, of: {', '.join(CONFIGS)} (none: plain Horovod).")
    parser.add_argument("--markdown_out", help="Also write the table as Markdown to this path.")
    parser.add_argument("--worker", choices=CONFIGS, help="Run as one Horovod worker of this configuration.")
    parser.add_argument("--json_out", help="The worker's result file (with --worker).")
    args = parser.parse_args()
    if args.elements < COLUMNS_PER_ROW or args.elements % COLUMNS_PER_ROW:
        parser.error(f"--elements must be a positive multiple of {COLUMNS_PER_ROW}, got {args.elements}")
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if args.worker:
        run_worker(args.worker, args.elements, args.steps, args.json_out)
        return
    configs = args.compressors.split(",")
    unknown = sorted(set(configs) - set(CONFIGS))
    if unknown:
        parser.error(f"unknown configurations {unknown}; choose from {', '.join(CONFIGS)}")
    rows = []
    for config in configs:
        rows.append(run_config(config, args.elements, args.steps))
        print(text_table(_COLUMNS, rows[-1:], first_left=True).splitlines()[-1], flush=True)
    heading = (f"Extra peak RSS of one exchange step over gradient bytes, {args.elements} float32 elements "
               f"({4 * args.elements / 2**20:.0f} MiB), {WORKERS} Gloo workers, median of {args.steps} steps; "
               f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {datetime.date.today()}")
    print(f"\n{heading}\n{text_table(_COLUMNS, rows, first_left=True)}")
    if args.markdown_out:
        with open(args.markdown_out, "w") as f:
            f.write(f"{heading}\n\n{markdown_table(_COLUMNS, rows, first_left=True)}\n")


if __name__ == "__main__":
    main()
