"""The exchange's state: per-source error-feedback residuals (and optimizer moments) and a step counter.

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
  momentum: DGC's momentum u (with momentum correction), or Adam's first moment m (with Adam
    correction); empty otherwise;
  second moment: Adam's v (with Adam correction); empty otherwise.
"""

from __future__ import annotations

import tensorflow as tf
from absl import logging

__all__ = ["ErrorFeedback", "ExchangeState", "source_key"]


def source_key(source):
    """The key of a gradient's source: `var.ref()` for a variable, the source itself otherwise."""
    return source.ref() if isinstance(source, tf.Variable) else source


class _SlotIndex(dict):
    """source key -> slot number. A dict subclass that tf.Module does not track (its keys are not
    strings); the slots themselves are tracked through the residual and momentum lists."""


class ErrorFeedback(tf.Module):
    """Residual, momentum and second-moment vectors, one each per source, created lazily."""

    def __init__(self, name: str = "error_feedback"):
        super().__init__(name=name)
        self.residuals = []
        self.momenta = []
        self.second_moments = []
        self._slot_of = _SlotIndex()

    def _slot(self, source, size: int, optimizer_state: int) -> int:
        key = source_key(source)
        if key not in self._slot_of:
            with tf.init_scope():
                index = len(self.residuals)
                self.residuals.append(tf.Variable(tf.zeros([size]), trainable=False, name=f"residual_{index}"))
                self.momenta.append(tf.Variable(tf.zeros([size if optimizer_state >= 1 else 0]), trainable=False,
                                                name=f"momentum_{index}"))
                self.second_moments.append(tf.Variable(tf.zeros([size if optimizer_state >= 2 else 0]),
                                                       trainable=False, name=f"second_moment_{index}"))
            self._slot_of[key] = index
        index = self._slot_of[key]
        if self.residuals[index].shape.num_elements() != size:
            raise ValueError(f"the gradient of {getattr(source, 'name', source)!r} has {size} elements, but its "
                             f"error-feedback residual has {self.residuals[index].shape.num_elements()}")
        return index

    def pending_restores(self) -> int:
        """How many residuals a checkpoint restore holds for this memory that no source has claimed
        yet (a residual is created, and filled, when a plan first compresses its source)."""
        return len(getattr(self.residuals, "_deferred_dependencies", {}))

    def has(self, source) -> bool:
        """Whether `source` has memory (created by an earlier `residual`, `momentum`, ...)."""
        return source_key(source) in self._slot_of

    def residual(self, source, size: int, optimizer_state: int = 0) -> tf.Variable:
        """The residual (or DGC velocity) of `source`: float32 [size]. `optimizer_state`
        (`Compressor.optimizer_state`): the moments to create with it where it is new."""
        return self.residuals[self._slot(source, size, optimizer_state)]

    def momentum(self, source, size: int) -> tf.Variable:
        """DGC's momentum (or Adam's first moment) of `source`: float32 [size]."""
        return self.momenta[self._slot(source, size, 1)]

    def second_moment(self, source, size: int) -> tf.Variable:
        """Adam's second moment of `source`: float32 [size]."""
        return self.second_moments[self._slot(source, size, 2)]


class ExchangeState(tf.Module):
    """What an exchange carries from step to step, tracked for checkpoints:

      memory: the `ErrorFeedback` (residuals, optimizer moments) of this rank;
      step: int64 scalar, communicating steps so far (the per-step seeds derive from it);
      owner: int64 [2], the rank and world size whose memory this is (a checkpoint restores it
        with the memory, so a rank can tell that it got another rank's);
      gathered_step: int64 scalar, the step at which `tfcomp.checkpointing.gather_state` last
        gathered every rank's memory (-1: never);
      gathered: float32 variables of any shape, one per memory vector (residuals, then momenta,
        then second moments, in slot order): on rank 0, [ranks, n], every rank's vector as of gathered_step (so a
        checkpoint rank 0 writes carries them all); elsewhere empty.
    """

    def __init__(self, rank: int = 0, size: int = 1, name: str = "exchange_state"):
        super().__init__(name=name)
        self.memory = ErrorFeedback()
        self.gathered = []
        with tf.init_scope():
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="communication_step")
            self.owner = tf.Variable([rank, size], dtype=tf.int64, trainable=False, name="owner")
            self.gathered_step = tf.Variable(-1, dtype=tf.int64, trainable=False, name="gathered_step")

    def memory_vectors(self) -> list:
        """Every memory variable of this rank, in the order `gathered` keeps them."""
        return list(self.memory.residuals) + list(self.memory.momenta) + list(self.memory.second_moments)

    def gathered_vector(self, index: int) -> tf.Variable:
        """The gathered variable of memory vector `index`, created empty on first use (a restore
        waiting for it then fills it)."""
        with tf.init_scope():
            while len(self.gathered) <= index:
                self.gathered.append(tf.Variable(tf.zeros([0]), shape=tf.TensorShape(None), trainable=False,
                                                 name=f"gathered_{len(self.gathered)}"))
        return self.gathered[index]

    def adopt_restored(self, rank: int, size: int, error_feedback: bool) -> None:
        """After a restore (the exchange calls it the first time it sees a list of gradients), as
        rank `rank` of `size`: takes this rank's own memory from a checkpoint that carries every
        rank's (`tfcomp.checkpointing.gather_state` ran before it was saved), or, from one saved by
        another number of ranks, their mean (the update still owed), and records this rank as the
        owner. Otherwise, where the memory is another rank's and the compressor keeps one
        (`error_feedback`), says so once: training then goes on, but not as an uninterrupted run
        would. Runs eagerly."""
        with tf.init_scope():
            owner_rank, owner_size = (int(v) for v in self.owner.numpy())
            self.owner.assign([rank, size])
        taken = self.adopt_gathered(rank, size)
        if taken == "mean":
            logging.warning("tfcomp: the checkpoint holds the error-feedback memory of %d ranks; this job has %d, so "
                            "every rank goes on with their mean (the update still owed)", owner_size, size)
        elif not taken and (owner_rank, owner_size) != (rank, size) and error_feedback:
            logging.warning("tfcomp: rank %d of %d restored error-feedback residuals saved by rank %d of %d; it goes "
                            "on with them (an estimate of the update still owed), so training is not bit-identical to "
                            "an uninterrupted run. Call tfcomp.checkpointing.gather_state(optimizer) on every rank "
                            "right before rank 0 saves to resume exactly.", rank, size, owner_rank, owner_size)

    def adopt_gathered(self, rank: int, size: int) -> str:
        """After a restore: if the checkpoint holds every rank's memory gathered at the step it was
        saved, takes this rank's row (or, saved by another number of ranks, the mean of the rows:
        the update still owed) and frees the gathered copies. Returns "exact", "mean", or "" when
        there was nothing to adopt. Runs eagerly."""
        with tf.init_scope():
            kept = self.memory_vectors()
            if not any(v.shape.num_elements() for v in kept) or int(self.gathered_step.numpy()) != int(self.step.numpy()):
                return ""
            rows = [tf.convert_to_tensor(self.gathered_vector(i)) for i in range(len(kept))]
            used = [(r, v) for r, v in zip(rows, kept) if v.shape.num_elements()]
            if any(r.shape.rank != 2 or r.shape[1] != v.shape.num_elements() for r, v in used):
                return ""
            how = "exact" if all(r.shape[0] == size for r, _ in used) else "mean"
            for r, v in used:
                v.assign(r[rank] if how == "exact" else tf.reduce_mean(r, axis=0))
            for g in self.gathered:
                g.assign(tf.zeros([0]))
            self.gathered_step.assign(-1)
        return how
