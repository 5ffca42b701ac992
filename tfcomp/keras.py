"""Keras callbacks that show what the compressed exchange does.

    model.fit(..., callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                              tfcomp.keras.CompressionMonitor(log_dir="logs"),
                              tf.keras.callbacks.CSVLogger("train.csv"),
                              tf.keras.callbacks.TensorBoard("logs")])

`Replan(after_steps=30)` drives the exchange's calibration between training steps
(`GradientExchange.calibrate_step` after each: the first steps send everything dense, as Horovod
does, and no step waits for a calibration; after 10 steps a gate decides whether compression could
pay at all, and only then does calibration run, within a small share of the steps' time), then
plans with those figures; 30 steps later it makes the exchange's plan again, with when each
gradient became ready in those steps (`GradientExchange.replan`), so that dense buckets are priced
with their overlap of the backward pass, then every 20 steps compares the exchange's measured end
with the prediction and re-plans where they part by more than 25 %
(`GradientExchange.check_prediction`); once a plan's trial has dropped it, it installs the all-dense
plan without the trial's branch (`GradientExchange.settle`); and it has Keras trace the training
step again wherever the plan changed. Without it (or a custom loop's calls) every gradient of a
plan the planner chooses stays dense.

`CompressionMonitor` adds, at the end of every epoch, these entries to the epoch's `logs` (so the
progress bar, and the callbacks after it in the list, such as `CSVLogger` and `TensorBoard`, show
them), all measured over the epoch's steps on this worker:

  tfcomp_sent_mb_per_step      megabytes (10^6) this worker handed to the collectives per step: the
                               run-time sizes of the payloads sent (IndexedSlices' vary from
                               step to step), the dense tensors, the indices AR-Topk's owner
                               broadcasts;
  tfcomp_sent_fraction         those bytes over the bytes of the same gradients sent dense;
  tfcomp_exchange_ms_per_step  milliseconds from the exchange's start (its gradients computed) to
                               its end (every reduced gradient computed): compression, collectives
                               and decoding, as far as the backward pass does not hide them (over
                               the steps timed: every step of a compressing plan, the steps an
                               all-dense plan's timeline samples);
  tfcomp_gradients_ready_ms    from the first gradient ready to the last, in a step (the part of the
                               backward pass the exchange can overlap; median of the last 20 steps);
  tfcomp_exposed_exchange_ms   how long after the last gradient the last bucket's exchange ends (what
                               the backward pass does not hide; median of the last 20 steps);
  tfcomp_residual_norm         the global L2 norm of this worker's error-feedback residuals (with
                               DGC's momentum correction, its accumulated velocities) at the
                               epoch's end: what was computed and not yet sent.

With a `log_dir` it also writes the exchange's plan and `describe()` table as TensorBoard text
(`tfcomp/plan`) whenever they change. For an optimizer that runs no tfcomp exchange (stock Horovod)
it adds only `tfcomp_dense_mb_per_step` (the trainable variables' bytes) and says once why.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from absl import logging

from tfcomp.controller import DEPARTURE_THRESHOLD
from tfcomp.horovod_glue import exchange_of

__all__ = ["CompressionMonitor", "Replan"]

_MB = 1e6


class CompressionMonitor(tf.keras.callbacks.Callback):
    """Per-epoch figures of the tfcomp exchange in `logs` (keys in the module docstring).

    Args:
      log_dir: where to write the plan as TensorBoard text (None: not written).
    """

    def __init__(self, log_dir=None):
        super().__init__()
        self.log_dir = log_dir
        self._writer = None
        self._written_plan = None
        self._said_no_exchange = False

    def _exchange(self):
        try:
            return exchange_of(self.model.optimizer)
        except TypeError:
            return None

    def on_epoch_begin(self, epoch, logs=None):
        exchange = self._exchange()
        if exchange is not None:
            exchange.counters.reset()

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        exchange = self._exchange()
        if exchange is None:
            dense = sum(v.shape.num_elements() * v.dtype.size for v in self.model.trainable_variables)
            logs["tfcomp_dense_mb_per_step"] = dense / _MB
            if not self._said_no_exchange:
                logging.info("tfcomp.keras.CompressionMonitor: %s runs no tfcomp exchange (build it with "
                             "compression=<a tfcomp compressor>); only the dense size is reported",
                             type(self.model.optimizer).__name__)
                self._said_no_exchange = True
            return
        counted = exchange.counters.read()
        if counted["steps"]:
            logs["tfcomp_sent_mb_per_step"] = counted["sent_bytes"] / counted["steps"] / _MB
            logs["tfcomp_sent_fraction"] = counted["sent_bytes"] / max(counted["dense_bytes"], 1.0)
        if counted["timed_steps"]:
            logs["tfcomp_exchange_ms_per_step"] = 1e3 * counted["seconds"] / counted["timed_steps"]
        timeline = exchange.timeline.read() if exchange.timeline is not None else {"steps": 0}
        if timeline["steps"] and timeline["bucket_end_seconds"]:
            backward = timeline["backward_seconds"]
            logs["tfcomp_gradients_ready_ms"] = 1e3 * backward
            logs["tfcomp_exposed_exchange_ms"] = 1e3 * max(0.0, max(timeline["bucket_end_seconds"]) - backward)
        residuals = [v.numpy() for v in exchange.memory.residuals]
        logs["tfcomp_residual_norm"] = float(np.sqrt(sum(np.sum(np.square(r, dtype=np.float64)) for r in residuals)))
        self._write_plan(exchange, epoch)

    def _write_plan(self, exchange, epoch: int) -> None:
        if self.log_dir is None or exchange.plan is None:
            return
        text = f"{exchange.plan.table()}\n\n{exchange.describe()}"
        if text == self._written_plan:
            return
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(str(self.log_dir))
        with self._writer.as_default():
            # Markdown in TensorBoard: indent by four spaces to keep the tables' columns.
            tf.summary.text("tfcomp/plan", "\n".join("    " + line for line in text.splitlines()), step=epoch)
        self._writer.flush()
        self._written_plan = text

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _finite_above_zero(value) -> bool:
    """Whether `value` is a real number (not a bool) in (0, inf)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0.0 < value < float("inf")


