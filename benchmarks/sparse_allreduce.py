"""Allgather against the hash-partitioned sparse allreduce against AR-Topk, on the emulated cluster.

    python -m benchmarks.sparse_allreduce [--workers=2,4,8] [--rate=1gbit] [--rounds=15]
        [--ratio=0.01] [--out_dir=benchmarks/results]
    python -m benchmarks.sparse_allreduce --reprice=RESULTS.json[,...]

Needs root (benchmarks/cluster.py). On one emulated cluster of max(--workers) hosts (one worker
each, links shaped to --rate), for each K one `horovodrun -np K` job exchanges DRAGONN(--ratio)
payloads of three gradients (2^21, 2^18 and 2^16 float32 elements: one per bucket) with each
strategy forced: allgather, partitioned (default union limit 1: k sums kept in all), partitioned
lossless (union_limit=None) and AR-Topk. Each worker's gradient is a shared signal plus its own
noise of the same size (drawn afresh every step), so the workers' largest elements overlap in part,
as real gradients' do. Rounds interleave the strategies, each step timed alone after a barrier.

Traffic is what the host's interface really carried (receive plus transmit bytes of eth0 in
/proc/net/dev, which is per network namespace), per step, less a barrier's own. Every job also makes
the default plan (cost-model planning calibrated on the cluster, no trial) and reports its
strategies, and what the calibrated cost model predicts for each forced plan: where the model ranks
the strategies as the measurements do, and where the plan picks what they find fastest.
Writes sparse_allreduce.json and sparse_allreduce.md into --out_dir.
"""

import json
import statistics
import sys
import time
from pathlib import Path

from absl import app, flags

from benchmarks.cluster import interface_bytes
from benchmarks.tables import write_results

__all__ = ["summarise"]

FLAGS = flags.FLAGS
flags.DEFINE_enum("role", "launcher", ["launcher", "worker"], "launcher: runs the jobs; worker: one job.")
flags.DEFINE_list("workers", ["2", "4", "8"], "Worker counts K, one host each.")
flags.DEFINE_string("rate", "1gbit", "Link rate per host (e.g. 1gbit), or 'none' (unshaped).")
flags.DEFINE_integer("rounds", 15, "Timed steps per strategy (medians reported).")
flags.DEFINE_float("ratio", 0.01, "DRAGONN's ratio.")
flags.DEFINE_string("out_dir", "benchmarks/results", "Where the JSON and Markdown go.")
flags.DEFINE_string("json_out", None, "Worker: where rank 0 writes its findings.")
flags.DEFINE_list("reprice", [], "Runs nothing: prints the tables of these results files (sparse_allreduce.json) "
                  "with each forced plan priced again from the figures its job calibrated (figures of the "
                  "11-number format, before the per-slot figures, get those at 0).")

SIZES = (2**21, 2**18, 2**16)
# (name, strategy, DRAGONN keyword arguments)
STRATEGIES = (("allgather", "allgather", {}), ("partitioned", "partitioned", {}),
              ("partitioned lossless", "partitioned", {"union_limit": None}), ("AR-Topk", "artopk", {}))


def _forced_compressors(ratio: float) -> dict:
    """{strategy name: DRAGONN(ratio) forced to it}, for each of STRATEGIES."""
    import tfcomp

    return {name: tfcomp.DRAGONN(ratio, strategy=strategy, **kwargs) for name, strategy, kwargs in STRATEGIES}


def _predicted_ms(compressor, cluster) -> float:
    """What `cluster`'s figures predict for one step of SIZES, one bucket each, forced as `compressor` says."""
    from tfcomp import planning

    tensors = [(i, f"g{i}", n) for i, n in enumerate(SIZES)]
    return 1e3 * planning.predicted_exchange_time(planning.per_tensor_plan(tensors, compressor, cluster))


