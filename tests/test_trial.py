"""The plan trial (tfcomp.trial.PlanTrial): its schedule of compressed and dense steps (half the
plan's, dense's, the plan's other half), what it records, and the choice, on a clock the test sets
(no timing of this machine)."""

import numpy as np
import pytest
import tensorflow as tf

from tfcomp.collectives import LocalCollectives
from tfcomp.trial import TRIAL_MARGIN, PlanTrial, trial_schedule


class _Clock:
    def __init__(self):
        self.now = tf.Variable(0.0, dtype=tf.float64)

    def __call__(self):
        return self.now.read_value()


def _run(step_seconds, steps: int, calls: int, margin: float = TRIAL_MARGIN):
    """(what sends_compressed returned at each call, the trial), each step taking
    step_seconds(compressed, call) seconds of the fake clock."""
    clock = _Clock()
    trial = PlanTrial(steps, margin=margin, clock=clock)
    function = tf.function(lambda: trial.sends_compressed(LocalCollectives(1)), autograph=False)
    sent = []
    for call in range(calls):
        compressed = bool(function().numpy())
        sent.append(compressed)
        clock.now.assign_add(step_seconds(compressed, call))
    return sent, trial


def _scheduled(steps):
    """What sends_compressed returns through the trial: half the plan's steps, dense's, the other half."""
    first = (steps + 1) // 2
    second = [True] * (steps - first + 1) if steps > first else []
    return [True] * (first + 1) + [False] * (steps + 1) + second


@pytest.mark.parametrize("steps", [1, 2, 3, 10])
def test_schedule_is_half_the_plan_then_dense_then_the_plan_then_the_choice(steps):
    rng = np.random.default_rng(steps)
    seconds = {True: 0.1 + 0.01 * rng.random(), False: 0.2 + 0.01 * rng.random()}
    trial = PlanTrial(steps)
    assert trial.decision_step == len(_scheduled(steps)) == 2 * steps + (2 if steps == 1 else 3)
    sent, trial = _run(lambda compressed, _: seconds[compressed], steps, trial.decision_step + 5)
    assert sent == _scheduled(steps) + [True] * 5
    result = trial.read()
    assert result["decided"] and result["compressed"]
    np.testing.assert_allclose([result["compressed_ms"], result["dense_ms"]],
                               [1e3 * seconds[True], 1e3 * seconds[False]], rtol=1e-9)


def test_schedule_columns_fill_each_arms_row_once():
    for steps in range(1, 30):
        schedule = trial_schedule(steps)
        for arm in (0, 1):
            assert sorted(c for a, c in schedule if a == arm and c >= 0) == list(range(steps))
        # Each block starts with its untimed step: wherever the arm changes, and at the start.
        assert [c for a, c in schedule][0] == -1
        assert all(c == -1 for (a, c), (b, _) in zip(schedule[1:], schedule) if a != b)
        assert sum(c == -1 for _, c in schedule) == (2 if steps == 1 else 3)


def test_a_steady_drift_of_the_machine_touches_both_arms_alike():
    # Every step 1 % slower than the one before, the plan as fast as dense: one arm after the
    # other, dense's median would be 12 % longer (1.01 ** 11) and the plan kept; split around dense, the
    # arms' medians agree within 1 % (0.2 % here: the drift compounds, so it is not quite linear).
    steps = 10
    sent, trial = _run(lambda compressed, call: 0.2 * 1.01 ** call, steps, 2 * steps + 3 + 2)
    result = trial.read()
    assert result["compressed_ms"] == pytest.approx(result["dense_ms"], rel=1e-2)
    assert not result["compressed"] and not any(sent[-2:])
    # A plan 5 % faster under the same drift is kept.
    sent, trial = _run(lambda compressed, call: 0.2 * 1.01 ** call * (0.95 if compressed else 1.0), steps,
                       2 * steps + 3 + 2)
    assert trial.read()["compressed"] and all(sent[-2:])


def test_slower_plan_falls_back_to_dense_for_good():
    sent, trial = _run(lambda compressed, _: 0.30 if compressed else 0.25, 4, 20)
    assert sent[:11] == _scheduled(4) and not any(sent[11:])
    assert trial.read() == {"decided": True, "compressed": False, "compressed_ms": pytest.approx(300.0),
                            "dense_ms": pytest.approx(250.0)}


@pytest.mark.parametrize("ratio, kept", [(0.97, True), (0.99, False), (1.0, False)])
def test_plan_kept_only_when_shorter_by_the_margin(ratio, kept):
    sent, trial = _run(lambda compressed, _: 0.2 * ratio if compressed else 0.2, 2, 8)
    assert trial.read()["compressed"] is kept and sent[-1] is kept


def test_medians_leave_out_each_blocks_first_step_and_outliers():
    rng = np.random.default_rng(7)
    steps = 5
    # Each block's first step (a first run of its graph, or a flush) and one more step of each
    # arm are very slow; the medians of the rest decide.
    timed = [0.1 + 0.01 * rng.random(steps), 0.2 + 0.01 * rng.random(steps)]
    timed[0][3], timed[1][2] = 50.0, 90.0
    schedule = trial_schedule(steps)

    def step_seconds(_, call):
        if call >= len(schedule):
            return 0.1  # after the choice
        arm, column = schedule[call]
        return 70.0 if column < 0 else timed[arm][column]

    _, trial = _run(step_seconds, steps, len(schedule) + 1)
    result = trial.read()
    assert result["compressed_ms"] == pytest.approx(1e3 * np.median(timed[0]))
    assert result["dense_ms"] == pytest.approx(1e3 * np.median(timed[1]))
    assert result["compressed"]


def test_undecided_until_both_arms_are_timed():
    sent, trial = _run(lambda compressed, _: 0.1, 3, 9)
    assert trial.read() == {"decided": False, "compressed": True, "compressed_ms": 0.0, "dense_ms": 0.0}
    assert sent == [True] * 3 + [False] * 4 + [True] * 2


def test_steps_must_be_positive():
    for steps in (0, -3):
        with pytest.raises(ValueError, match="steps >= 1"):
            PlanTrial(steps)
