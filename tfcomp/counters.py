"""What the exchange measures while it runs: bytes sent and time spent, accumulated in the graph.

`ExchangeCounters` holds five scalar variables that the exchange's steps add to (a few scalar ops
a step): the steps, the bytes this worker put on the wire (the real sizes of the tensors handed to
the collectives, counted as they were sent, not as the plan computes them), the bytes a dense
float32 allreduce of the same gradients would have sent, and, over the steps that were timed
(`timed_steps`), the seconds from the exchange's start (all its gradients ready) to its end (every
reduced gradient computed). A compressing step is timed every step (`finish`); a step that runs
Horovod's own reduction (an all-dense plan) counts its steps and bytes at its start, as constants
that wait for no tensor of the step (`count_step`), and is timed only on the steps its timeline
samples (`add_time`, off the step's critical path). `read()` gives them, `reset()` starts again
(`tfcomp.keras.CompressionMonitor` does both once an epoch; its time per step is seconds over
timed steps).

The clocks: `stamp(tensors)` is the time once `tensors` are computed, `stamps(tensors)` each
tensor's. A clock costs a step about as much as any op (3 us here), and one over many tensors keeps
each alive until the last is computed, so the exchange clocks a few (`tfcomp.timeline`).

The counters are not training state: they are kept out of checkpoints and SavedModels (the holder
is not a trackable object), so adding them changed no checkpoint format.
"""

from __future__ import annotations

import tensorflow as tf

from tfcomp import ops

__all__ = ["ExchangeCounters", "stamp", "stamps", "tensor_bytes"]


def tensor_bytes(tensor) -> tf.Tensor:
    """float64 scalar: the bytes of `tensor` (its run-time size times its dtype's size)."""
    return tf.cast(tf.size(tensor, out_type=tf.int64), tf.float64) * float(tensor.dtype.size)


def stamp(tensors=()) -> tf.Tensor:
    """float64 scalar: the time (seconds since the epoch) once `tensors` are all computed.

    The tensors are the data inputs of `tfcomp.ops.time_after` (a `tf.timestamp` under control
    dependencies ran whenever inside a `tf.function`: Grappler's dependency optimizer dropped the
    edges; with none, it is a `tf.timestamp`). And inside a `tf.function` TensorFlow runs stateful
    ops that touch no resource in the order they were created; a clock waiting for the last gradient
    would then hold back every later one, and whatever waits for one (a trial's tf.cond, and
    through it every bucket). This one is marked to run independently: it waits only for `tensors`."""
    tensors = [t for t in tensors if isinstance(t, tf.Tensor)]
    now = ops.time_after(tensors) if tensors else tf.timestamp()
    manager = getattr(now.graph, "experimental_acd_manager", None)
    if manager is not None:
        manager.run_independently(now.op)
    return now


def stamps(tensors) -> tf.Tensor:
    """float64 [len(tensors)]: each tensor's `stamp` (the time once it is computed), one clock per
    tensor; an empty float64 [0] for none."""
    if not tensors:
        return tf.zeros([0], tf.float64)
    return tf.stack([stamp([t]) for t in tensors])


class ExchangeCounters:
    """Scalar variables of one exchange: steps, timed_steps (int64), sent_bytes, dense_bytes,
    seconds (float64; over the timed steps). Create it eagerly (outside any tf.function)."""

    def __init__(self):
        with tf.init_scope():
            self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfcomp_counted_steps")
            self.sent_bytes = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="tfcomp_sent_bytes")
            self.dense_bytes = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="tfcomp_dense_bytes")
            self.seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="tfcomp_exchange_seconds")
            self.timed_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfcomp_timed_steps")

    def _variables(self) -> tuple:
        return self.steps, self.sent_bytes, self.dense_bytes, self.seconds, self.timed_steps

    def add_sent(self, nbytes):
        """Adds float64 `nbytes` sent this step; returns the update op."""
        return self.sent_bytes.assign_add(tf.cast(nbytes, tf.float64))

    def count_step(self, sent_bytes, dense_bytes: float):
        """Counts one step that sends `sent_bytes` (a number, or a float64 scalar tensor for what
        varies from step to step) for gradients of `dense_bytes` (a number): its steps and bytes,
        not its time. Returns the update op."""
        return tf.group(self.steps.assign_add(1), self.add_sent(sent_bytes),
                        self.dense_bytes.assign_add(tf.constant(float(dense_bytes), tf.float64)))

    def add_time(self, ready, ended):
        """Times one step whose gradients were computed at `ready` and reduced at `ended` (float64
        [n] and [m], `stamps` of some of them: the latest of each among them): its seconds run from
        the last gradient to the last reduced one (0 for no gradients). Returns the update op."""
        elapsed = tf.reduce_max(ended) - tf.reduce_max(ready) if ready.shape[0] and ended.shape[0] \
            else tf.constant(0.0, tf.float64)
        return tf.group(self.timed_steps.assign_add(1), self.seconds.assign_add(elapsed))

    def finish(self, ready, ended, dense_bytes: float):
        """Counts and times one step (`add_time`) whose gradients are of `dense_bytes` (its sent
        bytes are added as they are sent: `add_sent`). Returns the update op."""
        return tf.group(self.steps.assign_add(1), self.add_time(ready, ended),
                        self.dense_bytes.assign_add(tf.constant(float(dense_bytes), tf.float64)))

    def read(self) -> dict:
        """{"steps": int, "sent_bytes": float, "dense_bytes": float, "seconds": float (over the timed
        steps), "timed_steps": int} so far."""
        return {"steps": int(self.steps.numpy()), "sent_bytes": float(self.sent_bytes.numpy()),
                "dense_bytes": float(self.dense_bytes.numpy()), "seconds": float(self.seconds.numpy()),
                "timed_steps": int(self.timed_steps.numpy())}

    def reset(self) -> None:
        """Sets every counter back to zero."""
        for variable in self._variables():
            variable.assign(tf.zeros_like(variable))
