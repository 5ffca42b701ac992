"""Error feedback: per-variable residuals (and DGC momentum) kept as tracked tf.Variables.

`ErrorFeedback` is a `tf.Module`; the exchange that owns it is tracked by the optimizer, so
`tf.train.Checkpoint(optimizer=...)`, `model.save` and their restores carry every residual. Variables
are created on first use, in the order the gradients arrive, outside any tf.function (like Keras
optimizer slots), so a restored optimizer recreates them in the same order and receives their values.

For a variable of n elements (any shape) the memory holds float32 [n] vectors:
  residual: what was not sent yet (plain error feedback), or DGC's accumulated velocity v;
  momentum: DGC's momentum u (only with momentum correction).
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["ErrorFeedback"]


class _SlotIndex(dict):
    """var.ref() -> slot number. A dict subclass that tf.Module does not track (its keys are not
    strings); the slots themselves are tracked through the residual and momentum lists."""


class ErrorFeedback(tf.Module):
    """Residual and momentum vectors, one per variable, created lazily."""

    def __init__(self, name: str = "error_feedback"):
        super().__init__(name=name)
        self.residuals = []
        self.momenta = []
        self._slot_of = _SlotIndex()

    def _slot(self, var, size: int, with_momentum: bool) -> int:
        key = var.ref()
        if key not in self._slot_of:
            with tf.init_scope():
                index = len(self.residuals)
                self.residuals.append(tf.Variable(tf.zeros([size]), trainable=False, name=f"residual_{index}"))
                self.momenta.append(
                    tf.Variable(tf.zeros([size if with_momentum else 0]), trainable=False, name=f"momentum_{index}")
                )
            self._slot_of[key] = index
        return self._slot_of[key]

    def residual(self, var, size: int, with_momentum: bool = False) -> tf.Variable:
        """The residual (or DGC velocity) of `var`: float32 [size]."""
        return self.residuals[self._slot(var, size, with_momentum)]

    def momentum(self, var, size: int) -> tf.Variable:
        """DGC's momentum of `var`: float32 [size]."""
        return self.momenta[self._slot(var, size, True)]
