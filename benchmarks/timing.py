"""Interleaved timing for the benchmarks: every configuration once per round, medians over rounds."""

from __future__ import annotations

import random
import statistics
import time

__all__ = ["eager_barrier", "shuffled_medians"]


def eager_barrier(name: str):
    """A callable that returns once every Horovod rank has called it: a one-float allreduce named
    `name`, run eagerly. Not a `tf.function` of an allreduce of a constant: Horovod's ops are not
    marked stateful, so TensorFlow's constant folding runs such an allreduce once while it
    optimizes the graph, and later calls return the folded value without communicating
    (`benchmarks/folded_collectives.py` on 2 emulated hosts at 1 Gbit/s: 56 bytes and 0.053 ms a
    call, against about 1.7 kB and 1.08 ms for the same allreduce of a captured tensor, a variable
    or run eagerly; BENCHMARKS.md, "Horovod ops on constants are folded")."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    zero = tf.zeros([1])
    return lambda: hvd.allreduce(zero, op=hvd.Sum, name=name).numpy()


def shuffled_medians(runs: dict, repeats: int, warmup: int) -> dict:
    """{key: median milliseconds} of each zero-argument run in `runs` (a tf.function returning a
    tensor, fetched with .numpy() inside the timed region) over `repeats` rounds after `warmup`
    discarded ones. Every round runs each once, in an order shuffled every round (seeded by the
    round), so that no run always follows the same one: with a fixed order, two runs of the same
    code measured 15.6 and 19.8 ms depending only on what ran before them."""
    times = {key: [] for key in runs}
    order = list(runs.items())
    for round_ in range(warmup + repeats):
        random.Random(round_).shuffle(order)
        for key, run in order:
            start = time.perf_counter()
            run().numpy()
            if round_ >= warmup:
                times[key].append(1e3 * (time.perf_counter() - start))
    return {key: statistics.median(values) for key, values in times.items()}
