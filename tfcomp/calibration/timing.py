"""The interleaved timing harness of calibration: every probe timed as training runs it.

Each timed call is one graph, started right after a barrier (in training the previous step's
collectives synchronise the workers); the probes of a kind are interleaved round by round in three
blocks, the block that lies furthest out is left out (a slow spell of a shared machine), and the
rounds of the others pooled. Every function here is a generator of calibration pieces (one probe's
untimed first call, or one round of timed calls), so that calibration can run between training
steps; `finish` runs one at once.
"""

from __future__ import annotations

import time

import numpy as np
import tensorflow as tf

__all__ = ["BARRIER_NAME", "finish", "graph_call", "without_outlying_block"]

BARRIER_NAME = "tfcomp_calibration_barrier"  # the one-float allreduce before each timed call


def _interleaved_times(runs: dict, rounds: int, synchronise=None):
    """A generator that times the callables in `runs` round-robin for `rounds` rounds, so that a
    shared machine's drifts touch them alike (and a difference of two runs is best taken round by
    round), yielding after each round (a piece of calibration that may run between two training
    steps); it returns {name: float64 [rounds] seconds}. With `synchronise` (a barrier), every timed
    call starts right after it: in training, each step's exchange starts with the workers just
    synchronised by the previous step's collectives, and a timing of back-to-back calls (which
    pipeline in Horovod's cycle) would miss the wait for the next cycle. Every rank must pass the
    same runs and rounds (they run collectives)."""
    times = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            if synchronise is not None:
                synchronise()
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
        yield
    return {name: np.asarray(values) for name, values in times.items()}


def without_outlying_block(sets, synchronise, warmup: int = 1, blocks: int = 3):
    """A generator that returns {name: seconds [rounds]} of every set of runs [(runs, rounds)]:
    each run called `warmup` times untimed (its first call traces its graph; a piece each), then
    each set timed in `blocks` blocks of `rounds` rounds (`_interleaved_times`), the sets' blocks
    alternating, and the rounds of each set's blocks pooled less one: the fastest or the slowest
    block by sum of medians, whichever lies further from the middle one. A shared machine has
    spells of a second or so in which everything runs slower (another tenant; on a VM, the host
    taking the CPU): such a spell spoils one block, not the figures."""
    for runs, _ in sets:
        for run in runs.values():
            for _ in range(warmup):
                run()
            yield
    timed = []
    for _ in range(blocks):
        timed.append([])
        for runs, rounds in sets:
            timed[-1].append((yield from _interleaved_times(runs, rounds=rounds, synchronise=synchronise)))
    times = {}
    for per_block in zip(*timed):
        times.update(_pool_without_outlier(per_block))
    return times


def finish(pieces):
    """Runs a generator of calibration pieces (`calibration_pieces`, or any of this module's
    generators) to its end, at once, and returns what it returns."""
    while True:
        try:
            next(pieces)
        except StopIteration as done:
            return done.value


def _pool_without_outlier(per_block) -> dict:
    """{name: float64 [rounds]}: the blocks' times ({name: [rounds]} each, at least 3 blocks)
    concatenated in their order, less the fastest or the slowest block by sum of medians,
    whichever lies further from its neighbour in that order."""
    sums = [sum(np.median(v) for v in t.values()) for t in per_block]
    order = sorted(range(len(per_block)), key=sums.__getitem__)
    fast, slow = order[:2], order[-2:]
    dropped = fast[0] if sums[fast[1]] - sums[fast[0]] > sums[slow[1]] - sums[slow[0]] else slow[1]
    kept = [t for n, t in enumerate(per_block) if n != dropped]
    return {name: np.concatenate([t[name] for t in kept]) for name in kept[0]}


def graph_call(function):
    """A callable that runs `function` (returning a list of tensors) as one tf.function and waits for it."""
    graph = tf.function(function, autograph=False)
    return lambda: graph()[0].numpy()
