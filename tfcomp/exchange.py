"""The compressed gradient exchange behind every Horovod entry point.

`GradientExchange` is what Horovod's `DistributedOptimizer` (Keras and TF2) and
`DistributedGradientTape` call as their "allreduce grads" function once `tfcomp` is imported and a
tfcomp compressor is given (see `tfcomp.horovod_glue`). For a list of gradients and their sources
(variables, or watched tensors) it returns the list of reduced gradients, averaged or summed over
the process set as `op` says.

The exchange owns three things, each in its own module:
  * its state (`tfcomp.memory.ExchangeState`: residuals and step counter), created with the
    exchange, outside any traced function, and tracked so that checkpoints carry it;
  * a plan per list of gradients (`tfcomp.planner.Planner`: agreement across ranks, calibration,
    bucket search, digest check), made once, eagerly, the first time the list is seen (printed
    on rank 0), and reused by every later call and every retrace;
  * the step graph (`tfcomp.step.StepGraph`) that runs a plan: inline when called inside a
    `tf.function`, as a `tf.function` of its own when called eagerly.

Gradients of float32, float16 and bfloat16 may be compressed; float64, integer and other gradients
are reduced as Horovod reduces them (dense allreduce), as are `tf.IndexedSlices` (Horovod's sparse
allgather) unless `sparse_as_dense`. The exchange runs in TF2 (eager or inside `tf.function`); TF1
graph mode is refused at construction.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from absl import logging

from tfcomp import calibration, planning
from tfcomp.collectives import HorovodCollectives
from tfcomp.compressors import FP16, Compressor
from tfcomp.counters import ExchangeCounters
from tfcomp.memory import ExchangeState
from tfcomp.planner import Planner, TensorSignature
from tfcomp.step import StepGraph, wire_bytes

__all__ = ["CALIBRATION_SECONDS_PER_STEP", "COMPRESSIBLE_DTYPES", "DEPARTURE_THRESHOLD", "REPLAN_MIN_GAIN",
           "GradientExchange", "TensorRecord", "check_predivide_factor", "check_tf2_mode", "exchange_of"]

COMPRESSIBLE_DTYPES = (tf.float32, tf.float16, tf.bfloat16)
REPLAN_MIN_GAIN = 0.05  # a new plan replaces the running one only where predicted to save this fraction of the
# running exchange's part after the backward pass: installing it costs a new trace of the training step and a new
# trial (about a minute for the ViT on 4 workers sharing 2 cores)
DEPARTURE_THRESHOLD = 0.25  # check_prediction re-plans where the measured exchange departs by more
CALIBRATION_SECONDS_PER_STEP = 0.5  # what calibrate_step adds to a step, about (rank 0's clock)


def check_tf2_mode() -> None:
    """Raises RuntimeError in TF1 graph mode (eager execution disabled, or a tf.Graph as default
    outside any tf.function), where the exchange's state and calibration cannot run."""
    with tf.init_scope():
        eager = tf.executing_eagerly()
    if not eager:
        raise RuntimeError(
            "tfcomp runs in TensorFlow 2 modes only: eager execution and tf.function (Keras model.fit, "
            "custom loops with or without @tf.function). TF1 graph mode (tf.compat.v1 sessions, "
            "tf.compat.v1.disable_eager_execution(), or building under tf.Graph().as_default()) is not "
            "supported; use Horovod's own compression there")


def check_predivide_factor(factor) -> float:
    """`gradient_predivide_factor` as a float; ValueError unless it is a finite number > 0."""
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < float(factor) < float("inf"):
        raise ValueError(f"gradient_predivide_factor must be a finite number > 0, got {factor!r}")
    return float(factor)


_MALLOC_MAPPED_BYTES = 32 << 20  # glibc maps every allocation above this afresh (its largest mmap threshold)


