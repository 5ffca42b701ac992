"""benchmarks/never_slower.py's figures from made-up timings (its jobs need root and an emulated cluster)."""

import types

import numpy as np
import pytest

from benchmarks import never_slower_report as report
from benchmarks.tables import markdown_table, text_table


def test_round_order_is_a_permutation_the_same_for_every_caller_and_not_fixed():
    orders = [report.round_order(i) for i in range(40)]
    assert all(sorted(order) == sorted(report.ARMS) for order in orders)
    assert orders == [report.round_order(i) for i in range(40)]  # what every rank computes alike
    assert {tuple(order) for order in orders} == {("horovod", "tfcomp"), ("tfcomp", "horovod")}
    with pytest.raises(ValueError, match="round_index"):
        report.round_order(-1)


def test_job_orders():
    assert report.first_step_order(3) == ["tfcomp", "horovod"] * 3
    assert report.job_order(3) == [("tfcomp", "horovod"), ("horovod", "tfcomp"), ("tfcomp", "horovod")]
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="jobs"):
            report.first_step_order(bad)
        with pytest.raises(ValueError, match="pairs"):
            report.job_order(bad)


def test_paired_ratios_divide_by_position_and_refuse_what_does_not_pair(rng):
    top, bottom = rng.uniform(1.0, 50.0, 17), rng.uniform(1.0, 50.0, 17)
    np.testing.assert_allclose(report.paired_ratios(top.tolist(), bottom.tolist()), top / bottom)
    with pytest.raises(ValueError, match="pair up: 17 against 16"):
        report.paired_ratios(top, bottom[:16])
    with pytest.raises(ValueError, match="denominators: every time must be finite and > 0"):
        report.paired_ratios(top, np.where(np.arange(17) == 3, 0.0, bottom))
    with pytest.raises(ValueError, match="numerators: expected a non-empty list"):
        report.paired_ratios([], [])


def test_bootstrap_interval_of_three_values_is_their_range():
    # A resample's median of {1, 2, 3} is 1 or 3 with probability 7/27 each: both tails hold more than 2.5 %.
    assert report.bootstrap_median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)
    value = float(np.pi)
    assert report.bootstrap_median_interval([value] * 9) == (value, value)


def test_bootstrap_interval_matches_the_median_s_sampling_spread(rng):
    n, sigma = 4001, rng.uniform(0.01, 0.1)
    values = 1.0 + sigma * rng.standard_normal(n)
    low, high = report.bootstrap_median_interval(values)
    assert low < np.median(values) < high
    # The median of n normal samples spreads with standard error sqrt(pi / 2) sigma / sqrt(n).
    half_width = 1.959964 * np.sqrt(np.pi / 2) * sigma / np.sqrt(n)
    assert high - low == pytest.approx(2 * half_width, rel=0.25)
    assert report.bootstrap_median_interval(values) == (low, high)  # seeded
    assert report.bootstrap_median_interval(values, seed=1) != (low, high)
    narrow = report.bootstrap_median_interval(values, confidence=0.5)
    assert low < narrow[0] < narrow[1] < high


def test_bootstrap_interval_refuses_bad_arguments():
    with pytest.raises(ValueError, match="values"):
        report.bootstrap_median_interval([1.0, float("nan")])
    with pytest.raises(ValueError, match="confidence"):
        report.bootstrap_median_interval([1.0, 2.0], confidence=1.0)
    with pytest.raises(ValueError, match="resamples"):
        report.bootstrap_median_interval([1.0, 2.0], resamples=0)


def test_steady_summary_medians_and_paired_ratio(rng):
    rounds = 101
    horovod = rng.uniform(20.0, 40.0, rounds)
    tfcomp = horovod * rng.uniform(0.98, 1.04, rounds)
    summary = report.steady_summary(horovod.tolist(), tfcomp.tolist())
    assert summary["rounds"] == rounds
    assert summary["horovod_ms"] == pytest.approx(np.median(horovod))
    assert summary["tfcomp_ms"] == pytest.approx(np.median(tfcomp))
    assert summary["ratio"] == pytest.approx(np.median(tfcomp / horovod))
    assert (summary["ratio_low"], summary["ratio_high"]) == report.bootstrap_median_interval(tfcomp / horovod)
    assert summary["ratio_low"] <= summary["ratio"] <= summary["ratio_high"]
    assert "control_ratio" not in summary


def test_steady_summary_with_a_control_arm_and_its_column(rng):
    rounds = 60
    horovod = rng.uniform(20.0, 40.0, rounds)
    again = horovod * rng.uniform(0.9, 1.1, rounds)
    summary = report.steady_summary(horovod.tolist(), (horovod * 1.01).tolist(), again.tolist())
    assert summary["control_ratio"] == pytest.approx(np.median(again / horovod))
    assert (summary["control_low"], summary["control_high"]) == report.bootstrap_median_interval(again / horovod)
    assert summary["ratio"] == pytest.approx(1.01)
    row = {"hosts": 4, "rate": "none", "model": "cnn", "plan": "all dense (1 buckets)", "warmup_steps": 41,
           "capped": False, "plan_changes": 0, **summary}
    text = markdown_table(report.steady_table(), [row])
    assert f"{summary['control_ratio']:.3f} ({summary['control_low']:.3f} to {summary['control_high']:.3f})" in text
    assert report.STEADY_ARMS == ("horovod", "tfcomp", "horovod_again")
    assert sorted(report.round_order(3, report.STEADY_ARMS)) == sorted(report.STEADY_ARMS)


