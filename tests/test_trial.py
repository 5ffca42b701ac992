"""The plan trial (tfcomp.trial.PlanTrial): its schedule of compressed and dense steps, what it
records, and the choice, on a clock the test sets (no timing of this machine)."""

import numpy as np
import pytest
import tensorflow as tf

from tfcomp.collectives import LocalCollectives
from tfcomp.trial import TRIAL_MARGIN, PlanTrial, trial_length


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


def _alternating(steps: int) -> list:
    """The trial's schedule: pairs of plan steps (True) and dense steps (False), alternating,
    `steps` pairs each."""
    return [True, True, False, False] * steps


@pytest.mark.parametrize("steps", [1, 3, 10])
def test_schedule_alternates_pairs_of_plan_and_dense_steps_then_the_choice(steps):
    rng = np.random.default_rng(steps)
    seconds = {True: 0.1 + 0.01 * rng.random(), False: 0.2 + 0.01 * rng.random()}
    sent, trial = _run(lambda compressed, _: seconds[compressed], steps, trial_length(steps) + 5)
    assert trial_length(steps) == trial.decision_step == 4 * steps
    assert sent == _alternating(steps) + [True] * 5
    result = trial.read()
    assert result["decided"] and result["compressed"]
    np.testing.assert_allclose([result["compressed_ms"], result["dense_ms"]],
                               [1e3 * seconds[True], 1e3 * seconds[False]], rtol=1e-9)


def test_a_drift_slows_both_arms_alike():
    # Every step 1 % longer than the one before: one arm after the other, the second arm would
    # measure about 20 % longer for the same work; alternating pairs, about 2 % (one pair).
    steps = 10
    sent, trial = _run(lambda compressed, call: 0.2 * 1.01 ** call, steps, trial_length(steps) + 1)
    result = trial.read()
    assert result["dense_ms"] / result["compressed_ms"] == pytest.approx(1.01 ** 2, rel=1e-6)
    assert not result["compressed"]  # 2 % is not shorter by more than the margin


def test_slower_plan_falls_back_to_dense_for_good():
    sent, trial = _run(lambda compressed, _: 0.30 if compressed else 0.25, 4, 26)
    assert sent[:16] == _alternating(4) and not any(sent[16:])
    assert trial.read() == {"decided": True, "compressed": False, "compressed_ms": pytest.approx(300.0),
                            "dense_ms": pytest.approx(250.0)}


@pytest.mark.parametrize("ratio, kept", [(0.97, True), (0.99, False), (1.0, False)])
def test_plan_kept_only_when_shorter_by_the_margin(ratio, kept):
    sent, trial = _run(lambda compressed, _: 0.2 * ratio if compressed else 0.2, 2, 9)
    assert trial.read()["compressed"] is kept and sent[-1] is kept


def test_medians_time_the_second_step_of_each_pair_and_leave_out_outliers():
    rng = np.random.default_rng(7)
    steps = 5
    schedule = _alternating(steps)
    # The first step of every pair (a change of arm) and one timed step of each arm are very slow;
    # the medians of the other timed steps decide.
    seconds = np.where(schedule, 0.1, 0.2) + 0.01 * rng.random(len(schedule))
    seconds[0::2] = 50.0
    timed = {arm: [call for call in range(1, len(schedule), 2) if schedule[call] == arm] for arm in (True, False)}
    seconds[timed[True][2]] = seconds[timed[False][1]] = 90.0

    def step_seconds(is_compressed, call):
        assert call >= len(schedule) or is_compressed == schedule[call]
        return seconds[call] if call < len(schedule) else 0.1  # after the choice

    _, trial = _run(step_seconds, steps, trial_length(steps) + 1)
    result = trial.read()
    assert result["compressed_ms"] == pytest.approx(1e3 * np.median(seconds[timed[True]]))
    assert result["dense_ms"] == pytest.approx(1e3 * np.median(seconds[timed[False]]))
    assert result["compressed"]


def test_undecided_until_both_arms_are_timed():
    sent, trial = _run(lambda compressed, _: 0.1, 3, 12)
    assert trial.read() == {"decided": False, "compressed": True, "compressed_ms": 0.0, "dense_ms": 0.0}
    assert sent == _alternating(3)


def test_steps_must_be_positive():
    with pytest.raises(ValueError, match="steps >= 1"):
        PlanTrial(0)
