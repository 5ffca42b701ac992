"""The plan trial (tfcomp.trial.PlanTrial): its schedule of compressed and dense steps (half the
plan's, dense's, the plan's other half), what it records, and the choice, on a clock the test sets
(no timing of this machine)."""

import numpy as np
import pytest
import tensorflow as tf

from tfcomp.collectives import LocalCollectives
from tfcomp.planning import COMPRESSION_MARGIN
from tfcomp.trial import PlanTrial, trial_schedule, verdict


class _Clock:
    def __init__(self):
        self.now = tf.Variable(0.0, dtype=tf.float64)

    def __call__(self):
        return self.now.read_value()


def _run(step_seconds, steps: int, calls: int, margin: float = COMPRESSION_MARGIN):
    """(what sends_compressed returned at each call, the trial), each step taking
    step_seconds(compressed, call) seconds of the fake clock."""
    sent, trial, _ = _run_timed(step_seconds, steps, calls, margin)
    return sent, trial


def _run_timed(step_seconds, steps: int, calls: int, margin: float = COMPRESSION_MARGIN):
    """`_run`, and the seconds of each arm's timed steps (float64 [2, steps]: the plan's, dense's),
    as the trial's schedule times them."""
    schedule = trial_schedule(steps)
    timed = np.zeros([2, steps])
    clock = _Clock()
    trial = PlanTrial(steps, margin=margin, clock=clock)
    function = tf.function(lambda: trial.sends_compressed(LocalCollectives(1)), autograph=False)
    sent = []
    for call in range(calls):
        compressed = bool(function().numpy())
        sent.append(compressed)
        seconds = step_seconds(compressed, call)
        if call < len(schedule) and schedule[call][1] >= 0:
            timed[schedule[call]] = seconds
        clock.now.assign_add(seconds)
    return sent, trial, timed


def _numpy_choice(timed, margin: float = COMPRESSION_MARGIN):
    """The reference: (kept, [[median], [lower quartile], [upper quartile]] per arm) by NumPy."""
    figures = np.percentile(timed, [50, 25, 75], axis=1)
    return bool(figures[0, 0] < (1.0 - margin) * figures[0, 1] and figures[2, 0] < figures[1, 1]), figures


def _check_against_numpy(trial, timed, margin: float = COMPRESSION_MARGIN) -> bool:
    """Asserts the trial's figures and choice are NumPy's from the seconds it timed; returns the choice."""
    kept, figures = _numpy_choice(timed, margin)
    result = trial.read()
    np.testing.assert_allclose(
        [[result["compressed_ms"], result["dense_ms"]], [result["compressed_quartiles_ms"][0], result["dense_quartiles_ms"][0]],
         [result["compressed_quartiles_ms"][1], result["dense_quartiles_ms"][1]]], 1e3 * figures, rtol=1e-9)
    assert result["decided"] and result["compressed"] is kept
    assert result["verdict"] == verdict(figures, margin)
    return kept


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
    sent, trial, timed = _run_timed(lambda compressed, call: 0.2 * 1.01 ** call, steps, 2 * steps + 3 + 2)
    result = trial.read()
    assert result["compressed_ms"] == pytest.approx(result["dense_ms"], rel=1e-2)
    assert not _check_against_numpy(trial, timed) and not any(sent[-2:])
    # A plan 7 % faster under the same drift beats the margin by its medians, but the drift spreads the
    # plan's arm (before and after dense's) over dense's: within the noise the trial measured, dropped.
    sent, trial, timed = _run_timed(lambda compressed, call: 0.2 * 1.01 ** call * (0.93 if compressed else 1.0), steps,
                                    2 * steps + 3 + 2)
    result = trial.read()
    assert result["compressed_ms"] < (1.0 - COMPRESSION_MARGIN) * result["dense_ms"]
    assert not _check_against_numpy(trial, timed) and not any(sent[-2:]) and "within the noise" in result["verdict"]
    # Twice as fast under the same drift: kept.
    sent, trial, timed = _run_timed(lambda compressed, call: 0.2 * 1.01 ** call * (0.5 if compressed else 1.0), steps,
                                    2 * steps + 3 + 2)
    assert _check_against_numpy(trial, timed) and all(sent[-2:]) and "kept" in trial.read()["verdict"]