def _cpu_allocator_advice(plan, tensors) -> str | None:
    """A line advising TensorFlow's BFC allocator where the gradients live in CPU memory, the default
    allocator (malloc) is in use, and the plan's largest tensor or compressed bucket (whose sums and
    decode are one tensor) exceeds 32 MiB as float32: glibc then maps it afresh, page-faulted on
    every step. None where the advice does not apply."""
    if calibration.cpu_allocator() == "BFC" or tf.config.list_logical_devices("GPU"):
        return None
    largest = max([elements for _, _, elements in tensors]
                  + [bucket.elements for bucket in plan.buckets if bucket.strategy != "dense"], default=0)
    if 4 * largest <= _MALLOC_MAPPED_BYTES:
        return None
    return (f"tfcomp: a gradient or bucket of {4 * largest / 2**20:.0f} MiB lives in CPU memory, where TensorFlow's "
            "default allocator passes it to malloc, which maps it afresh and page-faults it on every step; set "
            "TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow starts (README, \"Training on CPUs\")")


@dataclass(frozen=True)
class TensorRecord:
    """How one gradient is exchanged: name, elements, strategy, bytes per worker per step
    (sent_bytes -1: depends on the step, as for IndexedSlices; a compressed bucket's payload is
    shared out by elements), and its bucket in the plan (-1: not planned)."""

    name: str
    elements: int
    strategy: str
    dense_bytes: int
    sent_bytes: int
    bucket: int = -1


class _UntrackedFunction:
    """Holds a tf.function out of sight of object tracking: SavedModel export would otherwise
    retrace it in its own graph, where the variables it uses are stand-ins."""

    def __init__(self, function):
        self._function = function

    def __call__(self, *args):
        return self._function(*args)


class _PlanEntry:
    """A plan, what it was made from (the planner's tensors and signature, the gradients' specs,
    their sources), its `StepRuntime`, and its eager step function (made on first eager use)."""

    def __init__(self, plan, tensors, signature, specs, sources, runtime):
        self.plan = plan
        self.tensors = tensors
        self.signature = signature
        self.specs = specs
        self.sources = sources
        self.runtime = runtime
        self.eager_step = None


def _not_recorded_by_tf_function(next_creator, **kwargs):
    """A variable creator: a variable created eagerly (under `tf.init_scope`, as all of the
    exchange's state is) while a `tf.function` traces is kept out of that function's record of the
    variables its first call created (`experimental_enable_variable_lifting=False`: it exists and
    holds its initial value already, so there is nothing to lift). A function whose first call
    creates no other variable then runs its first trace instead of tracing a second time."""
    if tf.executing_eagerly():
        kwargs["experimental_enable_variable_lifting"] = False
    return next_creator(**kwargs)


def _name(source, position: int) -> str:
    return getattr(source, "name", None) or f"gradient_{position}"


def _shape_checked(position: int, grad, source):
    """`grad` where its shape is its source's; ValueError naming both where they differ statically
    (at trace time). Where either shape is known only when the step runs, `grad` with an assertion
    that they agree (tf.errors.InvalidArgumentError at run time)."""
    source_shape = tf.TensorShape(getattr(source, "shape", None))
    if isinstance(grad, tf.IndexedSlices):
        grad_shape = tf.TensorShape(tf.get_static_value(grad.dense_shape))
    else:
        grad_shape = grad.shape
    if not grad_shape.is_compatible_with(source_shape):
        raise ValueError(f"gradient {position} (for {_name(source, position)}) has shape {grad_shape.as_list()}, but "
                         f"its source has shape {source_shape.as_list()}: give each variable or watched tensor a "
                         "gradient of its own shape")
    if isinstance(grad, tf.IndexedSlices) or (grad_shape.is_fully_defined() and source_shape.is_fully_defined()):
        return grad
    with tf.control_dependencies([tf.debugging.assert_equal(
            tf.shape(grad), tf.shape(source),
            message=f"gradient {position} (for {_name(source, position)}) has another shape than its source")]):
        return tf.identity(grad)


def _source_key(source, position: int, grad):
    """What identifies a gradient's source across steps and traces: the variable itself, or, for
    a watched tensor (a new object every step), its position, shape and dtype in the list."""
    if isinstance(source, tf.Variable):
        return source
    return ("watched tensor", position, tuple(grad.shape), grad.dtype.name)


