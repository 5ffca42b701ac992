"""The figures and tables of benchmarks/never_slower.py, from its workers' records (no TensorFlow).

Steady step (`steady_summary`): per model, the arms' step times of the same interleaved rounds
(milliseconds, round i of one arm paired with round i of the other), each arm's median, the
median of the per-round ratios tfcomp / horovod and a bootstrap 95 % interval of that median
(`bootstrap_median_interval`, seeded); and the same ratio of a second plain Horovod arm to the
first (`STEADY_ARMS`' control): what the machine's noise alone gives the ratio. First step (`first_step_summary`): the first training step's
seconds of fresh jobs of each arm, their medians and the overhead tfcomp - horovod. Whole job
(`job_summary`): pairs of jobs, the per-pair ratios of fit's and of the whole job's wall time and
their medians. The `*_table` functions turn those into table rows for `benchmarks.tables`.
`plan_settled` says when the steady mode's warm-up may end.
"""

from __future__ import annotations

import random
import statistics

import numpy as np

__all__ = ["ARMS", "MODELS", "STEADY_ARMS", "bootstrap_median_interval", "describe_plan", "first_step_order", "first_step_summary",
           "first_step_table", "job_order", "job_summary", "job_table", "paired_ratios", "plan_settled",
           "round_order", "steady_summary", "steady_table", "trace_counts"]

ARMS = ("horovod", "tfcomp")  # plain hvd.DistributedOptimizer; the same with compression=tfcomp.DRAGONN()
STEADY_ARMS = ARMS + ("horovod_again",)  # the steady rounds add a second plain Horovod arm: the control
MODELS = ("many_small", "cnn", "vit")  # of benchmarks.network_worker.MODELS, the ones issue 44 names
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0


def round_order(round_index: int, arms=ARMS) -> list:
    """The order the arms run in round `round_index` (>= 0): `arms` shuffled by a generator seeded
    with the round, so every rank runs the same order without talking, and no arm always runs
    first."""
    if isinstance(round_index, bool) or not isinstance(round_index, int) or round_index < 0:
        raise ValueError(f"round_index: {round_index!r} is not an integer >= 0")
    order = list(arms)
    random.Random(round_index).shuffle(order)
    return order


def plan_settled(exchange, replan, previous_entry) -> bool:
    """Whether the tfcomp arm's plan is settled on this rank, read after a step and its `replan`
    (`tfcomp.keras.Replan`) call: the exchange's (`tfcomp.GradientExchange`) deferred calibration
    (if any) done, `replan`'s re-plan with the measured ready times done, the running plan's trial
    (if any) decided for the plan (a dropped plan is not settled until it is installed again
    without the trial), and the plan entry (`exchange.last_entry`) the one run before the last step
    (`previous_entry`): `Replan` settles a change one step later."""
    trial = None if exchange.trial is None else exchange.trial.read()
    return (not exchange.calibration_pending and replan.replanned is not None
            and (trial is None or (trial["decided"] and trial["compressed"]))
            and exchange.last_entry is previous_entry)


def first_step_order(jobs: int) -> list:
    """The arms of the first-step mode's 2 x `jobs` fresh jobs (jobs >= 1), in the order they run:
    tfcomp, horovod, tfcomp, horovod, ..."""
    _check_count("jobs", jobs)
    return ["tfcomp", "horovod"] * jobs


def job_order(pairs: int) -> list:
    """The whole-job mode's `pairs` (>= 1) pairs of jobs in the order they run, each pair a tuple of
    its two arms: tfcomp first in even pairs, horovod first in odd ones, so that a drift of the
    machine's speed over a pair favours neither arm across pairs."""
    _check_count("pairs", pairs)
    return [("tfcomp", "horovod") if i % 2 == 0 else ("horovod", "tfcomp") for i in range(pairs)]


def _check_count(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: {value!r} is not an integer >= 1")


def _positive_times(name: str, values) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name}: expected a non-empty list of times, got shape {array.shape}")
    if not np.all(np.isfinite(array)) or np.any(array <= 0.0):
        raise ValueError(f"{name}: every time must be finite and > 0, got {array.tolist()}")
    return array


def paired_ratios(numerators, denominators) -> np.ndarray:
    """float64 [n]: numerators[i] / denominators[i], the two float sequences of n (>= 1) finite times
    > 0 paired by position (the same round, or the same pair of jobs)."""
    top, bottom = _positive_times("numerators", numerators), _positive_times("denominators", denominators)
    if top.shape != bottom.shape:
        raise ValueError(f"numerators and denominators must pair up: {top.size} against {bottom.size} values")
    return top / bottom


