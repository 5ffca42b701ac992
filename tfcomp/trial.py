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
trial takes each arm's median and quartiles, each averaged over the ranks (one allreduce of six
float64). The plan is kept only beyond the noise the trial measured: where its median step is
shorter than dense's by more than `margin` of dense's (`tfcomp.planning.COMPRESSION_MARGIN`, 5 %)
AND the plan arm's upper quartile lies below the dense arm's lower quartile (the arms' middle
halves do not overlap); otherwise every later step sends everything dense. The quartiles are
NumPy's default percentiles (linear interpolation between the sorted steps). Every rank reaches the
same choice (the allreduced figures are the same bits on every rank), and rank 0 shows the verdict,
saying which test decided (`tfcomp.report`). Three blocks, not steps alternating: each switch from the plan to
dense sends what error feedback kept at once, and an Adam-corrected ViT whose trial alternated
pairs of steps (ten such flushes) was 21 to 24 points less accurate at steps 50 and 100
(research/notebook.md); here a dropped plan flushes twice, each time about half the residual steps that
one arm after the other flushed.

The trial counts only the steps after the compressor's warm-up (which the plan sends dense).
The trial's variables are not training state: they live outside checkpoints (the holder is not a
trackable object), so a restored job tries its plan again on its own network.
"""

from __future__ import annotations

import functools

import tensorflow as tf

from tfcomp import report
from tfcomp.counters import stamp
from tfcomp.planning import COMPRESSION_MARGIN

__all__ = ["PlanTrial", "trial_schedule", "verdict"]

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
    """The trial of one plan: `steps` timed steps per arm (>= 1); `margin` the fraction of dense's
    median step the plan's must beat (default `tfcomp.planning.COMPRESSION_MARGIN`); `clock` gives
    the time (a float64 scalar tensor of seconds; default `tfcomp.counters.stamp`, which waits for
    nothing). Create it eagerly.

    `sends_compressed(collectives)` (inside the step) is the bool scalar that picks this step's
    branch: it records the last step's time, decides once both arms are timed, and counts the step.
    """

    def __init__(self, steps: int, margin: float = COMPRESSION_MARGIN, clock=stamp):
        self.schedule = trial_schedule(steps)
        self.steps, self.margin, self.clock = int(steps), float(margin), clock
        with tf.init_scope():
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfcomp_trial_step")
            self.last_start = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="tfcomp_trial_last_start")
            # Seconds per timed step: row 0 the plan's arm, row 1 dense's (`trial_schedule`'s columns).
            self.seconds = tf.Variable(tf.zeros([2, self.steps], tf.float64), trainable=False,
                                       name="tfcomp_trial_seconds")
            self.choice = tf.Variable(_UNDECIDED, dtype=tf.int32, trainable=False, name="tfcomp_trial_choice")
            # Rows median, lower quartile, upper quartile; columns the plan's arm, dense's (averaged over the ranks).
            self.figures = tf.Variable(tf.zeros([3, 2], tf.float64), trainable=False, name="tfcomp_trial_figures")

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
        """Sets `choice` from both arms' medians and quartiles averaged over the ranks (one
        allreduce); returns whether the plan is kept."""
        ordered = tf.sort(self.seconds, axis=1)
        quantiles = tf.stack([_quantile(ordered, self.steps, q) for q in (0.5, 0.25, 0.75)])  # [3, 2]
        total, = collectives.allreduce_sum([quantiles])
        figures = total / float(collectives.size)
        keep = ((figures[0, 0] < (1.0 - self.margin) * figures[0, 1])  # the medians, by more than the margin
                & (figures[2, 0] < figures[1, 1]))  # the plan's upper quartile below dense's lower one
        assigned = [self.figures.assign(figures), self.choice.assign(tf.where(keep, _COMPRESSED, _DENSE))]
        if collectives.rank == 0:
            assigned.append(tf.py_function(functools.partial(_show_verdict, self.margin), [figures], Tout=tf.bool))
        with tf.control_dependencies(assigned):
            return tf.identity(keep)

    def read(self) -> dict:
        """{"decided": bool, "compressed": bool (the plan kept; True until decided),
        "compressed_ms", "dense_ms": float (the arms' median steps, each averaged over the ranks),
        "compressed_quartiles_ms", "dense_quartiles_ms": (lower, upper) floats (the arms' quartiles,
        likewise), all 0 until decided, and "verdict": str (`verdict`: which test decided; "" until
        decided)}."""
        choice = int(self.choice.numpy())
        figures = self.figures.numpy()
        result = {"decided": choice != _UNDECIDED, "compressed": choice != _DENSE,
                  "compressed_ms": 1e3 * float(figures[0, 0]), "dense_ms": 1e3 * float(figures[0, 1]),
                  "compressed_quartiles_ms": (1e3 * float(figures[1, 0]), 1e3 * float(figures[2, 0])),
                  "dense_quartiles_ms": (1e3 * float(figures[1, 1]), 1e3 * float(figures[2, 1]))}
        result["verdict"] = verdict(figures, self.margin) if result["decided"] else ""
        return result


def _quantile(ordered, steps: int, q: float) -> tf.Tensor:
    """float64 [2]: each row's `q` quantile of `ordered` (rows sorted, `steps` columns), interpolated
    linearly between the two closest ranks as NumPy's default percentile is."""
    position = q * (steps - 1)
    below = int(position)
    above = min(below + 1, steps - 1)
    fraction = position - below
    return ordered[:, below] * (1.0 - fraction) + ordered[:, above] * fraction


def verdict(figures, margin: float = COMPRESSION_MARGIN) -> str:
    """The trial's verdict in words, saying which test decided, from `figures` (float64 [3, 2]
    seconds: rows median, lower quartile, upper quartile; columns the plan's arm, dense's) and the
    `margin` (a fraction of dense's median step)."""
    (plan_median, dense_median), (_, dense_lower), (plan_upper, _) = [[float(v) for v in row] for row in figures]
    gain = 1.0 - plan_median / dense_median if dense_median > 0.0 else 0.0
    measured = (f"tfcomp: plan tried in training: median step {1e3 * plan_median:.1f} ms with the plan, "
                f"{1e3 * dense_median:.1f} ms dense ({100.0 * gain:.1f} % shorter)")
    if not gain > margin:
        return (f"{measured}: not more than the {100.0 * margin:.0f} % margin; every bucket is sent dense from now "
                "on")
    if not plan_upper < dense_lower:
        return (f"{measured}, but the plan's upper quartile {1e3 * plan_upper:.1f} ms is not below dense's lower "
                f"quartile {1e3 * dense_lower:.1f} ms: the gain is within the noise this trial measured; every "
                "bucket is sent dense from now on")
    return (f"{measured}: more than the {100.0 * margin:.0f} % margin, and the plan's upper quartile "
            f"{1e3 * plan_upper:.1f} ms is below dense's lower quartile {1e3 * dense_lower:.1f} ms; the plan is kept")


def _show_verdict(margin: float, figures) -> tf.Tensor:
    """Rank 0's py_function at the decision step: shows `verdict` (`tfcomp.report`)."""
    report.show(verdict(figures.numpy(), margin), rank=0)
    return tf.constant(True)
