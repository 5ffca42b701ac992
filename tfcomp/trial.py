"""The plan tried on the running job: compressed and dense steps timed, the faster kept.

The cost model prices a plan from probes run before training; a training step is more than that
(the backward pass overlaps a dense allreduce; four workers computing on shared cores slow
compression down). So a plan that compresses is confirmed in training: `PlanTrial(steps)` times
`steps` steps with the plan and `steps` with everything dense (`Plan.all_dense`), each from the
start of one step to the start of the next (the whole training step, forward and backward
included), in three blocks (`trial_schedule`): half the plan's steps, all of dense's, the plan's
other half (A B B A: a drift of the machine's speed that is linear over the trial touches both
arms alike; under a drift of 1 % a step, one arm after the other gives dense's median 12 % more,
three blocks 0.2 %). Each block's first step is left out (a first run of its graph; the dense
block's first step also sends the residuals left by the plan's block). At the next step the
trial takes the median of each arm over all ranks (one allreduce of two float64). The plan is
kept only where its median step is at least `margin` (2 %) shorter than dense's; otherwise every
later step sends everything dense. Every rank reaches the same choice (the allreduced medians are
the same bits on every rank). Three blocks, not steps alternating: each switch from the plan to
dense sends what error feedback kept at once, and an Adam-corrected ViT whose trial alternated
pairs of steps (ten such flushes) was 21 to 24 points less accurate at steps 50 and 100
(research/notebook.md); here a dropped plan flushes twice, each time about half the residual steps that
one arm after the other flushed.

The trial counts only the steps after the compressor's warm-up (which the plan sends dense).
The trial's variables are not training state: they live outside checkpoints (the holder is not a
trackable object), so a restored job tries its plan again on its own network.
"""

from __future__ import annotations

import tensorflow as tf
from absl import logging

from tfcomp.counters import stamp

__all__ = ["PlanTrial", "TRIAL_MARGIN", "trial_schedule"]

TRIAL_MARGIN = 0.02  # the plan's median step must be this much shorter than dense's to be kept
_UNDECIDED, _DENSE, _COMPRESSED = -1, 0, 1
_PLAN_ARM, _DENSE_ARM = 0, 1  # rows of PlanTrial.seconds


def trial_schedule(steps: int) -> tuple:
    """The trial's steps in order, as (arm, column) pairs: arm 0 the plan's, 1 dense's; column
    the step's place in its arm's row of timed seconds, -1 for a block's untimed first step. Three
    blocks: the plan's first ceil(steps / 2) timed steps, dense's `steps`, the plan's other
    floor(steps / 2) (none for steps = 1), each after its untimed step: 2 x steps + 3 steps in all
    (4 for steps = 1)."""
    if steps < 1:
        raise ValueError(f"a plan trial needs steps >= 1 per arm, got {steps}")
    first = (steps + 1) // 2
    blocks = [(_PLAN_ARM, 0, first), (_DENSE_ARM, 0, steps), (_PLAN_ARM, first, steps - first)]
    return tuple(pair for arm, start, count in blocks if count
                 for pair in [(arm, -1)] + [(arm, start + i) for i in range(count)])


