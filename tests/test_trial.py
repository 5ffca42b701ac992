"""The plan trial (tfcomp.trial.PlanTrial): its schedule of compressed and dense steps, what it
records, and the choice, on a clock the test sets (no timing of this machine)."""

import numpy as np
import pytest
import tensorflow as tf

from tfcomp.collectives import LocalCollectives
from tfcomp.trial import TRIAL_MARGIN, PlanTrial


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


@pytest.mark.parametrize("steps", [1, 3, 10])
def test_schedule_is_the_plan_then_dense_then_the_choice(steps):
    rng = np.random.default_rng(steps)
    seconds = {True: 0.1 + 0.01 * rng.random(), False: 0.2 + 0.01 * rng.random()}
    sent, trial = _run(lambda compressed, _: seconds[compressed], steps, 2 * (steps + 1) + 5)
    assert sent == [True] * (steps + 1) + [False] * (steps + 1) + [True] * 5
    result = trial.read()
    assert result["decided"] and result["compressed"]
    np.testing.assert_allclose([result["compressed_ms"], result["dense_ms"]],
                               [1e3 * seconds[True], 1e3 * seconds[False]], rtol=1e-9)


def test_slower_plan_falls_back_to_dense_for_good():
    sent, trial = _run(lambda compressed, _: 0.30 if compressed else 0.25, 4, 20)
    assert sent[:10] == [True] * 5 + [False] * 5 and not any(sent[10:])
    assert trial.read() == {"decided": True, "compressed": False, "compressed_ms": pytest.approx(300.0),
                            "dense_ms": pytest.approx(250.0)}


@pytest.mark.parametrize("ratio, kept", [(0.97, True), (0.99, False), (1.0, False)])
def test_plan_kept_only_when_shorter_by_the_margin(ratio, kept):
    sent, trial = _run(lambda compressed, _: 0.2 * ratio if compressed else 0.2, 2, 8)
    assert trial.read()["compressed"] is kept and sent[-1] is kept


def test_medians_leave_out_each_arms_first_step_and_outliers():
    rng = np.random.default_rng(7)
    steps = 5
    # Each arm's first step (a first run of its graph) and one more step are very slow; the
    # medians of the rest decide.
    compressed = 0.1 + 0.01 * rng.random(steps + 1)
    dense = 0.2 + 0.01 * rng.random(steps + 1)
    compressed[[0, 3]] = 50.0
    dense[[0, 2]] = 90.0

    def step_seconds(is_compressed, call):
        if call > 2 * steps + 1:
            return 0.1  # after the choice
        return compressed[call] if is_compressed else dense[call - steps - 1]

    _, trial = _run(step_seconds, steps, 2 * (steps + 1) + 1)
    result = trial.read()
    assert result["compressed_ms"] == pytest.approx(1e3 * np.median(compressed[1:]))
    assert result["dense_ms"] == pytest.approx(1e3 * np.median(dense[1:]))
    assert result["compressed"]


def test_undecided_until_both_arms_are_timed():
    sent, trial = _run(lambda compressed, _: 0.1, 3, 7)
    assert trial.read() == {"decided": False, "compressed": True, "compressed_ms": 0.0, "dense_ms": 0.0}
    assert sent == [True] * 4 + [False] * 3


def test_steps_must_be_positive():
    with pytest.raises(ValueError, match="steps >= 1"):
        PlanTrial(0)
