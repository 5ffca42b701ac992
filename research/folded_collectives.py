"""Whether a Horovod collective inside a `tf.function` communicates on every call, by its input.

    python -m research.folded_collectives [--rate=1gbit] [--calls=100] [--out_dir=research/results]

Needs root (benchmarks/cluster.py). On 2 pinned emulated hosts, one `horovodrun` job times a
one-float allreduce in a `tf.function` whose input is the graph's own constant, an eager tensor
the function captures, or a variable it reads, and the same allreduce of a constant run eagerly
(`tfcomp.collectives.barrier`): --calls calls each, one after another, and the bytes each
call moved through the host's eth0 (received plus sent, /proc/net/dev of its network namespace).
Horovod's ops are not marked stateful, so TensorFlow's constant folding may run one whose inputs
are all constants once, while it optimizes the graph, and never again: a barrier written that way
synchronises nothing, and a latency probe written that way times an empty graph. Writes
folded_collectives.json and .md into --out_dir.
"""

import json
import statistics
import sys
import time

from absl import app, flags

from benchmarks.cluster import interface_bytes
from benchmarks.tables import markdown_table, write_results

__all__ = ["summarise"]

FLAGS = flags.FLAGS
flags.DEFINE_enum("role", "launcher", ["launcher", "worker"], "launcher: runs the job; worker: the timing.")
flags.DEFINE_string("rate", "1gbit", "Link rate per host (e.g. 1gbit), or 'none' (unshaped).")
flags.DEFINE_integer("calls", 100, "Timed calls of each allreduce.")
flags.DEFINE_string("out_dir", "research/results", "Where the JSON and Markdown go.")
flags.DEFINE_string("json_out", None, "Worker: where rank 0 writes its findings.")


def _worker() -> None:
    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    from tfcomp.collectives import barrier as make_barrier

    hvd.init()
    captured, variable = tf.ones([1]), tf.Variable(tf.ones([1]))

    def graph(inputs, name):
        return tf.function(lambda: hvd.allreduce(inputs() * 1.0, op=hvd.Sum, name=name), autograph=False)

    runs = {"tf.function, constant input": graph(lambda: tf.ones([1]), "folded_constant"),
            "tf.function, captured eager tensor": graph(lambda: captured, "folded_captured"),
            "tf.function, variable read": graph(variable.read_value, "folded_variable"),
            "eager, constant input": make_barrier(hvd.global_process_set, "folded_eager")}
    barrier = make_barrier(hvd.global_process_set, "folded_barrier")
    found = {}
    for name, run in runs.items():
        for _ in range(3):
            np.asarray(run())
        barrier()
        before, seconds = interface_bytes(), []
        for _ in range(FLAGS.calls):
            start = time.perf_counter()
            np.asarray(run())
            seconds.append(time.perf_counter() - start)
        found[name] = {"bytes_per_call": (interface_bytes() - before) / FLAGS.calls,
                       "median_seconds": statistics.median(seconds)}
        barrier()
    if hvd.rank() == 0:
        with open(FLAGS.json_out, "w") as f:
            json.dump(found, f)


def summarise(found: dict) -> str:
    """A Markdown table: each allreduce's bytes per call through eth0 and its median call."""
    columns = [("one-float allreduce", None, lambda row: row[0]),
               ("bytes per call on eth0", None, lambda row: f"{row[1]['bytes_per_call']:.0f}"),
               ("median call ms", None, lambda row: f"{1e3 * row[1]['median_seconds']:.3f}")]
    return markdown_table(columns, list(found.items()), first_left=True)


def _launcher() -> None:
    from benchmarks.cluster import Cluster, exit_unless_available

    exit_unless_available("folded_collectives")
    with Cluster(hosts=2, rate=None if FLAGS.rate == "none" else FLAGS.rate, pin_cpus=True) as cluster:
        command = cluster.horovodrun_args() + [sys.executable, "-m", "research.folded_collectives", "--role=worker",
                                               f"--calls={FLAGS.calls}"]
        found = cluster.run_json(command, "--json_out", "folded collectives", env={"TF_CPP_MIN_LOG_LEVEL": "2"},
                                 timeout=600)
    write_results(FLAGS.out_dir, "folded_collectives", {"rate": FLAGS.rate, "calls": FLAGS.calls, "found": found},
                  summarise(found))


def main(argv):
    del argv
    _worker() if FLAGS.role == "worker" else _launcher()


if __name__ == "__main__":
    app.run(main)
