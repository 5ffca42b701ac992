"""How the emulated links' token bucket shapes a collective's time against its size.

    python -m research.link_burst [--hosts=2] [--rates=1gbit,2gbit,5gbit] [--bursts_ms=4,1,0.5]
        [--repeats=3] [--rounds=12] [--out_dir=research/results]

Needs root (benchmarks/cluster.py). Each link of the emulated cluster is a `tc tbf` whose bucket
holds `burst` bytes: a transfer starting after the link idled sends that much at once and the rest
at the rate, so its time is not affine in its size from zero, and how full the bucket is depends
on how long the link idled before. The cost model (and calibration's two-point fit) assumes
t = latency + size / bandwidth, as on a real NIC. For each burst (milliseconds of the rate) and
rate, alternated over --repeats fresh jobs on one pinned cluster, rank 0 times Horovod's ring
allreduce (4 tensors fused, as calibration sends them) and allgather of sizes from 64 KiB to 16
MiB (allgather: 4 MiB per worker at most) and of one float32, each call one graph started right
after a barrier, interleaved round by round, and reports per burst and rate:

  - the bandwidth of an affine fit over the sizes from 256 KiB up, as a fraction of the rate, and
    its worst relative misfit (how far from affine the times are);
  - calibration's bandwidth (one float32 against the largest size), as a fraction of the rate;
  - each size's spread between the repeats' medians ((max - min) / median), the noise that a
    calibration of one job carries into its figures.

Writes link_burst.json and link_burst.md into --out_dir.
"""

import json
import statistics
import sys
import time

import numpy as np
from absl import app, flags

from benchmarks.tables import markdown_table, write_results

__all__ = ["affine_fit", "summarise"]

FLAGS = flags.FLAGS

SIZES = [2**16, 2**18, 2**20, 2**22, 2**24]  # bytes per collective (allreduce) / per worker (allgather)
ALLGATHER_MAX_BYTES = 2**22
FIT_MIN_BYTES = 2**18
_PARTS = 4


