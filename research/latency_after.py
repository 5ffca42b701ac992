"""What a one-float collective costs against the collective that ran before it, on the emulated cluster.

    python -m research.latency_after [--settings=none,1gbit] [--rounds=40] [--nopin_cpus]
        [--out_dir=research/results]

Needs root (benchmarks/cluster.py). On 2 emulated hosts per setting (a link rate, or `none` for
unshaped links), one `horovodrun -np 2` job per Horovod setting (its defaults, and its response
cache off: HOROVOD_CACHE_CAPACITY=0) times a one-float allreduce and a one-float allgather, each
right after a barrier that follows one call of a preceding collective (`BEFORE`), round by round
with every preceding collective in turn. Calibration takes a collective's latency from such
one-float calls; a training step's collectives follow ones that carried data.

Rank 0 reports, per preceding collective, the median milliseconds of each timed call and the share
of its calls beyond 2 ms (this machine's scheduler tick is 4 ms: CONFIG_HZ=250). Writes
latency_after.json and latency_after.md into --out_dir.
"""

import json
import statistics
import sys
import time

from absl import app, flags

from benchmarks.tables import write_results

__all__ = ["BEFORE", "HOROVOD_SETTINGS", "summarise"]

FLAGS = flags.FLAGS

# The collective that runs before each timed one-float call (float32 elements per tensor, tensors).
BEFORE = {"one float": (1, 1), "64 one-float tensors": (1, 64), "64 KiB": (2**14, 1), "4 MiB in 4 tensors": (2**18, 4)}
HOROVOD_SETTINGS = {"defaults": {}, "response cache off": {"HOROVOD_CACHE_CAPACITY": "0"}}
_SLOW_MS = 2.0
_WARMUP_ROUNDS = 3


def _worker() -> None:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from tfcomp.collectives import barrier as make_barrier

    hvd.init()
    # Captured eager tensors, times 1.0 in the graph: a graph's own constants would be folded with
    # the collective (tfcomp.collectives.barrier).
    one = tf.ones([1])

    def graph(make):
        function = tf.function(make, autograph=False)
        return lambda: function()[0].numpy()

    def allreduces(tensors, name):
        return graph(lambda: [hvd.allreduce(t * 1.0, op=hvd.Sum, name=f"{name}_{i}") for i, t in enumerate(tensors)])

    before = {label: allreduces([tf.random.stateless_normal([elements], seed=[3, i]) for i in range(count)],
                                f"before_{n}")
              for n, (label, (elements, count)) in enumerate(BEFORE.items())}
    timed = {"allreduce": allreduces([one], "timed_allreduce"),
             "allgather": graph(lambda: [hvd.allgather(one * 1.0, name="timed_allgather")])}
    barrier = make_barrier(hvd.global_process_set, "latency_after_barrier")
    times = {(label, name): [] for label in before for name in timed}
    for round_ in range(_WARMUP_ROUNDS + FLAGS.rounds):
        for label, run_before in before.items():
            for name, run in timed.items():
                barrier()
                run_before()
                barrier()
                start = time.perf_counter()
                run()
                if round_ >= _WARMUP_ROUNDS:
                    times[label, name].append(1e3 * (time.perf_counter() - start))
    if hvd.rank() == 0 and FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump({label: {name: {"median_ms": statistics.median(times[label, name]),
                                      "slow_share": sum(t > _SLOW_MS for t in times[label, name]) / FLAGS.rounds,
                                      "samples_ms": times[label, name]}
                               for name in timed} for label in before}, f)


def summarise(results: dict) -> str:
    """Markdown: one row per setting, Horovod setting and preceding collective."""
    lines = ["| link | Horovod | before | allreduce ms (share > 2 ms) | allgather ms (share > 2 ms) |",
             "|---|---|---|---:|---:|"]
    for setting, by_horovod in results.items():
        for horovod, by_before in by_horovod.items():
            for label, figures in by_before.items():
                cells = [f"{figures[name]['median_ms']:.2f} ({figures[name]['slow_share']:.0%})"
                         for name in ("allreduce", "allgather")]
                lines.append(f"| {setting} | {horovod} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _launcher() -> None:
    from benchmarks.cluster import Cluster, exit_unless_available

    exit_unless_available("latency_after")
    results = {}
    for setting in FLAGS.settings:
        results[setting] = {}
        with Cluster(hosts=2, rate=None if setting == "none" else setting, pin_cpus=FLAGS.pin_cpus) as cluster:
            for horovod, env in HOROVOD_SETTINGS.items():
                command = cluster.horovodrun_args(np=2) + [sys.executable, "-m", "research.latency_after",
                                                           "--role=worker", f"--rounds={FLAGS.rounds}"]
                results[setting][horovod] = cluster.run_json(command, "--json_out", f"{setting}, {horovod}",
                                                             env={"TF_CPP_MIN_LOG_LEVEL": "2", **env}, timeout=600)
                print(f"{setting}, {horovod}: done", flush=True)
    write_results(FLAGS.out_dir, "latency_after", {"rounds": FLAGS.rounds, "pin_cpus": FLAGS.pin_cpus,
                                                   "results": results}, summarise(results))


def main(argv):
    del argv
    _worker() if FLAGS.role == "worker" else _launcher()


def _define_flags() -> None:
    """The flags, defined when this module runs (not on import: the tests import its summary beside
    other benchmarks that define flags of the same names)."""
    flags.DEFINE_enum("role", "launcher", ["launcher", "worker"], "launcher: runs the jobs; worker: one job's timing.")
    flags.DEFINE_list("settings", ["none", "1gbit"], "Link rates per host (e.g. 1gbit), 'none' for unshaped links.")
    flags.DEFINE_integer("rounds", 40, "Timed rounds (medians reported).")
    flags.DEFINE_bool("pin_cpus", True, "Each host's processes on a CPU of their own (as network_validation runs).")
    flags.DEFINE_string("out_dir", "research/results", "Where the JSON and Markdown go.")
    flags.DEFINE_string("json_out", None, "Worker: where rank 0 writes its figures.")


if __name__ == "__main__":
    _define_flags()
    app.run(main)
