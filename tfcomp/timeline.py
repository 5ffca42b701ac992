"""When, inside the training step, each gradient is ready and each bucket's exchange ends.

`ExchangeTimeline(gradients, buckets, window)` keeps, for the last `window` steps of one plan, a
timestamp taken once each gradient of the exchange's list is computed and once each bucket's
reduced gradients are, all relative to the step's first gradient (the start of the exchange: the
backward pass computes the last layer's gradients first). `record(grads, bucket_outputs)` adds
them from inside the step (a few scalar ops; every timestamp waits only for its own tensors, so
the clock holds nothing back: `tfcomp.counters.stamp`). `read()` gives per-gradient and
per-bucket medians over the recorded steps: the gradients' ready times are what the planner
prices the overlap of the exchange with the backward pass from (`tfcomp.planning.make_plan`'s
`ready_seconds`), and together with the buckets' ends they are the step's timeline (how much of
the exchange the backward pass hides).

The timeline is not training state: it lives outside checkpoints (the holder is not a trackable
object).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfcomp.counters import stamp

__all__ = ["DEFAULT_WINDOW", "ExchangeTimeline"]

DEFAULT_WINDOW = 20  # steps whose times are kept (the medians are over them)


class ExchangeTimeline:
    """The last `window` steps' times of `gradients` gradients and `buckets` buckets (float64
    seconds from each step's first gradient). Create it eagerly."""

    def __init__(self, gradients: int, buckets: int, window: int = DEFAULT_WINDOW):
        if gradients < 0 or buckets < 0:
            raise ValueError(f"gradients and buckets must be >= 0, got {gradients} and {buckets}")
        if window < 1:
            raise ValueError(f"window must be >= 1 step, got {window}")
        self.gradients, self.buckets, self.window = int(gradients), int(buckets), int(window)
        with tf.init_scope():
            self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfcomp_timeline_steps")
            self.ready = tf.Variable(tf.zeros([self.window, self.gradients], tf.float64), trainable=False,
                                     name="tfcomp_timeline_ready")
            self.ends = tf.Variable(tf.zeros([self.window, self.buckets], tf.float64), trainable=False,
                                    name="tfcomp_timeline_bucket_ends")

    def record(self, grads, bucket_outputs) -> tf.Operation:
        """Records one step: `grads` (one tensor per gradient: its value, or an IndexedSlices'
        values) and `bucket_outputs` (per bucket, the reduced tensors it gives). Returns the op."""
        if len(grads) != self.gradients or len(bucket_outputs) != self.buckets:
            raise ValueError(f"the timeline holds {self.gradients} gradients and {self.buckets} buckets, got "
                             f"{len(grads)} and {len(bucket_outputs)}")
        if not grads:
            return tf.no_op()
        ready = tf.stack([stamp([g]) for g in grads])
        origin = tf.reduce_min(ready)
        row = tf.cast(self.steps % self.window, tf.int32)
        updates = [self.ready.scatter_nd_update([[row]], [ready - origin])]
        if bucket_outputs:
            ends = tf.stack([stamp(outputs) for outputs in bucket_outputs])
            updates.append(self.ends.scatter_nd_update([[row]], [ends - origin]))
        with tf.control_dependencies(updates):
            return self.steps.assign_add(1).op

    def read(self) -> dict:
        """{"steps": the steps the medians are over (at most `window`), "ready_seconds": [float per
        gradient], "bucket_end_seconds": [float per bucket], "backward_seconds": float (the last
        gradient's ready time)}: medians over the recorded steps; empty lists and 0 before any."""
        steps = int(min(self.steps.numpy(), self.window))
        if steps == 0:
            return {"steps": 0, "ready_seconds": [], "bucket_end_seconds": [], "backward_seconds": 0.0}
        ready, ends = self.ready.numpy()[:steps], self.ends.numpy()[:steps]
        return {"steps": steps, "ready_seconds": [float(t) for t in np.median(ready, axis=0)],
                "bucket_end_seconds": [float(t) for t in np.median(ends, axis=0)],
                "backward_seconds": float(np.median(ready.max(axis=1))) if self.gradients else 0.0}
