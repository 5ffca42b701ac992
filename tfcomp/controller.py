"""Which plan an exchange runs in training: its first plan, calibration between steps, the trial's verdict, re-plans.

A `tfcomp.GradientExchange` runs the plan it is given for each list of gradients; a `PlanController`,
which the exchange is handed (or makes), decides that plan with a `tfcomp.planner.Planner`:

  * the first plan of a list (`first_plan`): a fixed plan given to the exchange; for a compressor
    that compresses, with planning="auto", no forced strategy and several workers, every gradient
    sent dense (`tfcomp.planning.dense_plan`: Horovod's own step) and nothing measured, calibration
    left pending; otherwise (a forced strategy, planning="off", FP16 or NoCompression) the
    planner's plan, calibrated at once where it needs figures. A plan installed that compresses is
    tried in training (`trial_steps`, `tfcomp.trial`);
  * calibration between training steps, run only by a driver: `calibrate_step()` after each step
    (`tfcomp.keras.Replan` calls it in `model.fit`; a custom loop calls `exchange.calibrate_step()`),
    or `calibrate()`, all of it at once, where a job or a test wants calibrated figures now. The
    driver's calls first pass a gate (`calibration_gate`): after `GATE_STEPS` dense steps, the part
    of the exchange the backward pass does not hide is the most any compression could save; where
    that is under the margin, nothing is ever calibrated and every gradient stays dense for the job.
    Otherwise calibration runs a few pieces at a time within a budget of the steps' time;
  * re-plans with what training measured: the gradients' ready times (`replan`), the exchange's
    measured end against its prediction (`check_prediction`, `measured_plan`), and an all-dense plan
    installed again without the trial's branch or the flush of residuals it has sent (`settle`);
  * the trial's verdict over the job (`trial_dropped_compression`, `remember_trial_verdict`): once a
    trial found compressing slower than dense, later re-plans keep every bucket dense.

Rank 0 shows its decisions with `tfcomp.report.show` (where a plain script sees them): the first
plan, the gate's verdict, each plan installed (its table; a change costs one retrace of the training
step), and, once a job, a measured exchange more than 2x from its prediction.

The controller talks to its exchange through three members: `last_entry` (the plan run for the
last list of gradients: `plan`, `tensors`, `signature`, `runtime`, or None), `install(plan,
residuals_sent)` (makes a plan the one run for that list) and `reprice(cluster, ready)` (keeps its
plan with new figures); to the other ranks through its collectives (`tfcomp.collectives`). Every
method that measures or plans runs eagerly, on every rank of the process set at the same step.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, replace

import numpy as np
import tensorflow as tf
from absl import logging

from tfcomp import planning, report

__all__ = ["BUDGET_STEPS", "CALIBRATION_SHARE", "DEPARTURE_THRESHOLD", "GATE_STEPS", "GateVerdict", "MAX_SHARE",
           "REPLAN_MIN_GAIN", "PlanController", "calibration_gate", "step_figures"]

REPLAN_MIN_GAIN = 0.05  # a new plan replaces the running one only where predicted to save this fraction of the
# running exchange's part after the backward pass: installing it costs a new trace of the training step and a new
# trial (about a minute for the ViT on 4 workers sharing 2 cores)
DEPARTURE_THRESHOLD = 0.25  # check_prediction re-plans where the measured exchange departs by more
GATE_STEPS = 10  # dense steps the gate waits for: timed by the driver, and recorded by the exchange timeline
BUDGET_STEPS = 50  # the window of steps whose time calibration may take a share of
CALIBRATION_SHARE = 0.02  # that share, at least (the bound); up to half the potential gain where larger
MAX_SHARE = 0.5  # the share, at most
VERDICT_TOLERANCE = 1.25  # an earlier job's verdict that compression does not pay holds while the exchange's exposed
# share of the step is at most this many times what it was then (a network that slowed down more calibrates again)
_SHOWN_DEPARTURE = 2.0  # a measured exchange this many times above (or below) its prediction is shown, once a job

# Where calibration stands: nothing to calibrate (fixed plan, forced strategy, planning off, one worker, or
# calibrated at the start), waiting for the gate, pieces running, ruled out by the gate, done.
_NONE, _WAITING, _RUNNING, _GATED, _DONE = "none", "waiting", "running", "gated", "done"


def step_figures(step_seconds) -> tuple:
    """(median, relative spread) of `step_seconds` (floats, >= 1 of them): the median, and the
    interquartile range over the median (NumPy's default percentiles; 0 where the median is 0)."""
    times = np.asarray(step_seconds, dtype=np.float64)
    if times.size == 0:
        raise ValueError("step_seconds must hold at least one step time")
    median = float(np.median(times))
    lower, upper = np.percentile(times, [25, 75])
    return median, float(upper - lower) / median if median > 0.0 else 0.0


@dataclass(frozen=True)
class GateVerdict:
    """The gate's figures and verdict: `exposed_seconds` (E: the exchange's end after the last
    gradient ready, the latest over the ranks), `step_seconds` (the median step, the largest over
    the ranks), `spread` (the steps' interquartile range over their median, the largest), `margin`
    (what compression must gain: max(COMPRESSION_MARGIN, 2 x spread)), `calibrates` (whether E is
    at least margin x step, and no earlier job's verdict holds), `share` (the share of the steps'
    time calibration may take: 0 where it does not calibrate) and `earlier_gain` (the exposed share
    of the step at which an earlier job of this model on these hosts found compressing not paying,
    where that verdict holds: `VERDICT_TOLERANCE`; else None)."""

    exposed_seconds: float
    step_seconds: float
    spread: float
    margin: float
    calibrates: bool
    share: float
    earlier_gain: float | None = None

    @property
    def potential_gain(self) -> float:
        """E / step: the most any compression could shorten a step by, as a fraction of it."""
        return self.exposed_seconds / self.step_seconds if self.step_seconds > 0.0 else 0.0

    def describe(self) -> str:
        """The verdict in words (what rank 0 shows)."""
        measured = (f"tfcomp: the exchange ends {1e3 * self.exposed_seconds:.1f} ms after the backward pass, "
                    f"{100.0 * self.potential_gain:.1f} % of a {1e3 * self.step_seconds:.1f} ms step")
        if self.earlier_gain is not None:
            return (f"{measured}: an earlier job of this model on these hosts found compressing not paying at "
                    f"{100.0 * self.earlier_gain:.1f} %; every gradient is sent dense, nothing calibrated (the "
                    "calibration cache keeps that verdict: TFCOMP_CALIBRATION_CACHE=none to try again)")
        if not self.calibrates:
            return (f"{measured}: compression cannot gain the {100.0 * self.margin:.0f} % margin here; every gradient "
                    "is sent dense")
        return (f"{measured}: compression could gain more than the {100.0 * self.margin:.0f} % margin; calibrating "
                f"between steps, with at most {100.0 * self.share:.1f} % of the time of the last {BUDGET_STEPS} steps")


def calibration_gate(exposed_seconds: float, step_seconds: float, spread: float) -> GateVerdict:
    """The gate before any calibration: where the exchange's exposed part E (`exposed_seconds`, the
    most any compression could save a step) is under margin x `step_seconds`, margin =
    max(`tfcomp.planning.COMPRESSION_MARGIN`, 2 x `spread`) (a noisier step needs a larger gain to
    show), compression cannot pay: nothing is calibrated and every gradient stays dense. Otherwise
    calibration may take a share of the steps' time: `CALIBRATION_SHARE` (2 %), or half the
    potential gain G = E / step where that is larger (calibration then pays for itself twice over
    where compression gains G), at most `MAX_SHARE`. Arguments: floats, seconds >= 0 and a fraction >= 0."""
    margin = max(planning.COMPRESSION_MARGIN, 2.0 * spread)
    calibrates = bool(step_seconds > 0.0 and exposed_seconds >= margin * step_seconds)
    share = min(max(CALIBRATION_SHARE, 0.5 * exposed_seconds / step_seconds), MAX_SHARE) if calibrates else 0.0
    return GateVerdict(float(exposed_seconds), float(step_seconds), float(spread), margin, calibrates, share)


class PlanController:
    """Decides the plans of one exchange (see the module docstring).

    Args:
      planner: the `tfcomp.planner.Planner` of the exchange's compressor and process set.
      collectives: the exchange's collectives (`tfcomp.collectives`: `rank`, `size`, `allgather`,
        `broadcast`).
      fixed_plan: a `tfcomp.planning.Plan` to run for every list of gradients, never tried in
        training nor made again (None: the planner's plans).
      clock: seconds of the driver's wall clock (default `time.perf_counter`; tests give their own).
    """

    def __init__(self, planner, collectives, fixed_plan=None, clock=time.perf_counter):
        self.planner = planner
        self.collectives = collectives
        self.fixed_plan = fixed_plan
        self.clock = clock
        self.gate = None  # the GateVerdict, once the gate has decided
        self._exchange = None
        self._recalibrated = False  # whether check_prediction has calibrated again (at most once a job)
        self._compression_dropped = False  # whether a replaced plan's trial dropped it (remember_trial_verdict)
        self._calibration = _NONE
        self._step_seconds = []  # the driver's step times while waiting for the gate (this rank's clock)
        self._last_call_end = None  # when the driver's last calibrate_step call ended
        self._calibrating = collections.deque(maxlen=BUDGET_STEPS)  # calibration seconds of each call, agreed
        self._calibrating_calls = 0  # calibrate_step calls since the gate let calibration run
        self._departure_shown = False

    def bind(self, exchange) -> None:
        """Takes `exchange` as the one whose plans this controller decides (the exchange calls it
        when it is handed the controller). ValueError for a second exchange."""
        if self._exchange is not None and self._exchange is not exchange:
            raise ValueError("a PlanController decides the plans of one exchange: make one per GradientExchange")
        self._exchange = exchange

    @property
    def compressor(self):
        """The planner's `tfcomp.Compressor`."""
        return self.planner.compressor

    # -- the first plan ----------------------------------------------------------------------------

    @property
    def trial_steps(self) -> int:
        """Timed steps per arm of the trial of a plan that compresses installed now (0: not
        tried: a fixed plan, or one worker)."""
        return self.compressor.tried_steps if self.fixed_plan is None and self.collectives.size > 1 else 0

    def _calibrates_between_steps(self, tensors) -> bool:
        """Whether the first plan of `tensors` is sent dense while calibration waits for a driver:
        a compressor that compresses, planning="auto", no forced strategy, several workers,
        gradients to plan and no figures yet."""
        compressor = self.compressor
        return (compressor.collective.compresses and compressor.planning == "auto" and compressor.strategy is None
                and self.collectives.size > 1 and bool(tensors) and self.planner.cluster is None)

    def first_plan(self, tensors, signature) -> planning.Plan:
        """The plan of a list of gradients the exchange sees for the first time: the fixed plan;
        every gradient dense where calibration runs between steps (`_calibrates_between_steps`,
        or the gate ruled it out; nothing measured, calibration pending until a driver runs it);
        else the planner's for `tensors` = [(position, name, elements)] in backprop order and their
        `signature` (`tfcomp.planner.Planner.plan`, calibrated at once where it needs figures).
        Rank 0 shows it. Eagerly, on every rank at once."""
        if self.fixed_plan is not None:
            return self.fixed_plan
        rank = self.collectives.rank
        if self._calibration == _GATED or self._calibrates_between_steps(tensors):
            with tf.init_scope():
                plan = self.planner.dense_plan(tensors, signature)
            if self._calibration == _NONE:
                self._calibration = _WAITING
                report.show("tfcomp: every gradient is sent dense, as Horovod sends it, until calibrated: "
                            "tfcomp.keras.Replan() in model.fit calibrates between steps where compression could "
                            "pay (in a custom loop, call exchange.calibrate_step() after each step)", rank)
            return plan
        with tf.init_scope():
            plan = self.planner.plan(tensors, signature)
        if self.collectives.size > 1 and self.compressor.planning == "auto" and tensors:
            report.show(f"tfcomp: calibrated in {self.calibration_seconds:.1f} s"
                        + ("; the gradients' ready times from an earlier job" if self.ready_times_cached else "")
                        + f"; the plan:\n{plan.table()}", rank)
        return plan

    # -- calibration between steps -----------------------------------------------------------------

    @property
    def calibration_seconds(self) -> float:
        """Seconds calibration took in this job (at once, between steps, and any `check_prediction`
        calibrated again): the network probes alone where the compression costs came from the
        cache; 0 where there was none (one worker, planning off, the gate ruled it out)."""
        return self.planner.calibration_seconds

    @property
    def ready_times_cached(self) -> bool:
        """Whether the first plan took the gradients' ready times from an earlier job of the same
        model on the same hosts (`tfcomp.calibration.cached_ready_times`) rather than assuming all
        of them ready after the backward pass."""
        return self.planner.ready_cached

    @property
    def calibration_pending(self) -> bool:
        """Whether the exchange waits for calibration between steps: the gate still to decide, or
        its pieces to run (False once done, once the gate ruled it out, and where there is none)."""
        return self._calibration in (_WAITING, _RUNNING)

    def calibrate_step(self) -> bool:
        """The driver's call after each training step, eagerly, on every rank at the same step
        (`tfcomp.keras.Replan` calls it in `model.fit`; a custom loop after each step). Returns
        whether the plan changed (then trace the training step again: Keras
        `model.make_train_function(force=True)`, a custom loop a new `tf.function`). Nothing (False)
        where no calibration is pending.

        While the first, all-dense plan runs it times the steps (the wall clock between its calls:
        the step, less the time the call itself took) and, once `GATE_STEPS` of them are timed and
        the exchange timeline holds as many steps, runs the gate (`calibration_gate`, one
        allgather: the exchange's exposed part the latest over the ranks, the median step and its
        spread the largest, so that every rank decides alike). Where the gate rules compression out,
        every gradient stays dense for the job and nothing is ever calibrated. Otherwise each call
        runs pieces of the calibration only while the calibration time of the last `BUDGET_STEPS`
        calls is below the gate's share of those steps' time (the gate's median step each; rank 0's
        clock decides for every rank, and a piece once started runs to its end, so a window may
        hold one piece more than its share); once it is done the exchange is planned with its
        figures and the ready times measured meanwhile (the latest over the ranks, cached for later
        jobs as `replan` caches them), and that plan is installed where it compresses (and tried
        in training)."""
        started = self.clock()
        entry = self._last_entry()
        if entry is None or not self.calibration_pending:
            return False
        if self._last_call_end is not None and self._calibration == _WAITING:
            self._step_seconds.append(started - self._last_call_end)
        try:
            if self._calibration == _WAITING:
                self._run_gate(entry)
                return False
            return self._calibrate_within_budget(entry)
        finally:
            self._last_call_end = self.clock()

    def calibrate(self) -> bool:
        """Runs what calibration is pending all at once, now, without the gate or the budget (an
        explicit choice: a job, benchmark or test that wants calibrated figures from its first
        steps; it costs 7 to 30 s on 2 to 4 workers of this machine), then plans and installs as
        `calibrate_step` does when calibration finishes. Call it eagerly, on every rank, after the
        exchange's first call. Returns whether the plan changed (trace the step again); False where
        nothing was pending (calibrated already, ruled out by the gate, or nothing to calibrate)."""
        entry = self._last_entry()
        if entry is None:
            raise RuntimeError("tfcomp: calibrate() plans the gradients of the exchange's first call; call it after "
                               "that call")
        if not self.calibration_pending:
            return False
        if self._calibration == _WAITING:
            self.planner.start_calibration(entry.tensors)
            self._calibration = _RUNNING
        with tf.init_scope():
            self.planner.calibrate_some(float("inf"))
        return self._calibrated(entry)

    def _run_gate(self, entry) -> None:
        """The gate (see `calibrate_step`), once enough dense steps are timed and recorded."""
        measured = entry.runtime.timeline.read()
        if measured["steps"] < GATE_STEPS or len(self._step_seconds) < GATE_STEPS:
            return
        step, spread = step_figures(self._step_seconds)
        latest = self._latest(list(measured["ready_seconds"])
                              + [max(measured["bucket_end_seconds"], default=0.0), step, spread])
        ready = latest[:-3]
        exposed = max(0.0, float(latest[-3]) - float(max(ready, default=0.0)))
        self.gate = calibration_gate(exposed, float(latest[-2]), float(latest[-1]))
        if self.gate.calibrates:
            earlier = self.planner.dense_verdict(entry.tensors)
            if earlier is not None and self.gate.potential_gain <= VERDICT_TOLERANCE * earlier:
                self.gate = replace(self.gate, calibrates=False, share=0.0, earlier_gain=earlier)
        report.show(self.gate.describe(), self.collectives.rank)  # the running plan stays: an unpriced dense table
        if not self.gate.calibrates:
            self._calibration = _GATED
            return
        self.planner.start_calibration(entry.tensors)
        self._calibration = _RUNNING

    def _calibrate_within_budget(self, entry) -> bool:
        """Runs pieces within the gate's budget (see `calibrate_step`); plans where they finished.
        Every figure it decides from is agreed: the gate's median step, each call's calibration
        seconds on rank 0's clock (one broadcast after a call that ran pieces)."""
        self._calibrating_calls += 1
        steps = min(self._calibrating_calls + GATE_STEPS, BUDGET_STEPS)  # in the window, the gate's steps counted
        earlier = sum(list(self._calibrating)[-(BUDGET_STEPS - 1):])  # the window's calls before this one
        allowed = self.gate.share * steps * self.gate.step_seconds - earlier
        if allowed <= 0.0:
            self._calibrating.append(0.0)
            return False
        started = self.clock()
        with tf.init_scope():
            done = self.planner.calibrate_some(allowed)
            spent = self.collectives.broadcast(tf.constant(self.clock() - started, tf.float64), 0,
                                               "tfcomp_calibration_spent")
        self._calibrating.append(float(spent.numpy()))
        return self._calibrated(entry) if done else False

    def _measured_step(self):
        """(the gate's median training step in seconds, the margin it set), what a plan must gain a
        share of; None where the gate has not measured (calibration run at once)."""
        return None if self.gate is None else (self.gate.step_seconds, self.gate.margin)

    def _calibrated(self, entry) -> bool:
        """Calibration just finished: plans `entry`'s gradients with its figures and the ready times
        measured so far, installs that plan where it compresses (it replaces the dense stand-in
        whatever it is predicted to gain, as a first plan would run) or lends the running plan its
        figures; shows it on rank 0. Returns whether the plan changed."""
        self._calibration = _DONE
        _, ready = self._ready_times_kept(entry)
        with tf.init_scope():
            plan = self.planner.plan(entry.tensors, entry.signature, ready_seconds=ready, step=self._measured_step())
        changed = bool(plan.compressed)
        if changed:
            self._exchange.install(plan)
        else:
            self._exchange.reprice(plan.cluster, plan.ready)
            self._keep_dense_verdict(entry)
        report.show(f"tfcomp: calibrated in {self.calibration_seconds:.1f} s; "
                    + ("a new plan (one retrace of the training step)" if changed else "every gradient stays dense")
                    + f":\n{self._last_entry().plan.table()}", self.collectives.rank)
        return changed

    # -- the trial's verdict -----------------------------------------------------------------------

    @property
    def trial_dropped_compression(self) -> bool:
        """Whether a trial in this job found compressing slower than dense: the running plan's
        (every bucket is now sent dense) or that of a plan since replaced (`remember_trial_verdict`).
        From then on re-plans keep every bucket dense (an unshaped CNN job's re-plan with its
        measured ready times installed a new plan that compressed, traced and tried it, and its
        trial dropped it again: about 10 s of its 87 s of training). Changes nothing."""
        if self._compression_dropped:
            return True
        entry = self._last_entry()
        trial = None if entry is None else entry.runtime.trial
        if trial is None:
            return False
        with tf.init_scope():
            return not trial.read()["compressed"]

    def remember_trial_verdict(self) -> None:
        """Keeps the running plan's trial verdict for the rest of the job: the exchange calls it
        right before a plan replaces the running one (whose trial goes with it)."""
        self._compression_dropped = self.trial_dropped_compression

    def _running(self, entry) -> planning.Plan:
        """What `entry`'s step sends from now on: its plan, all dense where a trial dropped compression."""
        return entry.plan.all_dense() if self.trial_dropped_compression else entry.plan

    # -- re-planning -------------------------------------------------------------------------------

    def replan(self, min_gain: float = REPLAN_MIN_GAIN) -> bool:
        """Makes the plan of the last list of gradients again, with when each gradient became ready
        in the steps run so far (the exchange's `timeline`: medians over its last steps, the latest
        over the ranks, since a collective waits for its slowest rank), so that the search weighs
        the overlap of dense buckets with the backward pass. Call it eagerly, on every rank at the
        same step (`tfcomp.keras.Replan` does), after at least one step. Returns whether the plan
        changed (only where the new plan is predicted to save `min_gain` of the running one's
        exchange after the backward pass, both priced with the same figures:
        `tfcomp.planning.pays_to_replace`): then the training step must be traced again to run it
        (Keras: `model.make_train_function(force=True)`, which the callback does; a custom loop: a
        new `tf.function`); the new plan is tried in training like the first. Where a trial in this
        job dropped a plan, only the dense buckets are planned again: the trial measured that
        compressing loses here, which outweighs the model. False (nothing done) with
        planning="off", a fixed plan or one worker, and without calibrated figures (calibration
        pending, or ruled out by the gate: every gradient stays dense). Residuals carry over; a bucket now sent dense
        sends its residual first. The ready times are cached
        (`tfcomp.calibration.store_ready_times`) for the first plan of a later job of the same
        model on the same hosts."""
        planning.check_min_gain(min_gain)  # also where the new plan turns out the same
        entry = self._replannable()
        if entry is None:
            return False
        measured, ready = self._ready_times_kept(entry)
        if ready is None:
            raise RuntimeError("tfcomp: replan() needs the ready times of at least one training step; call it after "
                               "training has run")
        changed = self._plan_again(entry, ready, min_gain)
        if changed:
            report.show(f"tfcomp: re-planned with the gradients' ready times measured over {measured['steps']} steps "
                        f"(one retrace of the training step):\n{self._last_entry().plan.table()}",
                        self.collectives.rank)
        return changed

    def check_prediction(self, threshold: float = DEPARTURE_THRESHOLD):
        """Compares when the exchange ends, measured (the timeline's medians over its window, the
        latest over the ranks), with what the cost model predicts for the plan being run (all dense
        where its trial dropped it) given the same measured ready times, and re-plans where they
        differ by more than `threshold` (a fraction of the prediction, > 0): first with the
        overlap slowdown fitted to the measurement (`tfcomp.planning.fit_overlap_slowdown`: how much
        slower transfers run beside the backward pass), and, where that does not bring the
        prediction within `threshold` (the network or the compression costs are off), with the
        cluster calibrated again (the networks measured, the compression costs from the cache; once a
        job, and for an all-dense plan only where a network that explains the measurement would make
        a plan that compresses) and the slowdown fitted anew. Every rank decides from the same
        gathered figures; the new plan's digest is checked across ranks and, where it compresses,
        it is tried in training. Where the trial dropped the plan, the departure is reported and
        nothing is re-planned: the trial measured that compressing loses in this job, which
        outweighs the model (an unshaped CNN run re-planned three times around a 25 % departure of
        the all-dense prediction, each new plan compressing and tried again: 176 s of training
        against plain Horovod's 133).

        Where the measurement is more than 2x the prediction (or under half of it), rank 0 says so
        once a job (`tfcomp.report`), with what was done about it.

        Call it eagerly, on every rank at the same step (`tfcomp.keras.Replan` does). Returns None
        where there is nothing to check yet (no plan made by the planner, one worker, no calibrated
        figures (calibration pending, or ruled out by the gate), the plan's trial undecided or the
        timeline's window not yet full since the plan was installed), else
        {"predicted_seconds", "measured_seconds", "departure" (measured / predicted - 1),
        "replanned" (whether the figures were fitted again), "changed" (whether the plan's buckets
        did, or its all-dense plan was installed again without a flush of residuals it has sent
        (`settle`): then trace the step again, as after `replan`), "overlap_slowdown",
        "recalibrated"}."""
        if not threshold > 0.0:
            raise ValueError(f"threshold must be a fraction > 0 of the predicted exchange time, got {threshold!r}")
        entry = self._replannable()
        if entry is None:
            return None
        timeline, trial = entry.runtime.timeline, entry.runtime.trial
        # The window's steps must all run what the check prices: after the trial's decision.
        since = int(timeline.steps.numpy()) if trial is None else int(trial.step.numpy()) - trial.decision_step
        if since < timeline.window:
            return None
        running, measured = self.measured_plan()
        ready = [running.ready[p] for p, _, _ in entry.tensors]
        predicted = planning.predicted_exchange_time(running)
        departure = measured / predicted - 1.0 if predicted > 0.0 else 0.0
        result = {"predicted_seconds": predicted, "measured_seconds": measured, "departure": departure,
                  "replanned": False, "changed": False, "overlap_slowdown": running.cluster.overlap_slowdown,
                  "recalibrated": False}
        if abs(departure) <= threshold or self.trial_dropped_compression:
            result["changed"] = self._settle(entry, running)
            if abs(departure) > threshold:
                self._show_departure(predicted, measured, "the trial measured compressing slower than dense here, so "
                                     "every gradient stays dense and nothing is re-planned")
            return result

        def fitted(cluster):  # the fit prices every slowdown it tries itself: the cluster's own is not used
            slowdown = planning.fit_overlap_slowdown(replace(running, cluster=cluster), measured)
            return replace(cluster, overlap_slowdown=slowdown)

        cluster = fitted(running.cluster)
        unexplained = abs(measured / planning.predicted_exchange_time(replace(running, cluster=cluster)) - 1.0) > threshold
        if (unexplained and not self._recalibrated
                and self._network_could_change_the_plan(entry, running, ready, measured)):
            # Once a job: where a new calibration did not explain it either, the departure comes from
            # what the model does not price (workers' compute beside the exchange), not a changed network.
            with tf.init_scope():
                cluster = fitted(self.planner.recalibrate(entry.tensors))
            result["recalibrated"] = self._recalibrated = True
        self.planner.cluster = cluster
        result.update(replanned=True, changed=self._plan_again(entry, ready), overlap_slowdown=cluster.overlap_slowdown)
        action = (f"re-planned with transfers {cluster.overlap_slowdown:.2f}x slower beside the backward pass"
                  + (" and the cluster calibrated again" if result["recalibrated"] else "") + ": "
                  + ("a new plan (one retrace of the training step)" if result["changed"] else "the plan stays"))
        self._show_departure(predicted, measured, action)
        if result["changed"]:
            report.show(f"tfcomp: the exchange ended {1e3 * measured:.1f} ms after the first gradient where "
                        f"{1e3 * predicted:.1f} ms were predicted ({100.0 * departure:+.0f} %); {action}:\n"
                        f"{self._last_entry().plan.table()}", self.collectives.rank)
        elif self.collectives.rank == 0:
            logging.info("tfcomp: the exchange ended %.1f ms after the first gradient where %.1f ms were predicted "
                         "(%+.0f %%); %s", 1e3 * measured, 1e3 * predicted, 100.0 * departure, action)
        return result

    def _show_departure(self, predicted: float, measured: float, action: str) -> None:
        """Says on rank 0, once a job, that the measured exchange (`measured` seconds) is more than
        `_SHOWN_DEPARTURE` times its prediction (`predicted`) or under its share of it, and `action`."""
        if self._departure_shown or not predicted > 0.0:
            return
        if 1.0 / _SHOWN_DEPARTURE <= measured / predicted <= _SHOWN_DEPARTURE:
            return
        self._departure_shown = True
        report.show(f"tfcomp: predicted {1e3 * predicted:.1f} ms for the exchange, measured {1e3 * measured:.1f} ms "
                    f"({measured / predicted:.2f}x the prediction; said once a job): {action}", self.collectives.rank)

    def measured_plan(self):
        """(plan, seconds): the plan run for the last list of gradients (all dense where its trial
        dropped it) with the gradients' ready times its exchange timeline measured, and when its
        exchange ended after the step's first gradient: medians over the timeline's window, each
        the latest over the ranks (a collective waits for its slowest rank; one allgather). None
        where there is nothing measured yet (no plan, one worker, no step run). Call it eagerly,
        on every rank at the same step. `tfcomp.planning.predicted_exchange_time` of the plan is
        what `check_prediction` compares with the seconds, and `planning.fit_overlap_slowdown`
        fits the slowdown that explains them."""
        entry = self._last_entry()
        if entry is None or self.collectives.size < 2 or not entry.tensors:
            return None
        measured = entry.runtime.timeline.read()
        if measured["steps"] == 0:
            return None
        ready, end = self._latest_over_ranks(entry, measured)
        return replace(self._running(entry), ready={p: ready[i] for i, (p, _, _) in enumerate(entry.tensors)}), end

    def settle(self) -> bool:
        """Where the plan of the last list of gradients sends everything dense in every later step
        (it is all dense, or its trial dropped it) and has sent every residual, but its step still
        carries the trial's branch or the flush of residuals, installs that all-dense plan without
        them and returns True: trace the step again. Else False (also while a trial is undecided,
        and where the planner does not make the plan). Call it eagerly, on every rank at the same
        step: one step after installing a plan that flushes residuals (an all-dense plan after a
        re-plan flushes them in its first step), as `tfcomp.keras.Replan` does after each change;
        otherwise the next `check_prediction` settles it."""
        entry = self._replannable()
        if entry is None:
            return False
        settled = self._settle(entry, self._running(entry))
        if settled and self.trial_dropped_compression:
            self._keep_dense_verdict(entry)
        return settled

    def _keep_dense_verdict(self, entry) -> None:
        """Caches, where the gate measured the step, that compressing does not pay for `entry`'s
        gradients here (calibration planned dense, or a trial dropped the plan), for later jobs."""
        if self.gate is not None:
            self.planner.keep_dense_verdict(entry.tensors, self.gate.potential_gain)

    def _last_entry(self):
        return None if self._exchange is None else self._exchange.last_entry

    def _network_could_change_the_plan(self, entry, running, ready: list, measured: float) -> bool:
        """Whether calibrating the networks again could change the plan `running` (its `ready` the
        measured ready times) whose exchange measured `measured` seconds: always where it compresses;
        where it is all dense, only where the network that alone would explain the measurement
        (`tfcomp.planning.network_explaining`) makes a plan that compresses. A calibration measures
        the networks (the compression costs come from the cache), and an all-dense exchange measured
        slower than predicted bounds how slow they can be; a faster one makes compressing pay even
        less. (Where 4 workers share 2 cores, the all-dense exchange measured 16 to 46 % above its
        prediction and a second calibration changed nothing but cost the job its time.)"""
        if running.compressed:
            return True
        network = planning.network_explaining(running, measured)
        return bool(planning.make_plan(entry.tensors, self.compressor, network, ready_seconds=ready).compressed)

    def _replannable(self):
        """The plan entry of the last list of gradients where the planner made it and may remake
        it (planning="auto", no fixed plan, several workers, gradients to plan, calibrated figures:
        no calibration pending nor ruled out by the gate); else None."""
        entry = self._last_entry()
        if (entry is None or self.fixed_plan is not None or self.compressor.planning != "auto"
                or self.collectives.size < 2 or not entry.tensors or self._calibration not in (_NONE, _DONE)):
            return None
        return entry

    def _ready_times_kept(self, entry) -> tuple:
        """(`entry`'s timeline reading, the gradients' ready times in it: the latest over the ranks,
        per planner tensor, or None where no step was timed), those times kept for the planner and
        for later jobs (`Planner.keep_ready_times`). Every rank calls it at the same step."""
        measured = entry.runtime.timeline.read()
        if not measured["steps"]:
            return measured, None
        ready, _ = self._latest_over_ranks(entry, measured)
        self.planner.keep_ready_times(entry.tensors, ready)
        return measured, ready

    def _latest_over_ranks(self, entry, measured: dict) -> tuple:
        """([ready seconds per planner tensor], the exchange's end): `measured`'s timeline medians,
        the latest over the ranks (one allgather)."""
        latest = self._latest(measured["ready_seconds"] + [max(measured["bucket_end_seconds"], default=0.0)])
        return [float(latest[p]) for p, _, _ in entry.tensors], float(latest[-1])

    def _latest(self, values: list) -> np.ndarray:
        """float64 [len(values)]: each of `values` (floats, as many on every rank) at its largest
        over the ranks (one allgather; every rank gets the same)."""
        with tf.init_scope():
            gathered = self.collectives.allgather([tf.constant(values, tf.float64)])[0]
        return np.max(np.reshape(gathered.numpy(), [self.collectives.size, -1]), axis=0)

    def _plan_again(self, entry, ready: list, min_gain: float = REPLAN_MIN_GAIN) -> bool:
        """Makes the plan of `entry`'s gradients with `ready` times (only its all-dense buckets where
        a trial in this job dropped a plan); installs it where its buckets differ and it pays to
        replace what runs now (the old plan, or all dense where its trial dropped it;
        `planning.replacement` with `min_gain`) (returns True: the step must be traced again, and a
        plan that compresses is tried again), else keeps running the old one with the new plan's
        figures; where that plan sends everything dense, has sent every residual and still carries
        a trial's branch or their flush, it is installed again without them (`_settle`)."""
        with tf.init_scope():
            plan = self.planner.plan(entry.tensors, entry.signature, ready_seconds=ready, step=self._measured_step())
            residuals_sent = entry.runtime.dense_residuals_sent(entry.plan)
        dropped = self.trial_dropped_compression
        running = entry.plan.all_dense() if dropped else entry.plan
        chosen = planning.replacement(running, plan, min_gain, compressing=not dropped)
        if chosen is None:
            self._exchange.reprice(plan.cluster, plan.ready)
            return self._settle(entry, replace(running, cluster=plan.cluster, ready=plan.ready))
        self._exchange.install(chosen, residuals_sent=residuals_sent and not chosen.compressed)
        return True

    def _settle(self, entry, running) -> bool:
        """Where every later step of `entry`'s plan sends everything dense (the plan is all dense, or
        its trial dropped it) and has sent every residual, but the step still carries the trial's
        branch or the tf.conds that flush residuals (which cost the 82-tensor model's step on 8
        workers of this machine 1.1x plain Horovod's), installs `running` (that all-dense plan)
        without them and returns True: trace the step again. Else False."""
        with tf.init_scope():
            settled = entry.runtime.residuals_sent or not entry.runtime.dense_residuals_sent(entry.plan)
        if settled:
            return False
        self._exchange.install(running, residuals_sent=True)
        report.show("tfcomp: every gradient is sent dense from now on, as Horovod sends it, without the trial's branch "
                    "or the flush of residuals it has sent (one retrace of the training step)", self.collectives.rank)
        return True