def _worker() -> None:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from tfcomp.collectives import barrier as make_barrier

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)

    def allreduce(nbytes):
        parts = [tf.random.stateless_normal([max(nbytes // 4 // _PARTS, 1)], seed=[3, i]) for i in range(_PARTS)]
        # All four results returned, so that the call waits for all of them.
        return tf.function(lambda: tf.add_n([hvd.allreduce(p * 1.0, op=hvd.Sum, name=f"burst_ar_{nbytes}_{i}")[:1]
                                             for i, p in enumerate(parts)]), autograph=False)

    def allgather(nbytes):
        tensor = tf.random.stateless_normal([max(nbytes // 4, 1)], seed=[5, 0])
        return tf.function(lambda: hvd.allgather(tensor * 1.0, name=f"burst_ag_{nbytes}"), autograph=False)

    calls = {("allreduce", 4): allreduce(4), ("allgather", 4): allgather(4)}
    calls.update({("allreduce", n): allreduce(n) for n in SIZES})
    calls.update({("allgather", n): allgather(n) for n in SIZES if n <= ALLGATHER_MAX_BYTES})
    barrier = make_barrier(hvd.global_process_set, "burst_barrier")
    for call in calls.values():
        call().numpy()
    times = {key: [] for key in calls}
    for _ in range(FLAGS.rounds):
        for key, call in calls.items():
            barrier()
            start = time.perf_counter()
            call().numpy()
            times[key].append(time.perf_counter() - start)
    if hvd.rank() == 0:
        medians = [{"collective": c, "bytes": n, "seconds": statistics.median(t)} for (c, n), t in times.items()]
        with open(FLAGS.json_out, "w") as f:
            json.dump(medians, f)


def affine_fit(sizes, seconds) -> tuple:
    """(latency s, bandwidth bytes/s, worst |misfit| / measured) of the least-squares line t = a + S / B."""
    slope, intercept = np.polyfit(np.asarray(sizes, float), np.asarray(seconds, float), 1)
    fitted = intercept + slope * np.asarray(sizes, float)
    misfit = float(np.max(np.abs(fitted - seconds) / np.asarray(seconds, float)))
    return float(intercept), float(1.0 / slope) if slope > 0 else float("inf"), misfit


def _ring_bytes(collective: str, nbytes: int, workers: int) -> float:
    """Bytes each worker sends over its link: a ring allreduce 2 (K-1)/K S, a ring allgather (K-1) S."""
    return 2 * (workers - 1) / workers * nbytes if collective == "allreduce" else (workers - 1) * nbytes


def summarise(jobs: list, workers: int) -> tuple:
    """(rows, Markdown) from the jobs' medians ({burst_ms, rate_bits, medians})."""
    rows = []
    for burst, rate in dict.fromkeys((j["burst_ms"], j["rate_bits"]) for j in jobs):
        mine = [j for j in jobs if (j["burst_ms"], j["rate_bits"]) == (burst, rate)]
        for collective in ("allreduce", "allgather"):
            per_size = {}
            for job in mine:
                for m in job["medians"]:
                    if m["collective"] == collective:
                        per_size.setdefault(m["bytes"], []).append(m["seconds"])
            sizes = sorted(n for n in per_size if n >= FIT_MIN_BYTES)
            medians = [statistics.median(per_size[n]) for n in sizes]
            _, bandwidth, misfit = affine_fit([_ring_bytes(collective, n, workers) for n in sizes], medians)
            largest = max(per_size)
            two_point = _ring_bytes(collective, largest, workers) / max(
                statistics.median(per_size[largest]) - statistics.median(per_size[4]), 1e-9)
            spreads = {n: (max(v) - min(v)) / statistics.median(v) for n, v in per_size.items() if n > 4}
            rows.append({"burst_ms": burst, "rate": f"{rate / 1e9:g} Gbit/s", "collective": collective,
                         "jobs": len(mine), "fit_fraction": 8 * bandwidth / rate, "fit_misfit": misfit,
                         "two_point_fraction": 8 * two_point / rate,
                         "ms": {n: 1e3 * statistics.median(v) for n, v in per_size.items()},
                         "spread": spreads})
    columns = [("burst ms", 0, lambda r: f"{r['burst_ms']:g}"), ("rate", 0, lambda r: r["rate"]),
               ("collective", 0, lambda r: r["collective"]), ("jobs", 0, lambda r: str(r["jobs"])),
               ("affine fit, of the rate", 0, lambda r: f"{r['fit_fraction']:.2f}"),
               ("its worst misfit", 0, lambda r: f"{100 * r['fit_misfit']:.1f} %"),
               ("one float to largest, of the rate", 0, lambda r: f"{r['two_point_fraction']:.2f}"),
               ("ms per size (64K / 256K / 1M / 4M / 16M)", 0,
                lambda r: " / ".join(f"{r['ms'][n]:.2f}" for n in SIZES if n in r["ms"])),
               ("spread between jobs per size", 0,
                lambda r: " / ".join(f"{100 * r['spread'][n]:.0f} %" for n in SIZES if n in r["spread"]))]
    return rows, markdown_table(columns, rows)


def _launcher() -> None:
    from benchmarks.cluster import Cluster, exit_unless_available, parse_rate

    exit_unless_available("link_burst")
    rates = [parse_rate(r) for r in FLAGS.rates]
    if None in rates:
        raise app.UsageError("--rates: every rate must shape the links (a burst of an unshaped link means nothing)")
    bursts = [float(b) for b in FLAGS.bursts_ms]
    jobs = []
    with Cluster(hosts=FLAGS.hosts, rate=FLAGS.rates[0], pin_cpus=True) as cluster:
        for repeat in range(FLAGS.repeats):
            for rate in rates:
                for burst in bursts:
                    cluster.set_rate(rate, burst_seconds=burst / 1e3)
                    command = cluster.horovodrun_args() + [sys.executable, "-m", "research.link_burst",
                                                           "--role=worker", f"--rounds={FLAGS.rounds}"]
                    medians = cluster.run_json(command, "--json_out", f"burst {burst:g} ms, {rate / 1e9:g} Gbit/s",
                                               env={"TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=600)
                    jobs.append({"repeat": repeat, "burst_ms": burst, "rate_bits": rate, "medians": medians})
                    print(f"repeat {repeat}, burst {burst:g} ms, {rate / 1e9:g} Gbit/s: " + ", ".join(
                        f"{m['collective']} {m['bytes']} B {1e3 * m['seconds']:.2f} ms" for m in medians), flush=True)
    rows, markdown = summarise(jobs, FLAGS.hosts)
    write_results(FLAGS.out_dir, "link_burst", {"hosts": FLAGS.hosts, "rounds": FLAGS.rounds, "jobs": jobs,
                                                "summary": rows}, markdown)


def main(argv):
    del argv
    _worker() if FLAGS.role == "worker" else _launcher()


def _define_flags() -> None:
    """The flags, defined when this module runs (not on import: the tests import its summaries beside
    other benchmarks that define flags of the same names)."""
    flags.DEFINE_enum("role", "launcher", ["launcher", "worker"], "launcher: runs the jobs; worker: one job's timing.")
    flags.DEFINE_integer("hosts", 2, "Emulated hosts, one worker each.")
    flags.DEFINE_list("rates", ["1gbit", "2gbit", "5gbit"], "Link rates per host and direction.")
    flags.DEFINE_list("bursts_ms", ["4", "1", "0.5"], "tbf bursts, in milliseconds of the rate.")
    flags.DEFINE_integer("repeats", 3, "Fresh jobs per burst and rate, alternated.")
    flags.DEFINE_integer("rounds", 12, "Timed rounds per job (medians reported).")
    flags.DEFINE_string("out_dir", "research/results", "Where the JSON and Markdown go.")
    flags.DEFINE_string("json_out", None, "Worker: where rank 0 writes its medians.")


if __name__ == "__main__":
    _define_flags()
    app.run(main)
