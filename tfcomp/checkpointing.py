"""Checkpoints that carry every rank's error-feedback memory when only rank 0 writes them.

Each rank's residuals (and DGC momenta) are its own: a checkpoint that rank 0 alone writes holds
rank 0's, and a rank that restores it would go on with rank 0's memory. `gather_state` (a
collective: every rank calls it, at the same step) copies every rank's memory to rank 0, into the
exchange's state, so the checkpoint rank 0 then writes carries them all; each rank takes back its
own on restore (`tfcomp.memory.ExchangeState.adopt_gathered`), or, restored onto another number of
ranks, their mean (the update still owed). Horovod's usual pattern becomes:

    tfcomp.checkpointing.gather_state(optimizer)      # every rank (or the tape of a custom loop)
    if hvd.rank() == 0:
        checkpoint.save(prefix)                      # tf.train.Checkpoint(model=..., optimizer=...)
    ...
    checkpoint.restore(path)                         # every rank: continues exactly

With `model.fit`, `GatherStateCallback()` placed before `ModelCheckpoint` gathers at the end of
every epoch (ModelCheckpoint's default `save_freq`). Gathering costs one allgather of the memory
(as much as one dense allreduce) and leaves a copy of every rank's memory on rank 0 until the next
step that restores or gathers.
"""

from __future__ import annotations

import tensorflow as tf

from tfcomp.collectives import allgather_rows
from tfcomp.horovod_glue import exchange_of

__all__ = ["GatherStateCallback", "gather_state"]


def gather_state(distributed) -> None:
    """Copies every rank's error-feedback memory to rank 0 (a collective: call it on every rank
    of the exchange's process set, at the same step, right before rank 0 saves a checkpoint).

    Args:
      distributed: a distributed optimizer or tape built with a tfcomp compressor, or its
        `GradientExchange` (`tfcomp.exchange_of`).
    """
    exchange = exchange_of(distributed)
    state, process_set = exchange.state, exchange.process_set
    if not process_set.included():
        return
    with tf.init_scope():
        vectors = state.memory_vectors()
        gathered = allgather_rows(vectors, process_set, "tfcomp_gather_state")
        for index, rows in enumerate(gathered):
            state.gathered_vector(index).assign(rows if process_set.rank() == 0 else tf.zeros([0]))
        state.gathered_step.assign(state.step)


class GatherStateCallback(tf.keras.callbacks.Callback):
    """Runs `gather_state` on the model's optimizer at the end of every epoch. Give it to
    `model.fit` on every rank, before rank 0's `ModelCheckpoint`."""

    def on_epoch_end(self, epoch, logs=None):
        del epoch, logs
        optimizer = self.model.optimizer
        gather_state(getattr(optimizer, "inner_optimizer", optimizer))