def bootstrap_median_interval(values, confidence: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES,
                              seed: int = BOOTSTRAP_SEED) -> tuple:
    """(low, high): the percentile bootstrap interval of the median of `values` (a non-empty float
    sequence) at `confidence` in (0, 1): `resamples` (>= 1) samples of len(values) drawn with
    replacement by a generator seeded with `seed`, the median of each, and their
    (1 - confidence) / 2 and (1 + confidence) / 2 quantiles."""
    data = np.asarray(values, dtype=np.float64)
    if data.ndim != 1 or data.size == 0 or not np.all(np.isfinite(data)):
        raise ValueError(f"values: expected a non-empty list of finite numbers, got {np.asarray(values).tolist()}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence: {confidence!r} is not in (0, 1)")
    _check_count("resamples", resamples)
    rng = np.random.default_rng(seed)
    medians = np.median(data[rng.integers(0, data.size, size=(resamples, data.size))], axis=1)
    low, high = np.quantile(medians, [(1.0 - confidence) / 2.0, (1.0 + confidence) / 2.0])
    return float(low), float(high)


def steady_summary(horovod_ms, tfcomp_ms, control_ms=None) -> dict:
    """The steady-step figures of one model from its interleaved rounds: `horovod_ms`, `tfcomp_ms`
    and `control_ms` (float sequences of the same length, one step time in ms per round; the
    control, a second plain Horovod arm, or None) -> {"rounds", "horovod_ms", "tfcomp_ms" (each
    arm's median), "ratio" (the median of the per-round ratios tfcomp / horovod), "ratio_low",
    "ratio_high" (its bootstrap 95 % interval), and with a control "control_ratio",
    "control_low", "control_high" (the same of control / horovod)}."""
    ratios = paired_ratios(tfcomp_ms, horovod_ms)
    low, high = bootstrap_median_interval(ratios)
    summary = {"rounds": int(ratios.size), "horovod_ms": float(np.median(horovod_ms)),
               "tfcomp_ms": float(np.median(tfcomp_ms)), "ratio": float(np.median(ratios)),
               "ratio_low": low, "ratio_high": high}
    if control_ms is not None:
        control = paired_ratios(control_ms, horovod_ms)
        control_low, control_high = bootstrap_median_interval(control)
        summary.update(control_ratio=float(np.median(control)), control_low=control_low, control_high=control_high)
    return summary


def describe_plan(strategies, trial=None) -> str:
    """The plan a job ran, in words: "all dense (N buckets)" or "M of N buckets compressed (counts
    per strategy)", from its buckets' strategy names (`strategies`, a list of str; "dense" sends
    dense) and its trial (`tfcomp.trial.PlanTrial.read()`, or None where it had none). A trial that
    dropped the plan means every bucket is sent dense."""
    strategies = [str(s) for s in strategies]
    compressed = [s for s in strategies if s != "dense"]
    if trial is not None and trial["decided"] and not trial["compressed"]:
        return (f"all dense ({len(strategies)} buckets): the trial dropped {len(compressed)} compressed "
                f"({trial['compressed_ms']:.1f} ms with them, {trial['dense_ms']:.1f} ms dense)")
    if not compressed:
        return f"all dense ({len(strategies)} buckets)"
    counts = ", ".join(f"{compressed.count(s)} {s}" for s in sorted(set(compressed)))
    text = f"{len(compressed)} of {len(strategies)} buckets compressed ({counts})"
    if trial is None:
        return text
    if not trial["decided"]:
        return text + "; trial undecided"
    return text + f"; trial kept it ({trial['compressed_ms']:.1f} ms against {trial['dense_ms']:.1f} ms dense)"


def first_step_summary(jobs: list) -> dict:
    """From the first-step mode's jobs of one model (a list of {"arm": "horovod" or "tfcomp",
    "first_step_s": float}, at least one of each arm): {"horovod_s", "tfcomp_s" (each arm's median
    first step, seconds), "overhead_s" (tfcomp_s - horovod_s), "horovod_jobs_s", "tfcomp_jobs_s"
    (each job's first step, in the order run)}."""
    by_arm = {arm: [float(j["first_step_s"]) for j in jobs if j["arm"] == arm] for arm in ARMS}
    unknown = sorted({j["arm"] for j in jobs} - set(ARMS))
    if unknown:
        raise ValueError(f"jobs: unknown arm {unknown[0]!r} (expected one of {', '.join(ARMS)})")
    for arm, values in by_arm.items():
        _positive_times(f"jobs ({arm})", values)
    medians = {arm: statistics.median(values) for arm, values in by_arm.items()}
    return {"horovod_s": medians["horovod"], "tfcomp_s": medians["tfcomp"],
            "overhead_s": medians["tfcomp"] - medians["horovod"],
            "horovod_jobs_s": by_arm["horovod"], "tfcomp_jobs_s": by_arm["tfcomp"]}


def trace_counts(jobs: list) -> str:
    """How many times Keras traced the training function in the jobs of each arm (a list of {"arm",
    "traces": int}), as "horovod / tfcomp", each arm's distinct counts joined by "or": "2 / 1"."""
    def counts(arm):
        return " or ".join(str(c) for c in sorted({int(j["traces"]) for j in jobs if j["arm"] == arm})) or "-"

    return f"{counts('horovod')} / {counts('tfcomp')}"