class PlanTrial:
    """The trial of one plan: `steps` timed steps per arm (>= 1); `clock` gives the time (a
    float64 scalar tensor of seconds; default `tfcomp.counters.stamp`, which waits for nothing).
    Create it eagerly.

    `sends_compressed(collectives)` (inside the step) is the bool scalar that picks this step's
    branch: it records the last step's time, decides once both arms are timed, and counts the step.
    """

    def __init__(self, steps: int, margin: float = TRIAL_MARGIN, clock=stamp):
        self.schedule = trial_schedule(steps)
        self.steps, self.margin, self.clock = int(steps), float(margin), clock
        with tf.init_scope():
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfcomp_trial_step")
            self.last_start = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="tfcomp_trial_last_start")
            # Seconds per timed step: row 0 the plan's arm, row 1 dense's (`trial_schedule`'s columns).
            self.seconds = tf.Variable(tf.zeros([2, self.steps], tf.float64), trainable=False,
                                       name="tfcomp_trial_seconds")
            self.choice = tf.Variable(_UNDECIDED, dtype=tf.int32, trainable=False, name="tfcomp_trial_choice")
            self.medians = tf.Variable(tf.zeros([2], tf.float64), trainable=False, name="tfcomp_trial_medians")

    @property
    def decision_step(self) -> int:
        """The trial step (counted from 0 in this job) at whose start the choice is made."""
        return len(self.schedule)

    def sends_compressed(self, collectives) -> tf.Tensor:
        """bool scalar: whether this step runs the plan (True) or sends everything dense."""
        now = self.clock()
        j = self.step.read_value()
        arms = tf.constant([arm for arm, _ in self.schedule], tf.int64)
        columns = tf.constant([column for _, column in self.schedule], tf.int64)
        last = tf.clip_by_value(j - 1, 0, self.decision_step - 1)
        column = tf.gather(columns, last)  # of the step that just ended; -1: left out
        recorded = tf.cond((j >= 1) & (j <= self.decision_step) & (column >= 0),
                           lambda: self._record(tf.gather(arms, last), column, now - self.last_start),
                           lambda: tf.constant(False))
        with tf.control_dependencies([recorded]):
            decided = tf.cond(tf.equal(j, self.decision_step), lambda: self._decide(collectives),
                              lambda: tf.constant(False))
        with tf.control_dependencies([decided]):
            choice = self.choice.read_value()
            scheduled = tf.equal(tf.gather(arms, tf.minimum(j, self.decision_step - 1)), _PLAN_ARM)
            compressed = tf.where(tf.equal(choice, _UNDECIDED), scheduled, tf.equal(choice, _COMPRESSED))
            with tf.control_dependencies([self.last_start.assign(now), self.step.assign_add(1)]):
                return tf.identity(compressed)

    def _record(self, arm, position, seconds) -> tf.Tensor:
        with tf.control_dependencies([self.seconds.scatter_nd_update([[arm, position]], [seconds])]):
            return tf.constant(True)

    def _decide(self, collectives) -> tf.Tensor:
        """Sets `choice` from both arms' medians averaged over the ranks (one allreduce); returns
        whether the plan is kept."""
        ordered = tf.sort(self.seconds, axis=1)
        medians = (ordered[:, (self.steps - 1) // 2] + ordered[:, self.steps // 2]) / 2.0
        total, = collectives.allreduce_sum([medians])
        medians = total / float(collectives.size)
        keep = medians[0] < (1.0 - self.margin) * medians[1]
        assigned = [self.medians.assign(medians), self.choice.assign(tf.where(keep, _COMPRESSED, _DENSE))]
        if collectives.rank == 0:
            assigned.append(tf.py_function(_log_choice, [medians, keep], Tout=tf.bool))
        with tf.control_dependencies(assigned):
            return tf.identity(keep)

    def read(self) -> dict:
        """{"decided": bool, "compressed": bool (the plan kept; True until decided),
        "compressed_ms": float, "dense_ms": float (the arms' median steps over the ranks; 0 until
        decided)}."""
        choice = int(self.choice.numpy())
        compressed_ms, dense_ms = (1e3 * float(s) for s in self.medians.numpy())
        return {"decided": choice != _UNDECIDED, "compressed": choice != _DENSE,
                "compressed_ms": compressed_ms, "dense_ms": dense_ms}


def _log_choice(medians, keep):
    compressed_ms, dense_ms = (1e3 * float(s) for s in medians.numpy())
    verdict = "the plan is kept" if bool(keep.numpy()) else "every bucket is sent dense from now on"
    logging.info("tfcomp: plan tried in training: median step %.1f ms with the plan, %.1f ms dense: %s",
                 compressed_ms, dense_ms, verdict)
    return keep