def test_slower_plan_falls_back_to_dense_for_good():
    sent, trial = _run(lambda compressed, _: 0.30 if compressed else 0.25, 4, 20)
    assert sent[:11] == _scheduled(4) and not any(sent[11:])
    assert trial.read() == {"decided": True, "compressed": False, "compressed_ms": pytest.approx(300.0),
                            "dense_ms": pytest.approx(250.0), "compressed_quartiles_ms": pytest.approx((300.0, 300.0)),
                            "dense_quartiles_ms": pytest.approx((250.0, 250.0)),
                            "verdict": verdict([[0.3, 0.25], [0.3, 0.25], [0.3, 0.25]])}
    assert "not more than the 5 % margin" in trial.read()["verdict"]


@pytest.mark.parametrize("ratio, kept", [(0.94, True), (0.96, False), (1.0, False)])
def test_plan_kept_only_when_shorter_by_the_margin(ratio, kept):
    sent, trial = _run(lambda compressed, _: 0.2 * ratio if compressed else 0.2, 2, 8)
    assert trial.read()["compressed"] is kept and sent[-1] is kept
    assert ("margin" in trial.read()["verdict"]) and (("kept" in trial.read()["verdict"]) is kept)


@pytest.mark.parametrize("steps", [4, 7, 10])
def test_the_choice_is_numpys_medians_beyond_the_margin_and_quartiles_apart(rng, steps):
    """Noisy arms of chosen timings: the figures and the choice are NumPy's (medians by more than the
    margin, the plan's upper quartile below dense's lower one), for gains within and beyond the noise."""
    schedule = trial_schedule(steps)
    for gain, noise in ((0.0, 0.01), (0.04, 0.001), (0.08, 0.001), (0.08, 0.3), (0.3, 0.05), (0.5, 0.2)):
        timed = np.stack([0.2 * (1.0 - gain) * (1.0 + noise * rng.standard_normal(steps)),
                          0.2 * (1.0 + noise * rng.standard_normal(steps))])

        def step_seconds(_, call):
            arm, column = schedule[call] if call < len(schedule) else (0, -1)
            return float(timed[arm, column]) if column >= 0 else 5.0

        _, trial, recorded = _run_timed(step_seconds, steps, len(schedule) + 1)
        np.testing.assert_array_equal(recorded, timed)
        _check_against_numpy(trial, timed)


def test_a_gain_beyond_the_margin_within_the_noise_is_dropped_and_the_verdict_says_why():
    # Medians 10 % apart, but each arm spread over +-20 %: the quartiles overlap.
    plan, dense = 0.18 * np.array([0.8, 0.9, 1.0, 1.1, 1.2]), 0.2 * np.array([0.8, 0.9, 1.0, 1.1, 1.2])
    schedule = trial_schedule(5)
    sent, trial, timed = _run_timed(lambda _, call: float((plan, dense)[schedule[call][0]][schedule[call][1]])
                                    if call < len(schedule) and schedule[call][1] >= 0 else 1.0, 5, len(schedule) + 1)
    assert not _check_against_numpy(trial, timed)
    assert "within the noise" in trial.read()["verdict"] and "198.0 ms is not below dense's lower quartile 180.0" \
        in trial.read()["verdict"]


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
    assert trial.read() == {"decided": False, "compressed": True, "compressed_ms": 0.0, "dense_ms": 0.0,
                            "compressed_quartiles_ms": (0.0, 0.0), "dense_quartiles_ms": (0.0, 0.0), "verdict": ""}
    assert sent == [True] * 3 + [False] * 4 + [True] * 2


def test_steps_must_be_positive():
    for steps in (0, -3):
        with pytest.raises(ValueError, match="steps >= 1"):
            PlanTrial(steps)