class GradientExchange(tf.Module):
    """Callable (grads, sources) -> reduced grads, with its state tracked as a tf.Module.

    Args:
      compressor: a `tfcomp.Compressor`.
      op: `hvd.Average` or `hvd.Sum`.
      gradient_predivide_factor: as in Horovod (finite, > 0); applies to the tensors sent dense
        (the compressed ones are summed in float32 by the decode and then divided by K).
      sparse_as_dense: convert `tf.IndexedSlices` gradients to dense tensors first.
      process_set: the Horovod process set to reduce over.
      name: name scope of the exchange's ops.
      plan: a fixed `tfcomp.planning.Plan` for the gradients it will see (default: made by the
        planner the first time a list of gradients is seen, and, where it compresses, tried in
        training: `compressor.trial_steps`, `tfcomp.trial`). Not tried when given.
      collectives: what the compressed buckets use (default: Horovod's over process_set).
    """

    def __init__(self, compressor: Compressor, *, op=hvd.Average, gradient_predivide_factor: float = 1.0,
                 sparse_as_dense: bool = False, process_set=hvd.global_process_set, name: str = "tfcomp",
                 plan=None, collectives=None):
        check_tf2_mode()
        super().__init__(name=name.replace(">", "_"))
        if not isinstance(compressor, Compressor):
            raise TypeError(f"compressor must be a tfcomp.Compressor instance, got {compressor!r}")
        if op not in (hvd.Average, hvd.Sum):
            raise ValueError(f"op must be hvd.Average or hvd.Sum for tfcomp compressors, got {op!r}")
        self.compressor = compressor
        self.op = op
        self.gradient_predivide_factor = check_predivide_factor(gradient_predivide_factor)
        self.sparse_as_dense = bool(sparse_as_dense)
        self.process_set = process_set
        collectives = collectives or HorovodCollectives(process_set)
        self.state = ExchangeState(collectives.rank, collectives.size) if collectives.included() else ExchangeState()
        self._collectives = collectives
        self.counters = ExchangeCounters()
        self._step_graph = StepGraph(compressor, self.state, collectives, op=op,
                                     gradient_predivide_factor=self.gradient_predivide_factor, process_set=process_set,
                                     counters=self.counters)
        self._planner = Planner(compressor, process_set, {
            "op": int(op), "gradient_predivide_factor": self.gradient_predivide_factor,
            "sparse_as_dense": self.sparse_as_dense})
        self._fixed_plan = plan
        self._keras_optimizer = None  # a weak reference: the optimizer tracks this exchange, not the reverse
        self._plans = {}
        self._last_key = None
        self.plan = plan
        self.trial = None
        self.timeline = None  # the current plan's tfcomp.timeline.ExchangeTimeline
        self._recalibrated = False  # whether check_prediction has calibrated again (at most once a job)
        self._compression_lost = False  # whether a trial in this job dropped a plan (_plan_dropped)
        self.records: tuple = ()

    # -- state -------------------------------------------------------------------------------------

    @property
    def memory(self):
        """The `tfcomp.memory.ErrorFeedback` of this exchange (residuals and DGC momenta)."""
        return self.state.memory

    @property
    def step(self) -> tf.Variable:
        """int64 scalar: communicating steps so far (restored with the residuals)."""
        return self.state.step

    @property
    def calibration_seconds(self) -> float:
        """Seconds calibration took in this job (the first plan's, and any `check_prediction`
        calibrated again): the network probes alone where the compression costs came from the
        cache; 0 where there was none (one worker, planning off)."""
        return self._planner.calibration_seconds

    @property
    def ready_times_cached(self) -> bool:
        """Whether the first plan took the gradients' ready times from an earlier job of the same
        model on the same hosts (`tfcomp.calibration.cached_ready_times`) rather than assuming all
        of them ready after the backward pass."""
        return self._planner.ready_cached

    @property
    def calibration_pending(self) -> bool:
        """Whether calibration deferred by `defer_calibration` has pieces left to run."""
        return self._planner.calibration_pending

    def defer_calibration(self) -> None:
        """Calibrates between training steps instead of on the first: call it before the first step
        (later it does nothing). The first plan then sends every gradient dense, as Horovod does,
        and measures nothing, and each `calibrate_step()` call after a step runs the next pieces
        of the calibration; when they are done the exchange is planned with its figures (and the
        ready times measured meanwhile), and that plan replaces the dense one where it compresses.
        `tfcomp.keras.Replan` does both. With one worker or planning="off" there is nothing to
        calibrate."""
        self._planner.defer_calibration()

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
        entry = self._plans.get(self._last_key)
        if entry is None or not self._planner.calibration_pending:
            return False
        with tf.init_scope():
            done = self._planner.calibrate_some(seconds)
        if not done:
            return False
        _, ready = self._ready_times_kept(entry)
        with tf.init_scope():
            plan = self._planner.plan(entry.tensors, entry.signature, ready_seconds=ready)
        # The dense plan run so far stood in for this one: a plan that compresses replaces it whatever
        # it is predicted to gain (as a first plan would run), an all-dense one only lends its figures.
        changed = bool(plan.compressed)
        if changed:
            self._install(self._last_key, plan, entry.tensors, entry.signature, entry.specs, entry.sources)
        else:
            entry.plan = self.plan = replace(entry.plan, cluster=plan.cluster, ready=plan.ready)
        if self._collectives.rank == 0:
            logging.info("tfcomp: calibrated between steps in %.1f s; %s\n%s", self.calibration_seconds,
                         "a new plan" if changed else "the plan stays", self.plan.table())
        return changed

    def serve_keras_optimizer(self, optimizer) -> None:
        """Records the Keras optimizer (`tf.keras.optimizers.Optimizer`) whose gradients this
        exchange reduces (the Horovod glue does, for `hvd.DistributedOptimizer`): at the first call
        the exchange builds it for the call's variables (its slots, as its `apply_gradients` would
        right after the exchange) together with its own state, where the training function's trace
        does not record them as created in it. Keras then traces the train function once, not twice.
        A legacy optimizer (`tf.keras.optimizers.legacy`) is left to build itself."""
        self._keras_optimizer = weakref.ref(optimizer) if isinstance(optimizer, tf.keras.optimizers.Optimizer) else None

    def _build_keras_optimizer(self, sources) -> None:
        """Builds the served Keras optimizer for `sources` (its variables), eagerly, once: the
        reference is dropped afterwards, so later calls do nothing."""
        optimizer, self._keras_optimizer = self._keras_optimizer(), None
        if optimizer is not None and all(isinstance(s, tf.Variable) for s in sources):
            with tf.init_scope():
                optimizer.build(sources)  # does nothing where Keras built it already

    # -- Horovod's calling protocol ----------------------------------------------------------------

    def __call__(self, grads, vars=None, use_generic_names=False):  # noqa: A002 (Horovod's signature)
        del use_generic_names
        grads = list(grads)
        if vars is None:
            raise ValueError("tfcomp's exchange needs the sources of the gradients (variables or watched tensors)")
        sources = list(vars)
        if len(sources) != len(grads):
            raise ValueError(f"got {len(grads)} gradients for {len(sources)} sources (variables or watched "
                             "tensors): give one gradient (or None) per source")
        if not self._collectives.included():
            return grads
        present = [i for i, g in enumerate(grads) if g is not None]
        grads_in = [self._densify(_shape_checked(i, grads[i], sources[i]), sources[i]) for i in present]
        keys = [_source_key(sources[i], n, g) for n, (i, g) in enumerate(zip(present, grads_in))]
        names = [_name(sources[i], i) for i in present]
        with tf.variable_creator_scope(_not_recorded_by_tf_function):
            entry = self._plan_for(grads_in, keys, names)
            if self._keras_optimizer is not None:
                self._build_keras_optimizer(sources)
        self._record(grads_in, names, entry.plan)
        if tf.executing_eagerly():
            if entry.eager_step is None:
                entry.eager_step = _UntrackedFunction(tf.function(
                    lambda gs: self._step_graph(entry.plan, gs, entry.sources, entry.runtime), autograph=False))
            reduced = entry.eager_step(grads_in)
        else:
            reduced = self._step_graph(entry.plan, grads_in, entry.sources, entry.runtime)
        out = list(grads)
        for i, r in zip(present, reduced):
            out[i] = r
        return out

    def _densify(self, grad, source):
        """With sparse_as_dense, IndexedSlices become dense tensors of the source's static shape."""
        if self.sparse_as_dense and isinstance(grad, tf.IndexedSlices):
            return tf.reshape(tf.convert_to_tensor(grad), source.shape)
        return grad

    # -- the plan ----------------------------------------------------------------------------------

    def _compressible(self, grad) -> bool:
        return (self.compressor.collective != "dense" and not isinstance(grad, tf.IndexedSlices)
                and grad.dtype in COMPRESSIBLE_DTYPES and grad.shape.is_fully_defined())

    def _plan_for(self, grads, keys, names) -> _PlanEntry:
        """The plan for this list of gradients, made once per list of (source, shape, dtype), on the
        first call, eagerly and on every rank at the same time (agreement, calibration and the
        digest check are collectives), then reused by every later call and retrace. The memory its
        compressed buckets need is created with it, outside any trace."""
        signature = tuple(TensorSignature((name, tuple(g.shape.as_list() if g.shape.rank is not None else [-1]),
                                           g.dtype.name, "sparse" if isinstance(g, tf.IndexedSlices) else "dense"))
                          for name, g in zip(names, grads))
        cache_key = (tuple(k if isinstance(k, tuple) else k.ref() for k in keys), signature)
        if cache_key in self._plans:
            return self._plans[cache_key]
        candidates = [i for i, g in enumerate(grads) if self._compressible(g)]
        # Backprop order: the last variables' gradients are computed first.
        tensors = [(i, names[i], int(grads[i].shape.num_elements())) for i in reversed(candidates)]
        specs = [tf.TensorSpec(g.shape, g.dtype) for g in grads]
        with tf.init_scope():
            plan = self._fixed_plan if self._fixed_plan is not None else self._planner.plan(tensors, signature)
        entry = self._install(cache_key, plan, tensors, signature, specs, keys)
        self._take_restored_state()
        if self._collectives.rank == 0 and self.calibration_pending:
            logging.info("tfcomp: calibration deferred to run between training steps; until it is done every gradient "
                         "is sent dense")
        elif self._collectives.rank == 0 and self._collectives.size > 1 and self.compressor.planning == "auto" and tensors:
            logging.info("tfcomp: calibrated in %.1f s%s\n%s", self.calibration_seconds,
                         "; the gradients' ready times from an earlier job" if self._planner.ready_cached else "",
                         plan.table())
        if self._collectives.rank == 0 and (advice := _cpu_allocator_advice(plan, tensors)):
            logging.warning("%s", advice)
        return entry

    def _install(self, cache_key, plan, tensors, signature, specs, keys, residuals_sent: bool = False) -> _PlanEntry:
        """Makes `plan` the one run for `cache_key`'s gradients: its memory and runtime created
        (eagerly), a trial where it compresses and the planner made it (`residuals_sent`: see
        `tfcomp.step.StepRuntime`)."""
        with tf.init_scope():
            trial_steps = self.compressor.tried_steps if self._fixed_plan is None and self._collectives.size > 1 else 0
            runtime = self._step_graph.create_state(plan, specs, keys, trial_steps, residuals_sent)
        self._plans[cache_key] = entry = _PlanEntry(plan, tensors, signature, specs, keys, runtime)
        self._last_key = cache_key
        self.plan, self.trial, self.timeline = plan, runtime.trial, runtime.timeline
        return entry

    def replan(self, min_gain: float = REPLAN_MIN_GAIN) -> bool:
        """Makes the plan of the last list of gradients again, with when each gradient became ready
        in the steps run so far (`timeline`: medians over its last steps, the latest over the ranks,
        since a collective waits for its slowest rank), so that the search weighs the overlap of
        dense buckets with the backward pass. Call it eagerly, on every rank at the same step
        (`tfcomp.keras.Replan` does), after at least one step. Returns whether the plan changed
        (only where the new plan is predicted to save `min_gain` of the running one's exchange
        after the backward pass, both priced with the same figures: `tfcomp.planning.pays_to_replace`):
        then the training step must be traced again to run it (Keras: `model.make_train_function(
        force=True)`, which the callback does; a custom loop: a new `tf.function`); the new plan is
        tried in training like the first. Where a trial in this job dropped a plan, only the
        dense buckets are planned again: the trial measured that compressing loses here, which
        outweighs the model. False (nothing done) with planning="off", a fixed plan
        or one worker. Residuals carry over; a bucket now sent dense sends its residual first. The
        ready times are cached (`tfcomp.calibration.store_ready_times`) for the first plan of a
        later job of the same model on the same hosts."""
        planning.check_min_gain(min_gain)  # also where the new plan turns out the same
        entry = self._replannable()
        if entry is None:
            return False
        measured, ready = self._ready_times_kept(entry)
        if ready is None:
            raise RuntimeError("tfcomp: replan() needs the ready times of at least one training step; call it after "
                               "training has run")
        changed = self._plan_again(entry, ready, min_gain)
        if changed and self._collectives.rank == 0:
            logging.info("tfcomp: re-planned with the gradients' ready times measured over %d steps\n%s",
                         measured["steps"], self.plan.table())
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
        it is tried in training. Where the
        trial dropped the plan, the departure is reported and nothing is re-planned: the trial
        measured that compressing loses in this job, which outweighs the model (an unshaped CNN
        run re-planned three times around a 25 % departure of the all-dense prediction, each new
        plan compressing and tried again: 176 s of training against plain Horovod's 133).

        Call it eagerly, on every rank at the same step (`tfcomp.keras.Replan` does). Returns None
        where there is nothing to check yet (no plan made by the planner, one worker, a deferred
        calibration still running, the plan's trial undecided or the timeline's window not yet
        full since the plan was installed), else
        {"predicted_seconds", "measured_seconds", "departure" (measured / predicted - 1),
        "replanned" (whether the figures were fitted again), "changed" (whether the plan's buckets
        did, or its all-dense plan was installed again without a flush of residuals it has sent
        (`_settle`): then trace the step again, as after `replan`), "overlap_slowdown",
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
        if abs(departure) <= threshold or self._plan_dropped():
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
                cluster = fitted(self._planner.recalibrate(entry.tensors))
            result["recalibrated"] = self._recalibrated = True
        self._planner.cluster = cluster
        result.update(replanned=True, changed=self._plan_again(entry, ready), overlap_slowdown=cluster.overlap_slowdown)
        if self._collectives.rank == 0:
            logging.info("tfcomp: the exchange ended %.1f ms after the first gradient where %.1f ms were predicted "
                         "(%+.0f %%); re-planned with transfers %.2fx slower beside the backward pass%s: %s",
                         1e3 * measured, 1e3 * predicted, 100.0 * departure, cluster.overlap_slowdown,
                         " and the cluster calibrated again" if result["recalibrated"] else "",
                         "a new plan\n" + self.plan.table() if result["changed"] else "the plan stays")
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
        entry = self._plans.get(self._last_key)
        if entry is None or self._collectives.size < 2 or not entry.tensors:
            return None
        measured = entry.runtime.timeline.read()
        if measured["steps"] == 0:
            return None
        ready, end = self._latest_over_ranks(entry, measured)
        running = entry.plan.all_dense() if self._plan_dropped() else entry.plan
        return replace(running, ready={p: ready[i] for i, (p, _, _) in enumerate(entry.tensors)}), end

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
        entry = self._plans.get(self._last_key)
        if (entry is None or self._fixed_plan is not None or self.compressor.planning != "auto"
                or self._collectives.size < 2 or not entry.tensors):
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
        self._planner.keep_ready_times(entry.tensors, ready)
        return measured, ready

    def _latest_over_ranks(self, entry, measured: dict) -> tuple:
        """([ready seconds per planner tensor], the exchange's end): `measured`'s timeline medians,
        the latest over the ranks (one allgather)."""
        values = measured["ready_seconds"] + [max(measured["bucket_end_seconds"], default=0.0)]
        with tf.init_scope():
            gathered = self._collectives.allgather([tf.constant(values, tf.float64)])[0]
        latest = np.max(np.reshape(gathered.numpy(), [self._collectives.size, -1]), axis=0)
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
            plan = self._planner.plan(entry.tensors, entry.signature, ready_seconds=ready)
            residuals_sent = entry.runtime.dense_residuals_sent(entry.plan)
        dropped = self._plan_dropped()
        running = entry.plan.all_dense() if dropped else entry.plan
        chosen = planning.replacement(running, plan, min_gain, compressing=not dropped)
        if chosen is None:
            entry.plan = self.plan = replace(entry.plan, cluster=plan.cluster, ready=plan.ready)
            return self._settle(entry, replace(running, cluster=plan.cluster, ready=plan.ready))
        self._install(self._last_key, chosen, entry.tensors, entry.signature, entry.specs, entry.sources,
                      residuals_sent=residuals_sent and not chosen.compressed)
        return True

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
        return self._settle(entry, entry.plan.all_dense() if self._plan_dropped() else entry.plan)

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
        self._install(self._last_key, running, entry.tensors, entry.signature, entry.specs, entry.sources,
                      residuals_sent=True)
        return True

    def _take_restored_state(self) -> None:
        """After a restore (the first time a list of gradients is seen): takes this rank's own
        memory from a checkpoint that carries every rank's (`tfcomp.checkpointing.gather_state`
        ran before it was saved), or, from one saved by another number of ranks, their mean (the
        update still owed). Otherwise, if the memory is another rank's, says so once: training
        then goes on, but not as an uninterrupted run would."""
        here = (self._collectives.rank, self._collectives.size)
        with tf.init_scope():
            rank, size = (int(v) for v in self.state.owner.numpy())
            self.state.owner.assign(list(here))
        taken = self.state.adopt_gathered(*here)
        if taken == "mean":
            logging.warning("tfcomp: the checkpoint holds the error-feedback memory of %d ranks; this job has %d, so "
                            "every rank goes on with their mean (the update still owed)", size, here[1])
        elif not taken and (rank, size) != here and self.compressor.error_feedback:
            logging.warning("tfcomp: rank %d of %d restored error-feedback residuals saved by rank %d of %d; it goes "
                            "on with them (an estimate of the update still owed), so training is not bit-identical to "
                            "an uninterrupted run. Call tfcomp.checkpointing.gather_state(optimizer) on every rank "
                            "right before rank 0 saves to resume exactly.", here[0], here[1], rank, size)

    # -- reporting ---------------------------------------------------------------------------------

    def _record(self, grads, names, plan):
        """How each gradient will be exchanged (for describe())."""
        compressor = self.compressor
        bucket_of = {p: (n, b) for n, b in enumerate(plan.buckets) for p in b.positions}
        records = []
        for i, (g, name) in enumerate(zip(grads, names)):
            size = int(g.shape.num_elements() or 0) if not isinstance(g, tf.IndexedSlices) else \
                int(tf.TensorShape(tf.get_static_value(g.dense_shape)).num_elements() or 0)
            dense_bytes = g.dtype.size * size
            number, bucket = bucket_of.get(i, (-1, None))
            if isinstance(g, tf.IndexedSlices):
                records.append(TensorRecord(name, size, "sparse allgather", dense_bytes, -1, number))
            elif bucket is not None and bucket.strategy != "dense":
                # The bucket's payload, shared out by elements.
                sent = round(wire_bytes(compressor, bucket, self._collectives.size) * size / bucket.elements)
                records.append(TensorRecord(name, size, f"{type(compressor).__name__} {bucket.strategy}",
                                            dense_bytes, sent, number))
            elif isinstance(compressor, FP16) and g.dtype.is_floating:
                records.append(TensorRecord(name, size, "fp16 allreduce", dense_bytes, 2 * size, number))
            else:
                records.append(TensorRecord(name, size, "allreduce", dense_bytes, dense_bytes, number))
        self.records = tuple(records)

    def _plan_dropped(self) -> bool:
        """Whether a trial in this job found compressing slower than dense: the running plan's
        (every bucket is now sent dense) or an earlier plan's, which a re-plan then replaced with
        all-dense buckets. From then on re-plans keep every bucket dense (an unshaped CNN job's
        re-plan with its measured ready times installed a new plan that compressed, traced and
        tried it, and its trial dropped it again: about 10 s of its 87 s of training)."""
        if self.trial is not None and not self.trial.read()["compressed"]:
            self._compression_lost = True
        return self._compression_lost

    def bytes_per_step(self) -> tuple:
        """(dense bytes, sent bytes) one worker exchanges per step, over the tensors whose payload
        size is fixed (IndexedSlices are left out), with the plan (all dense once its trial
        dropped it)."""
        known = [r for r in self.records if r.sent_bytes >= 0]
        dense = sum(r.dense_bytes for r in known)
        return dense, dense if self._plan_dropped() else sum(r.sent_bytes for r in known)

    def compressed_tensors(self) -> list:
        """Names of the tensors the compressor encodes (none once the plan's trial dropped it)."""
        if self._plan_dropped():
            return []
        return [r.name for r in self.records if r.strategy.startswith(type(self.compressor).__name__)]

    def describe(self) -> str:
        """A table, one line per gradient of the last list exchanged: its elements, how it is
        exchanged (compressor and strategy of its bucket, allreduce, fp16 allreduce) and the bytes
        one worker sends per step against dense, computed from the plan (a compressed bucket's
        payload shared out by elements; "varies" for IndexedSlices), with their total. What was
        really sent is in `counters` (and `tfcomp.keras.CompressionMonitor`)."""
        if not self.records:
            return "tfcomp: no gradients exchanged yet"
        lines = [f"{'tensor':40s} {'elements':>10s} {'strategy':>22s} {'dense B':>10s} {'sent B':>10s}"]
        for r in self.records:
            sent_text = "varies" if r.sent_bytes < 0 else str(r.sent_bytes)
            lines.append(f"{r.name[:40]:40s} {r.elements:10d} {r.strategy:>22s} {r.dense_bytes:10d} {sent_text:>10s}")
        dense, sent = self.bytes_per_step()
        lines.append(f"{'total':40s} {'':10s} {'':22s} {dense:10d} {sent:10d}  ({sent / max(dense, 1):.2%} of dense)")
        if self.trial is not None:
            result = self.trial.read()
            if not result["decided"]:
                lines.append(f"plan on trial: {self.trial.steps} timed steps with it, as many dense between its halves")
            else:
                verdict = "kept" if result["compressed"] else "dropped: every bucket is sent dense"
                lines.append(f"plan tried in training: median step {result['compressed_ms']:.1f} ms with it, "
                             f"{result['dense_ms']:.1f} ms dense: {verdict}")
        return "\n".join(lines)


def exchange_of(distributed) -> GradientExchange:
    """The tfcomp exchange behind a distributed optimizer or tape built with a tfcomp compressor
    (or `distributed` itself, if it is one), also behind a Keras `LossScaleOptimizer`
    (mixed_float16) wrapping such an optimizer. Its `state` holds the residuals and step counter
    (give it to a `tf.train.Checkpoint` of a custom loop with a tape); `describe()` tells how each
    gradient is exchanged; `counters` what it sent and how long it took. TypeError for anything
    that runs no tfcomp exchange."""
    while not isinstance(distributed, GradientExchange) and hasattr(distributed, "inner_optimizer"):
        distributed = distributed.inner_optimizer
    exchange = distributed if isinstance(distributed, GradientExchange) else getattr(distributed, "_allreduce_grads", None)
    if not isinstance(exchange, GradientExchange):
        raise TypeError(f"{type(distributed).__name__} does not run a tfcomp exchange: build it with "
                        "compression=<a tfcomp compressor>")
    return exchange
