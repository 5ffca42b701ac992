"""How the collectives' latency grows with the workers, measured on the emulated cluster.

    python -m research.collective_latency [--workers=2,4,8] [--rate=none] [--rounds=60]
        [--out_dir=research/results]

Needs root (benchmarks/cluster.py). On one emulated cluster of max(--workers) hosts, for each K of
--workers, one `horovodrun -np K` job (one worker per host) times Horovod's (Gloo's) allreduce,
allgather and broadcast of one float32 per worker, each call one graph started right after a
barrier, as calibration times them, interleaved round by round; rank 0 reports the medians.

The cost model charges a ring allreduce 2 (K-1) alpha, a ring allgather (K-1) alpha and a broadcast
log2(K) alpha of latency; 003's Table I charges the allgather alpha log2 K. For each collective it
fits t(K) = c + alpha h(K) for both h = K-1 and h = log2 K (c: the per-call overhead) and reports
each fit's alpha and its worst relative misfit: the latency term the data support is the one that
fits. The hosts share this machine's two cores, so at K = 8 workers also wait for the CPU: a
latency that grows with K may be the CPU's as much as the network's (the table says how busy).
Writes collective_latency.json and collective_latency.md into --out_dir.
"""

import json
import math
import statistics
import sys
import time

from absl import app, flags

from benchmarks.tables import write_results

__all__ = ["fit", "summarise"]

FLAGS = flags.FLAGS
flags.DEFINE_enum("role", "launcher", ["launcher", "worker"], "launcher: runs the jobs; worker: one job's timing.")
flags.DEFINE_list("workers", ["2", "4", "8"], "Worker counts K, one host each.")
flags.DEFINE_string("rate", "none", "Link rate per host (e.g. 1gbit), or 'none' (unshaped).")
flags.DEFINE_integer("rounds", 60, "Timed rounds per collective (medians reported).")
flags.DEFINE_string("out_dir", "research/results", "Where the JSON and Markdown go.")
flags.DEFINE_string("json_out", None, "Worker: where rank 0 writes its medians.")

COLLECTIVES = ("allreduce", "allgather", "broadcast", "alltoall")
# The latency terms to compare: the cost model's, and the alternative (003 Table I for allgather).
TERMS = {"K-1": lambda k: k - 1, "log2 K": math.log2}


def _worker() -> None:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from tfcomp.collectives import barrier as make_barrier

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    # Eager tensors, captured: a graph's own constants would be folded with the collective (tfcomp.collectives.barrier).
    one, ones, splits = tf.ones([1], tf.float32), tf.ones([hvd.size()]), tf.ones([hvd.size()], tf.int32)
    graphs = {"allreduce": lambda: hvd.allreduce(one, op=hvd.Sum, name="latency_allreduce"),
              "allgather": lambda: hvd.allgather(one, name="latency_allgather"),
              "broadcast": lambda: hvd.broadcast(one, 0, name="latency_broadcast"),
              # One float32 to every worker (the hash-partitioned allreduce's first collective).
              "alltoall": lambda: hvd.alltoall(ones, splits=splits, name="latency_alltoall")[0]}
    calls = {name: tf.function(graph, autograph=False) for name, graph in graphs.items()}
    barrier = make_barrier(hvd.global_process_set, "latency_barrier")
    times = {name: [] for name in calls}
    for round_ in range(FLAGS.rounds + 3):
        for name, call in calls.items():
            barrier()
            start = time.perf_counter()
            call().numpy()
            if round_ >= 3:
                times[name].append(time.perf_counter() - start)
    if hvd.rank() == 0 and FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump({name: statistics.median(t) for name, t in times.items()}, f)


def fit(workers: list, seconds: list, term) -> tuple:
    """(c, alpha, worst relative misfit) of the least-squares fit seconds = c + alpha term(K)."""
    xs = [term(k) for k in workers]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(seconds)
    alpha = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, seconds)) / sum((x - mean_x) ** 2 for x in xs)
    c = mean_y - alpha * mean_x
    worst = max(abs(c + alpha * x - y) / y for x, y in zip(xs, seconds))
    return c, alpha, worst


def summarise(results: dict) -> str:
    """Markdown: the medians per K, and both fits per collective."""
    workers = sorted(int(k) for k in results)
    lines = ["| collective | " + " | ".join(f"K={k} us" for k in workers) + " | " +
             " | ".join(f"fit {name}: alpha us, worst misfit" for name in TERMS) + " |",
             "|---|" + "---|" * (len(workers) + len(TERMS))]
    for name in COLLECTIVES:
        seconds = [results[str(k)][name] for k in workers]
        fits = [fit(workers, seconds, term) for term in TERMS.values()]
        lines.append(f"| {name} | " + " | ".join(f"{1e6 * s:.0f}" for s in seconds) + " | " +
                     " | ".join(f"{1e6 * alpha:.0f}, {worst:.1%}" for _, alpha, worst in fits) + " |")
    return "\n".join(lines)


def _launcher() -> None:
    from benchmarks.cluster import Cluster, exit_unless_available

    exit_unless_available("collective_latency")
    workers = sorted({int(k) for k in FLAGS.workers})
    if len(workers) < 2 or workers[0] < 2:
        raise app.UsageError(f"--workers must name at least two worker counts >= 2 (the fit needs them), got "
                             f"{','.join(FLAGS.workers)}")
    results = {}
    with Cluster(hosts=max(workers), rate=None if FLAGS.rate == "none" else FLAGS.rate) as cluster:
        for k in workers:
            command = cluster.horovodrun_args(np=k) + [sys.executable, "-m", "research.collective_latency",
                                                       "--role=worker", f"--rounds={FLAGS.rounds}"]
            results[str(k)] = cluster.run_json(command, "--json_out", f"K={k}", env={"TF_CPP_MIN_LOG_LEVEL": "2"},
                                               timeout=600)
            print(f"K={k}: " + ", ".join(f"{name} {1e6 * s:.0f} us" for name, s in results[str(k)].items()), flush=True)
    write_results(FLAGS.out_dir, "collective_latency", {"rate": FLAGS.rate, "rounds": FLAGS.rounds, "medians": results},
                  summarise(results))


def main(argv):
    del argv
    _worker() if FLAGS.role == "worker" else _launcher()


if __name__ == "__main__":
    app.run(main)
