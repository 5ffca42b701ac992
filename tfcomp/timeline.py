"""When, inside the training step, each gradient is ready and each bucket's exchange ends.

`ExchangeTimeline(gradients, buckets, window)` keeps, for the last `window` steps of one plan, when
the exchange's gradients were computed and when each bucket's reduced gradients were, all relative
to the step's first gradient (the start of the exchange: the backward pass computes the last
layer's gradients first). A clock in the step graph costs about as much as any op (3 us a clock
here), so a step clocks at most `MAX_READY_CLOCKS` gradients, spread evenly over the list with its
first and last (`clocked_positions`), and the others' times are interpolated between them by
position; and one reduced gradient per bucket (`tfcomp.step` picks it), or, for a step that runs
Horovod's own reduction (an all-dense plan), one end for the whole exchange (a timeline of one
"bucket"). `record(ready, bucket_ends)` adds them from inside the step (`tfcomp.counters.stamps`:
each clock waits only for its own tensor, so the clocks hold nothing back). A step may record every
time, or only where `sampled()` says: every step for the first `window` steps after the plan was
installed (the controller reads a full window soon after), then one step in
`TIMELINE_SAMPLE_EVERY`. `read()` gives per-gradient and per-bucket medians over the recorded steps
(at most the last `window`): the gradients' ready times are what the planner prices the overlap of
the exchange with the backward pass from (`tfcomp.planning.make_plan`'s `ready_seconds`), and
together with the buckets' ends they are the step's timeline (how much of the exchange the
backward pass hides).

The timeline is not training state: it lives outside checkpoints (the holder is not a trackable
object).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

__all__ = ["DEFAULT_WINDOW", "MAX_READY_CLOCKS", "TIMELINE_SAMPLE_EVERY", "ExchangeTimeline", "clocked_positions"]

DEFAULT_WINDOW = 20  # steps whose times are kept (the medians are over them)
# After its first window, a sampled timeline records one step in this many (the others run no clock).
TIMELINE_SAMPLE_EVERY = 10
# Gradients a step clocks at most: 82 clocks of gradients and 82 of reduced gradients cost the
# 82-tensor model 0.5 ms of a 5.9 ms step on one worker here (research/notebook.md).
MAX_READY_CLOCKS = 16


def clocked_positions(gradients: int, most: int = MAX_READY_CLOCKS) -> tuple:
    """The positions (ints, ascending) of the gradients a step clocks among `gradients`: all of
    them where they are at most `most` (>= 2), else `most` spread evenly, the first and last among
    them."""
    if most < 2:
        raise ValueError(f"most must be >= 2 clocks (the first and last gradient), got {most}")
    if gradients <= most:
        return tuple(range(gradients))
    return tuple(sorted({round(i * (gradients - 1) / (most - 1)) for i in range(most)}))


class ExchangeTimeline:
    """The last `window` recorded steps' times of `gradients` gradients (those at `clocked`
    measured, the others interpolated) and `buckets` buckets (or ends: one for the whole exchange)
    (float64 seconds from each step's first clocked gradient). `steps`: the steps recorded;
    `seen`: the steps that asked `sampled()`. Create it eagerly.

    Args:
      gradients, buckets: how many (>= 0).
      window: the recorded steps kept (>= 1).
      sample_every: after the first `window` steps, `sampled()` is true one step in this many (>= 1).
    """

    def __init__(self, gradients: int, buckets: int, window: int = DEFAULT_WINDOW,
                 sample_every: int = TIMELINE_SAMPLE_EVERY):
        if gradients < 0 or buckets < 0:
            raise ValueError(f"gradients and buckets must be >= 0, got {gradients} and {buckets}")
        if window < 1:
            raise ValueError(f"window must be >= 1 step, got {window}")
        if sample_every < 1:
            raise ValueError(f"sample_every must be >= 1 step, got {sample_every}")
        self.gradients, self.buckets, self.window = int(gradients), int(buckets), int(window)
        self.sample_every = int(sample_every)
        self.clocked = clocked_positions(self.gradients)
        with tf.init_scope():
            self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfcomp_timeline_steps")
            self.seen = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfcomp_timeline_seen")
            self.ready = tf.Variable(tf.zeros([self.window, len(self.clocked)], tf.float64), trainable=False,
                                     name="tfcomp_timeline_ready")
            self.ends = tf.Variable(tf.zeros([self.window, self.buckets], tf.float64), trainable=False,
                                    name="tfcomp_timeline_bucket_ends")

    def sampled(self) -> tf.Tensor:
        """bool scalar: whether this step is to be recorded (each of the first `window` steps that
        ask, then one in `sample_every`), from the steps seen so far, which it counts (an
        assign_add that waits for no tensor of the step). Call it once a step, at its start."""
        seen = self.seen.read_value()
        self.seen.assign_add(1)
        return tf.logical_or(seen < self.window, seen % self.sample_every == 0)

    def record(self, ready, bucket_ends) -> tf.Operation:
        """Records one step: `ready`, float64 [len(clocked)], when the gradients at `clocked` were
        computed, and `bucket_ends`, float64 [buckets], when each bucket's reduced gradients were
        (seconds since the epoch: `tfcomp.counters.stamps`). Returns the op."""
        clocks, buckets = int(ready.shape[0]), int(bucket_ends.shape[0])
        if clocks != len(self.clocked) or buckets != self.buckets:
            raise ValueError(f"the timeline clocks {len(self.clocked)} gradients and {self.buckets} buckets, got "
                             f"{clocks} and {buckets} times")
        if not self.gradients:
            return tf.no_op()
        origin = tf.reduce_min(ready)
        row = tf.cast(self.steps % self.window, tf.int32)
        updates = [self.ready.scatter_nd_update([[row]], [ready - origin])]
        if self.buckets:
            updates.append(self.ends.scatter_nd_update([[row]], [bucket_ends - origin]))
        with tf.control_dependencies(updates):
            return self.steps.assign_add(1).op

    def read(self) -> dict:
        """{"steps": the steps the medians are over (at most `window`), "ready_seconds": [float per
        gradient: the clocked ones' medians, the others interpolated by position], "bucket_end_seconds":
        [float per bucket], "backward_seconds": float (the latest clocked gradient's ready time)}:
        medians over the recorded steps; empty lists and 0 before any."""
        steps = int(min(self.steps.numpy(), self.window))
        if steps == 0:
            return {"steps": 0, "ready_seconds": [], "bucket_end_seconds": [], "backward_seconds": 0.0}
        ready, ends = self.ready.numpy()[:steps], self.ends.numpy()[:steps]
        interpolated = np.interp(np.arange(self.gradients), self.clocked, np.median(ready, axis=0)) \
            if self.gradients else []
        return {"steps": steps, "ready_seconds": [float(t) for t in interpolated],
                "bucket_end_seconds": [float(t) for t in np.median(ends, axis=0)],
                "backward_seconds": float(np.median(ready.max(axis=1))) if self.gradients else 0.0}