def test_describe_plan():
    assert report.describe_plan(["dense"] * 5) == "all dense (5 buckets)"
    kept = {"decided": True, "compressed": True, "compressed_ms": 40.0, "dense_ms": 61.25}
    assert report.describe_plan(["dense", "allgather", "artopk", "allgather"], kept) == (
        "3 of 4 buckets compressed (2 allgather, 1 artopk); trial kept it (40.0 ms against 61.2 ms dense)")
    dropped = dict(kept, compressed=False, compressed_ms=70.0)
    assert report.describe_plan(["dense", "allgather"], dropped) == (
        "all dense (2 buckets): the trial dropped 1 compressed (70.0 ms with them, 61.2 ms dense)")
    undecided = {"decided": False, "compressed": True, "compressed_ms": 0.0, "dense_ms": 0.0}
    assert report.describe_plan(["allgather"], undecided) == "1 of 1 buckets compressed (1 allgather); trial undecided"


def test_first_step_summary(rng):
    seconds = rng.uniform(2.0, 9.0, 10)
    arms = report.first_step_order(5)
    summary = report.first_step_summary([{"arm": a, "first_step_s": s} for a, s in zip(arms, seconds)])
    assert summary["tfcomp_jobs_s"] == seconds[0::2].tolist()
    assert summary["horovod_jobs_s"] == seconds[1::2].tolist()
    assert summary["overhead_s"] == pytest.approx(np.median(seconds[0::2]) - np.median(seconds[1::2]))
    with pytest.raises(ValueError, match="jobs \\(horovod\\)"):
        report.first_step_summary([{"arm": "tfcomp", "first_step_s": 1.0}])
    with pytest.raises(ValueError, match="unknown arm 'dense'"):
        report.first_step_summary([{"arm": "dense", "first_step_s": 1.0}])


def test_trace_counts():
    jobs = [{"arm": "tfcomp", "traces": 1}, {"arm": "horovod", "traces": 2}, {"arm": "tfcomp", "traces": 3},
            {"arm": "horovod", "traces": 2}]
    assert report.trace_counts(jobs) == "2 / 1 or 3"
    assert report.trace_counts(jobs[:1]) == "- / 1"


def test_job_summary(rng):
    fit = rng.uniform(50.0, 90.0, (5, 2))
    job = fit + rng.uniform(5.0, 10.0, (5, 2))
    pairs = [{"tfcomp": {"fit_s": f[0], "job_s": j[0]}, "horovod": {"fit_s": f[1], "job_s": j[1]}}
             for f, j in zip(fit, job)]
    summary = report.job_summary(pairs)
    np.testing.assert_allclose(summary["fit_ratios"], fit[:, 0] / fit[:, 1])
    assert summary["fit_ratio"] == pytest.approx(np.median(fit[:, 0] / fit[:, 1]))
    assert summary["job_ratio"] == pytest.approx(np.median(job[:, 0] / job[:, 1]))
    assert summary["horovod_fit_s"] == pytest.approx(np.median(fit[:, 1]))
    with pytest.raises(ValueError, match="pairs"):
        report.job_summary([])


def test_tables_show_each_mode_s_figures(rng):
    steady = {"hosts": 2, "rate": "none", "model": "cnn", "plan": "all dense (22 buckets)", "warmup_steps": 400,
              "capped": True, "plan_changes": 0,
              **report.steady_summary(rng.uniform(20, 30, 9).tolist(), rng.uniform(20, 30, 9).tolist())}
    text = markdown_table(report.steady_table(), [steady])
    assert f"| {steady['ratio']:.3f} | {steady['ratio_low']:.3f} to {steady['ratio_high']:.3f} |" in text
    assert "| 400 (capped) |" in text and "all dense (22 buckets)" in text
    first = {"hosts": 4, "rate": "none", "model": "vit", "plan": "all dense (3 buckets)", "traces": "2 / 1",
             **report.first_step_summary([{"arm": a, "first_step_s": s} for a, s in
                                          zip(report.first_step_order(2), [5.0, 4.5, 6.0, 4.0])])}
    assert "| 5.50 | +1.25 | 4.50, 4.00 | 5.00, 6.00 | 2 / 1 |" in markdown_table(report.first_step_table(), [first])
    pair = {"tfcomp": {"fit_s": 101.0, "job_s": 120.0}, "horovod": {"fit_s": 100.0, "job_s": 120.0}}
    whole = {"hosts": 4, "rate": "none", "model": "cnn", "steps": 300, "plan": "all dense (22 buckets)",
             **report.job_summary([pair])}
    assert "| 1.010 | 1.010 | 1.000 | 1.000 |" in markdown_table(report.job_table(), [whole])
    assert len(text_table(report.job_table(), [whole]).splitlines()) == 2


class _Trial:
    def __init__(self, decided, compressed):
        self.verdict = {"decided": decided, "compressed": compressed, "compressed_ms": 1.0, "dense_ms": 2.0}

    def read(self):
        return self.verdict


def test_plan_settled_needs_calibration_replan_trial_and_a_steady_entry():
    entry = object()

    def settled(pending=False, replanned=False, trial=None, previous=entry):
        exchange = types.SimpleNamespace(calibration_pending=pending, trial=trial, last_entry=entry)
        return report.plan_settled(exchange, types.SimpleNamespace(replanned=replanned), previous)

    assert settled()
    assert settled(replanned=True, trial=_Trial(decided=True, compressed=True))
    assert not settled(pending=True)
    assert not settled(replanned=None)  # Replan's re-plan with the measured ready times still to come
    assert not settled(trial=_Trial(decided=False, compressed=True))
    assert not settled(trial=_Trial(decided=True, compressed=False))  # dropped: Replan installs it again
    assert not settled(previous=object())  # a new plan: Replan may settle it after the next step
    assert not settled(previous=None)
