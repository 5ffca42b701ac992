"""The exchange's state: per-source error-feedback residuals (and DGC momentum) and a step counter.

`ExchangeState` is a `tf.Module` that lives outside any traced function: the exchange that owns it
finds the same state on every call and every retrace, and the optimizer tracks it, so
`tf.train.Checkpoint(optimizer=...)`, `model.save` and their restores carry every residual and the
step. Residuals are created on first use, in the order the gradients arrive, under `tf.init_scope`
(like Keras optimizer slots), so a restored optimizer recreates them in the same order and receives
their values.

A source is what a gradient belongs to: a `tf.Variable` (keyed by `var.ref()`), or any hashable key
the exchange gives a watched tensor (its position and shape in the list it was given).

For a source of n elements (any shape) the memory holds float32 [n] vectors:
  residual: what was not sent yet (plain error feedback), or DGC's accumulated velocity v;
  momentum: DGC's momentum u (only with momentum correction).
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["ErrorFeedback", "ExchangeState", "source_key"]


def source_key(source):
    """The key of a gradient's source: `var.ref()` for a variable, the source itself otherwise."""
    return source.ref() if isinstance(source, tf.Variable) else source


class _SlotIndex(dict):
    """source key -> slot number. A dict subclass that tf.Module does not track (its keys are not
    strings); the slots themselves are tracked through the residual and momentum lists."""


class ErrorFeedback(tf.Module):
    """Residual and momentum vectors, one per source, created lazily."""

    def __init__(self, name: str = "error_feedback"):
        super().__init__(name=name)
        self.residuals = []
        self.momenta = []
        self._slot_of = _SlotIndex()

    def _slot(self, source, size: int, with_momentum: bool) -> int:
        key = source_key(source)
        if key not in self._slot_of:
            with tf.init_scope():
                index = len(self.residuals)
                self.residuals.append(tf.Variable(tf.zeros([size]), trainable=False, name=f"residual_{index}"))
                self.momenta.append(
                    tf.Variable(tf.zeros([size if with_momentum else 0]), trainable=False, name=f"momentum_{index}")
                )
            self._slot_of[key] = index
        index = self._slot_of[key]
        if self.residuals[index].shape.num_elements() != size:
            raise ValueError(f"the gradient of {getattr(source, 'name', source)!r} has {size} elements, but its "
                             f"error-feedback residual has {self.residuals[index].shape.num_elements()}")
        return index

    def residual(self, source, size: int, with_momentum: bool = False) -> tf.Variable:
        """The residual (or DGC velocity) of `source`: float32 [size]."""
        return self.residuals[self._slot(source, size, with_momentum)]

    def momentum(self, source, size: int) -> tf.Variable:
        """DGC's momentum of `source`: float32 [size]."""
        return self.momenta[self._slot(source, size, True)]


class ExchangeState(tf.Module):
    """What an exchange carries from step to step: `memory` (ErrorFeedback), `step`, an int64
    scalar variable counting communicating steps (the per-step seeds derive from it), and
    `owner`, int64 [2]: the rank and world size whose residuals these are (a checkpoint restores
    it with the residuals, so a rank can tell that it got another rank's)."""

    def __init__(self, rank: int = 0, size: int = 1, name: str = "exchange_state"):
        super().__init__(name=name)
        self.memory = ErrorFeedback()
        with tf.init_scope():
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="communication_step")
            self.owner = tf.Variable([rank, size], dtype=tf.int64, trainable=False, name="owner")