def _worker() -> None:
    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    import tfcomp
    from tfcomp import planning
    from tfcomp import cost_model as cm
    from tfcomp.collectives import barrier as make_barrier

    hvd.init()
    rank, workers = hvd.rank(), hvd.size()
    tensors = [(i, f"g{i}", n) for i, n in enumerate(SIZES)]
    variables = [tf.Variable(tf.zeros([n])) for n in SIZES]
    compressors, exchanges = _forced_compressors(FLAGS.ratio), {}
    for name, compressor in compressors.items():
        plan = planning.per_tensor_plan(tensors, compressor, cm.ClusterModel.unpriced(workers))
        exchanges[name] = tf.function(tfcomp.GradientExchange(compressor, plan=plan), autograph=False)
    barrier = make_barrier(hvd.global_process_set, "sparse_barrier")

    def gradients(step: int):
        shared = np.random.default_rng(step).standard_normal(sum(SIZES)).astype(np.float32)
        own = np.random.default_rng([step, rank]).standard_normal(sum(SIZES)).astype(np.float32)
        return [tf.constant(part) for part in np.split(shared + own, np.cumsum(SIZES)[:-1])]

    times = {name: [] for name in exchanges}
    traffic = {name: [] for name in exchanges}
    barrier_traffic = []
    for round_ in range(FLAGS.rounds + 2):
        grads = gradients(round_)
        for name, exchange in exchanges.items():
            barrier()
            before = interface_bytes()
            start = time.perf_counter()
            [g.numpy() for g in exchange(grads, variables)]
            elapsed = time.perf_counter() - start
            moved = interface_bytes() - before
            if round_ >= 2:  # the first two rounds trace and warm up
                times[name].append(elapsed)
                traffic[name].append(moved)
        before = interface_bytes()
        barrier()
        barrier_traffic.append(interface_bytes() - before)
    # Every rank's traffic, averaged: the owners' shares differ.
    barrier_bytes = statistics.median(barrier_traffic)
    mine = [statistics.median(traffic[name]) - barrier_bytes for name in exchanges]
    everyone = hvd.allgather(tf.constant([mine], tf.float64), name="sparse_traffic").numpy()
    auto = tfcomp.GradientExchange(tfcomp.DRAGONN(FLAGS.ratio, trial_steps=0))
    auto(gradients(0), variables)
    auto.calibrate()  # at once: the first call sent everything dense, measuring nothing
    calibrated = auto.plan.cluster
    if rank == 0 and FLAGS.json_out:
        # What the cost model, calibrated on this cluster, predicts for each forced plan (its buckets
        # priced with the calibrated figures, compression included).
        result = {name: {"ms": 1e3 * statistics.median(times[name]), "mbytes": float(np.mean(everyone[:, i])) / 1e6,
                         "predicted_ms": _predicted_ms(compressors[name], calibrated)}
                  for i, name in enumerate(exchanges)}
        result["plan"] = [b.strategy for b in auto.plan.buckets]
        result["plan_predicted_ms"] = 1e3 * planning.predicted_exchange_time(auto.plan)
        result["cluster"] = calibrated.to_list()
        with open(FLAGS.json_out, "w") as f:
            json.dump(result, f)


def summarise(results: dict) -> str:
    """Markdown: per K, each strategy's median step (measured, and predicted by the calibrated cost
    model) and traffic per worker, the fastest of each, and the default plan."""
    names = [name for name, _, _ in STRATEGIES]
    lines = ["| K | " + " | ".join(f"{n}: ms (predicted), MB" for n in names) +
             " | allgather MB / partitioned MB | fastest measured | fastest predicted | default plan (buckets in "
             "backprop order) |", "|---|" + "---|" * (len(names) + 4)]
    for k in sorted(results, key=int):
        row = results[k]
        measured = min(names, key=lambda n: row[n]["ms"])
        predicted = min(names, key=lambda n: row[n]["predicted_ms"])
        lines.append(f"| {k} | " + " | ".join(
            f"{row[n]['ms']:.1f} ({row[n]['predicted_ms']:.1f}), {row[n]['mbytes']:.2f}" for n in names) +
            f" | {row['allgather']['mbytes'] / row['partitioned']['mbytes']:.2f}x | {measured} | {predicted} | "
            f"{', '.join(row['plan'])} |")
    return "\n".join(lines)


def _launcher() -> None:
    from benchmarks.cluster import Cluster, exit_unless_available

    exit_unless_available("sparse_allreduce")
    workers = sorted(int(k) for k in FLAGS.workers)
    results = {}
    with Cluster(hosts=max(workers), rate=None if FLAGS.rate == "none" else FLAGS.rate) as cluster:
        for k in workers:
            command = cluster.horovodrun_args(np=k) + [
                sys.executable, "-m", "benchmarks.sparse_allreduce", "--role=worker", f"--rounds={FLAGS.rounds}",
                f"--ratio={FLAGS.ratio}"]
            results[str(k)] = cluster.run_json(command, "--json_out", f"K={k}", env={"TF_CPP_MIN_LOG_LEVEL": "2"},
                                               timeout=1200)
            print(f"K={k}: {results[str(k)]}", flush=True)
    write_results(FLAGS.out_dir, "sparse_allreduce",
                  {"rate": FLAGS.rate, "rounds": FLAGS.rounds, "ratio": FLAGS.ratio, "results": results},
                  summarise(results))


def _reprice(path: str) -> str:
    """The summary of a results file, each forced plan's prediction from its job's figures."""
    from tfcomp import cost_model as cm

    data = json.loads(Path(path).read_text())
    compressors = _forced_compressors(data["ratio"])
    length = len(cm.ClusterModel.unpriced(1).to_list())
    for row in data["results"].values():
        figures = list(row["cluster"])
        cluster = cm.ClusterModel.from_list(figures + [0.0] * (length - len(figures)))
        for name, compressor in compressors.items():
            row[name]["predicted_ms"] = _predicted_ms(compressor, cluster)
    return summarise(data["results"])


def main(argv):
    del argv
    if FLAGS.reprice:
        for path in FLAGS.reprice:
            print(f"{path}, repriced:\n{_reprice(path)}")
        return
    _worker() if FLAGS.role == "worker" else _launcher()


if __name__ == "__main__":
    app.run(main)