class Replan(tf.keras.callbacks.Callback):
    """Calibrates and re-plans the tfcomp exchange with what training measures, on every rank at
    the same step (steps counted over every `fit` call), and rebuilds Keras's training function
    wherever the plan changed so that the next step runs it:

      * after each step while calibration is pending (planning="auto", no forced strategy, several
        workers: the first plan sends every gradient dense), `GradientExchange.calibrate_step`:
        the gate after 10 steps (where compression cannot gain its margin, every gradient stays
        dense and nothing is calibrated), then calibration within a share of the steps' time (2 %,
        or half the potential gain the gate measured), and the exchange planned with its figures;
      * once, `after_steps` steps after that (after the first step where calibration ran at the
        start or is not needed), with the gradients' ready times measured in them
        (`GradientExchange.replan`), so that dense buckets are priced with their overlap of the
        backward pass;
      * then `check_every` steps later, and again after twice as many steps each time the
        prediction held (back to `check_every` after a re-plan: a check costs up to tens of ms), where
        the exchange's measured end departs from the prediction by more than `threshold`
        (`GradientExchange.check_prediction`: the overlap slowdown fitted, or the cluster
        calibrated again), at most `max_replans` times;
      * after every step while the running plan's trial may still drop it, and one step after each
        change, `GradientExchange.settle`: as soon as a trial has dropped its plan and the residuals
        are sent (or a new all-dense plan has flushed them), the all-dense plan is installed without
        the trial's branch or the flush, so the step is traced once more and runs Horovod's step.
        A custom loop does the same with `exchange.calibrate_step()` and `exchange.settle()` after
        each step, tracing its step function again wherever either returns True.

    `calibrated_at`: the step (counted from 1) after which calibration between steps finished or
    the gate ruled it out (None: not yet, or none pending); `replanned`: None until `after_steps`,
    then whether that re-plan changed the plan; `checks`: each `check_prediction` result that was
    not None, in order. Does nothing for an optimizer that runs no tfcomp exchange.

    Args:
      after_steps: training steps to measure first (>= 1; default 30: past the first plan's trial
        of 23 steps, and the timeline's 20-step window full).
      check_every: steps to the first check of the prediction, and between checks after a
        re-plan (>= 1; the interval doubles after each check that holds), or None: no checks.
      threshold: the departure (a fraction of the prediction, > 0) that re-plans.
      max_replans: at most this many re-plans by the checks (>= 0).
    """

    def __init__(self, after_steps: int = 30, check_every=20, threshold: float = DEPARTURE_THRESHOLD,
                 max_replans: int = 3):
        super().__init__()
        for name, value, least in (("after_steps", after_steps, 1), ("max_replans", max_replans, 0)) + (
                (("check_every", check_every, 1),) if check_every is not None else ()):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
        if not _finite_above_zero(threshold):
            raise ValueError(f"threshold must be a finite fraction > 0, got {threshold!r}")
        self.after_steps = after_steps
        self.check_every = check_every
        self.threshold = float(threshold)
        self.max_replans = max_replans
        self.calibrated_at = None
        self.replanned = None
        self.checks = []
        self._steps = 0  # steps since calibration between steps ended (all steps where none was pending)
        self._check_interval = check_every  # steps from one check of the prediction to the next
        self._next_check = check_every  # the next check, in steps after `after_steps`
        self._steps_run = 0
        self._settle_due = False  # the plan changed a step ago
        self._trial_kept = None  # the trial that kept its plan (nothing more to settle for it)

    def _exchange(self):
        try:
            return exchange_of(self.model.optimizer)
        except TypeError:
            return None

    def _retrace(self) -> None:
        self.model.make_train_function(force=True)

    def on_train_batch_end(self, batch, logs=None):
        exchange = self._exchange()
        if exchange is None:
            return
        self._steps_run += 1
        self._settle(exchange)
        if exchange.calibration_pending:
            changed = exchange.calibrate_step()
            if not exchange.calibration_pending:
                self.calibrated_at = self._steps_run
            if changed:
                self._retrace()
            self._settle_due = changed
            return
        self._steps += 1
        since = self._steps - self.after_steps
        checking = (self.check_every is not None and since > 0 and since == self._next_check
                    and sum(c["replanned"] for c in self.checks) < self.max_replans)
        if since != 0 and not checking:
            return
        if since == 0:
            self.replanned = changed = exchange.replan()
        else:
            result = exchange.check_prediction(self.threshold)
            calm = result is None or not (result["replanned"] or result["changed"])
            # A check that finds the prediction holding (or nothing to check) doubles the interval to the next.
            self._check_interval = 2 * self._check_interval if calm else self.check_every
            self._next_check = since + self._check_interval
            if result is None:
                return
            self.checks.append(result)
            changed = result["changed"]
        if changed:
            self._retrace()
        self._settle_due = changed

    def _settle(self, exchange) -> None:
        """`GradientExchange.settle` one step after a change, and after every step while the running
        plan's trial has not kept it (cheap: a few variable reads); retraces where it settled."""
        trial = exchange.trial
        watching = trial is not None and trial is not self._trial_kept
        if (self._settle_due or watching) and exchange.settle():
            self._retrace()
        elif watching:
            result = trial.read()
            if result["decided"] and result["compressed"]:
                self._trial_kept = trial
        self._settle_due = False