def job_summary(pairs: list) -> dict:
    """From the whole-job mode's pairs of one model (a list of {"tfcomp": record, "horovod": record},
    each record {"fit_s": fit's wall time on rank 0, "job_s": the whole horovodrun job's}, seconds):
    {"fit_ratios", "job_ratios" (per pair, tfcomp / horovod), "fit_ratio", "job_ratio" (their
    medians), "horovod_fit_s", "tfcomp_fit_s", "horovod_job_s", "tfcomp_job_s" (each arm's median)}."""
    if not pairs:
        raise ValueError("pairs: no pair of jobs to summarise")
    summary = {}
    for key in ("fit", "job"):
        tfcomp = [p["tfcomp"][f"{key}_s"] for p in pairs]
        horovod = [p["horovod"][f"{key}_s"] for p in pairs]
        ratios = paired_ratios(tfcomp, horovod)
        summary.update({f"{key}_ratios": ratios.tolist(), f"{key}_ratio": float(np.median(ratios)),
                        f"horovod_{key}_s": statistics.median(horovod), f"tfcomp_{key}_s": statistics.median(tfcomp)})
    return summary


def _listed(values, digits: int) -> str:
    return ", ".join(f"{v:.{digits}f}" for v in values)


def steady_table() -> list:
    """The columns (heading, width, cell) of the steady table; a row is a `steady_summary` dict with
    "hosts", "rate", "model", "plan", "warmup_steps", "capped" (bool) and "plan_changes" (re-plans
    during the rounds) added."""
    return [("hosts", 5, lambda r: str(r["hosts"])), ("link", 7, lambda r: r["rate"]),
            ("model", 10, lambda r: r["model"]), ("rounds", 6, lambda r: str(r["rounds"])),
            ("horovod ms", 10, lambda r: f"{r['horovod_ms']:.1f}"), ("tfcomp ms", 9, lambda r: f"{r['tfcomp_ms']:.1f}"),
            ("tfcomp / horovod", 16, lambda r: f"{r['ratio']:.3f}"),
            ("95 % interval", 13, lambda r: f"{r['ratio_low']:.3f} to {r['ratio_high']:.3f}"),
            ("Horovod / Horovod (95 %)", 24, lambda r: f"{r['control_ratio']:.3f} ({r['control_low']:.3f} to "
             f"{r['control_high']:.3f})" if "control_ratio" in r else "-"),
            ("warm-up steps", 13, lambda r: f"{r['warmup_steps']}{' (capped)' if r['capped'] else ''}"),
            ("re-plans in rounds", 18, lambda r: str(r["plan_changes"])),
            ("plan", 30, lambda r: r["plan"])]


def first_step_table() -> list:
    """The columns of the first-step table; a row is a `first_step_summary` dict with "hosts",
    "rate", "model", "traces" (`trace_counts`) and "plan" (the tfcomp jobs' first plan) added."""
    return [("hosts", 5, lambda r: str(r["hosts"])), ("link", 7, lambda r: r["rate"]),
            ("model", 10, lambda r: r["model"]), ("jobs", 4, lambda r: str(len(r["tfcomp_jobs_s"]))),
            ("horovod s", 9, lambda r: f"{r['horovod_s']:.2f}"), ("tfcomp s", 8, lambda r: f"{r['tfcomp_s']:.2f}"),
            ("overhead s", 10, lambda r: f"{r['overhead_s']:+.2f}"),
            ("horovod jobs s", 14, lambda r: _listed(r["horovod_jobs_s"], 2)),
            ("tfcomp jobs s", 13, lambda r: _listed(r["tfcomp_jobs_s"], 2)),
            ("traces horovod / tfcomp", 23, lambda r: r["traces"]),
            ("plan", 30, lambda r: r["plan"])]


def job_table() -> list:
    """The columns of the whole-job table; a row is a `job_summary` dict with "hosts", "rate",
    "model", "steps" and "plan" (the last tfcomp job's plan at its end) added."""
    return [("hosts", 5, lambda r: str(r["hosts"])), ("link", 7, lambda r: r["rate"]),
            ("model", 10, lambda r: r["model"]), ("steps", 5, lambda r: str(r["steps"])),
            ("pairs", 5, lambda r: str(len(r["fit_ratios"]))),
            ("horovod fit s", 13, lambda r: f"{r['horovod_fit_s']:.1f}"),
            ("tfcomp fit s", 12, lambda r: f"{r['tfcomp_fit_s']:.1f}"),
            ("fit ratio", 9, lambda r: f"{r['fit_ratio']:.3f}"),
            ("per pair", 24, lambda r: _listed(r["fit_ratios"], 3)),
            ("job ratio", 9, lambda r: f"{r['job_ratio']:.3f}"),
            ("per pair (job)", 24, lambda r: _listed(r["job_ratios"], 3)),
            ("plan", 30, lambda r: r["plan"])]
