"""Interleaved timing for the benchmarks: every configuration once per round, medians over rounds."""

from __future__ import annotations

import random
import statistics
import time

__all__ = ["shuffled_medians"]


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
