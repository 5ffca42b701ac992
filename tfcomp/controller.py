"""Which plan an exchange runs in training: its first plan, deferred calibration, the trial's verdict, re-plans.

A `tfcomp.GradientExchange` runs the plan it is given for each list of gradients; a `PlanController`,
which the exchange is handed (or makes), decides that plan with a `tfcomp.planner.Planner`:

  * the first plan of a list (`first_plan`): a fixed plan given to the exchange, or the planner's
    (agreement, calibration, bucket search, digest check), and whether a plan installed now is
    tried in training (`trial_steps`, `tfcomp.trial`);
  * calibration deferred to run between training steps (`defer_calibration`, `calibrate_step`);
  * re-plans with what training measured: the gradients' ready times (`replan`), the exchange's
    measured end against its prediction (`check_prediction`, `measured_plan`), and an all-dense plan
    installed again without the trial's branch or the flush of residuals it has sent (`settle`);
  * the trial's verdict over the job (`trial_dropped_compression`, `remember_trial_verdict`): once a
    trial found compressing slower than dense, later re-plans keep every bucket dense.

The controller talks to its exchange through three members: `last_entry` (the plan run for the
last list of gradients: `plan`, `tensors`, `signature`, `runtime`, or None), `install(plan,
residuals_sent)` (makes a plan the one run for that list) and `reprice(cluster, ready)` (keeps its
plan with new figures); to the other ranks through its collectives (`tfcomp.collectives`). Every
method that measures or plans runs eagerly, on every rank of the process set at the same step.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import tensorflow as tf
from absl import logging

from tfcomp import planning

__all__ = ["CALIBRATION_SECONDS_PER_STEP", "DEPARTURE_THRESHOLD", "REPLAN_MIN_GAIN", "PlanController"]

REPLAN_MIN_GAIN = 0.05  # a new plan replaces the running one only where predicted to save this fraction of the
# running exchange's part after the backward pass: installing it costs a new trace of the training step and a new
# trial (about a minute for the ViT on 4 workers sharing 2 cores)
DEPARTURE_THRESHOLD = 0.25  # check_prediction re-plans where the measured exchange departs by more
CALIBRATION_SECONDS_PER_STEP = 0.5  # what calibrate_step adds to a step, about (rank 0's clock)


class PlanController:
    """Decides the plans of one exchange (see the module docstring).

    Args:
      planner: the `tfcomp.planner.Planner` of the exchange's compressor and process set.
      collectives: the exchange's collectives (`tfcomp.collectives`: `rank`, `size`, `allgather`).
      fixed_plan: a `tfcomp.planning.Plan` to run for every list of gradients, never tried in
        training nor made again (None: the planner's plans).
    """

    def __init__(self, planner, collectives, fixed_plan=None):
        self.planner = planner
        self.collectives = collectives
        self.fixed_plan = fixed_plan
        self._exchange = None
        self._recalibrated = False  # whether check_prediction has calibrated again (at most once a job)
        self._compression_dropped = False  # whether a replaced plan's trial dropped it (remember_trial_verdict)

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

    def first_plan(self, tensors, signature) -> planning.Plan:
        """The plan of a list of gradients the exchange sees for the first time: the fixed plan, or
        the planner's for `tensors` = [(position, name, elements)] in backprop order and their
        `signature` (`tfcomp.planner.Planner.plan`; rank 0 logs it). Eagerly, on every rank at once."""
        if self.fixed_plan is not None:
            return self.fixed_plan
        with tf.init_scope():
            plan = self.planner.plan(tensors, signature)
        rank, size = self.collectives.rank, self.collectives.size
        if rank == 0 and self.calibration_pending:
            logging.info("tfcomp: calibration deferred to run between training steps; until it is done every gradient "
                         "is sent dense")
        elif rank == 0 and size > 1 and self.compressor.planning == "auto" and tensors:
            logging.info("tfcomp: calibrated in %.1f s%s\n%s", self.calibration_seconds,
                         "; the gradients' ready times from an earlier job" if self.ready_times_cached else "",
                         plan.table())
        return plan

    # -- deferred calibration ----------------------------------------------------------------------

    @property
    def calibration_seconds(self) -> float:
        """Seconds calibration took in this job (the first plan's, and any `check_prediction`
        calibrated again): the network probes alone where the compression costs came from the
        cache; 0 where there was none (one worker, planning off)."""
        return self.planner.calibration_seconds

    @property
    def ready_times_cached(self) -> bool:
        """Whether the first plan took the gradients' ready times from an earlier job of the same
        model on the same hosts (`tfcomp.calibration.cached_ready_times`) rather than assuming all
        of them ready after the backward pass."""
        return self.planner.ready_cached

    @property
    def calibration_pending(self) -> bool:
        """Whether calibration deferred by `defer_calibration` has pieces left to run."""
        return self.planner.calibration_pending

    def defer_calibration(self) -> None:
        """Calibrates between training steps instead of on the first: call it before the first step
        (later it does nothing). The first plan then sends every gradient dense, as Horovod does,
        and measures nothing, and each `calibrate_step()` call after a step runs the next pieces
        of the calibration; when they are done the exchange is planned with its figures (and the
        ready times measured meanwhile), and that plan replaces the dense one where it compresses.
        `tfcomp.keras.Replan` does both. With one worker or planning="off" there is nothing to
        calibrate."""
        self.planner.defer_calibration()

    def calibrate_step(self, seconds: float = CALIBRATION_SECONDS_PER_STEP) -> bool:
        """Runs pieces of the deferred calibration (`defer_calibration`) for about `seconds` (> 0;
        rank 0's clock decides for every rank, and a piece once started runs to its end: a probe's
        first call, or one round of timed calls), then, where that finished it, plans with the
        figures measured and the gradients' ready times of the steps run meanwhile (the latest over
        the ranks, cached for later jobs as `replan` caches them), and installs that plan where it
        compresses (it is then tried in training, as a first plan is). Returns whether it did (trace
        the training step again). Call it eagerly between training steps, on every rank at the
        same step; False (nothing done) where nothing is pending."""
        if not seconds > 0.0:
            raise ValueError(f"seconds must be a time > 0 to calibrate for, got {seconds!r}")
        entry = self._last_entry()
        if entry is None or not self.planner.calibration_pending:
            return False
        with tf.init_scope():
            done = self.planner.calibrate_some(seconds)
        if not done:
            return False
        _, ready = self._ready_times_kept(entry)
        with tf.init_scope():
            plan = self.planner.plan(entry.tensors, entry.signature, ready_seconds=ready)
        # The dense plan run so far stood in for this one: a plan that compresses replaces it whatever
        # it is predicted to gain (as a first plan would run), an all-dense one only lends its figures.
        changed = bool(plan.compressed)
        if changed:
            self._exchange.install(plan)
        else:
            self._exchange.reprice(plan.cluster, plan.ready)
        if self.collectives.rank == 0:
            logging.info("tfcomp: calibrated between steps in %.1f s; %s\n%s", self.calibration_seconds,
                         "a new plan" if changed else "the plan stays", self._last_entry().plan.table())
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
        planning="off", a fixed plan or one worker. Residuals carry over; a bucket now sent dense
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
        if changed and self.collectives.rank == 0:
            logging.info("tfcomp: re-planned with the gradients' ready times measured over %d steps\n%s",
                         measured["steps"], self._last_entry().plan.table())
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

        Call it eagerly, on every rank at the same step (`tfcomp.keras.Replan` does). Returns None
        where there is nothing to check yet (no plan made by the planner, one worker, a deferred
        calibration still running, the plan's trial undecided or the timeline's window not yet
        full since the plan was installed), else
        {"predicted_seconds", "measured_seconds", "departure" (measured / predicted - 1),
        "replanned" (whether the figures were fitted again), "changed" (whether the plan's buckets
        did, or its all-dense plan was installed again without a flush of residuals it has sent
        (`settle`): then trace the step again, as after `replan`), "overlap_slowdown",
        "recalibrated"}."""
        if not threshold > 0.0:
            raise ValueError(f"threshold must be a fraction > 0 of the predicted exchange time, got {threshold!r}")
        entry = self._replannable()
        if entry is None or self.calibration_pending:
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
        if self.collectives.rank == 0:
            logging.info("tfcomp: the exchange ended %.1f ms after the first gradient where %.1f ms were predicted "
                         "(%+.0f %%); re-planned with transfers %.2fx slower beside the backward pass%s: %s",
                         1e3 * measured, 1e3 * predicted, 100.0 * departure, cluster.overlap_slowdown,
                         " and the cluster calibrated again" if result["recalibrated"] else "",
                         "a new plan\n" + self._last_entry().plan.table() if result["changed"] else "the plan stays")
        return result

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
        return self._settle(entry, self._running(entry))

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
        it (planning="auto", no fixed plan, several workers, gradients to plan); else None."""
        entry = self._last_entry()
        if (entry is None or self.fixed_plan is not None or self.compressor.planning != "auto"
                or self.collectives.size < 2 or not entry.tensors):
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
        values = measured["ready_seconds"] + [max(measured["bucket_end_seconds"], default=0.0)]
        with tf.init_scope():
            gathered = self.collectives.allgather([tf.constant(values, tf.float64)])[0]
        latest = np.max(np.reshape(gathered.numpy(), [self.collectives.size, -1]), axis=0)
        return [float(latest[p]) for p, _, _ in entry.tensors], float(latest[-1])

    def _plan_again(self, entry, ready: list, min_gain: float = REPLAN_MIN_GAIN) -> bool:
        """Makes the plan of `entry`'s gradients with `ready` times (only its all-dense buckets where
        a trial in this job dropped a plan); installs it where its buckets differ and it pays to
        replace what runs now (the old plan, or all dense where its trial dropped it;
        `planning.replacement` with `min_gain`) (returns True: the step must be traced again, and a
        plan that compresses is tried again), else keeps running the old one with the new plan's
        figures; where that plan sends everything dense, has sent every residual and still carries
        a trial's branch or their flush, it is installed again without them (`_settle`)."""
        with tf.init_scope():
            plan = self.planner.plan(entry.tensors, entry.signature, ready_seconds=ready)
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
        return True
