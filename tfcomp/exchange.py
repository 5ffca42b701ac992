"""The compressed gradient exchange behind every Horovod entry point.

`GradientExchange` is what Horovod's `DistributedOptimizer` (Keras and TF2) and
`DistributedGradientTape` call as their "allreduce grads" function once `tfcomp` is imported and a
tfcomp compressor is given (see `tfcomp.horovod_glue`). For a list of gradients and their sources
(variables, or watched tensors) it returns the list of reduced gradients, averaged or summed over
the process set as `op` says.

The exchange keeps Horovod's calling protocol and owns three things, each in its own module:
  * its state (`tfcomp.memory.ExchangeState`: residuals and step counter), created with the
    exchange, outside any traced function, and tracked so that checkpoints carry it;
  * a plan per list of gradients, decided by the `tfcomp.controller.PlanController` it is handed
    (its first plan by the `tfcomp.planner.Planner`: agreement across ranks, all dense until
    calibrated between steps or calibration at once, bucket search, digest check), made once,
    eagerly, the first time the list is seen (shown on rank 0), and reused by every later call and
    every retrace until the controller installs another (calibration between steps, re-plans, the
    trial's verdict: `exchange.controller`);
  * the step graph (`tfcomp.step.StepGraph`) that runs a plan: inline when called inside a
    `tf.function`, as a `tf.function` of its own when called eagerly. A plan that sends
    everything dense (with nothing left in the exchange's memory to send) runs Horovod's own
    reduction for the exchange's settings (`dense_reduction`), on Horovod's own lists: the step
    is Horovod's, with the exchange's bookkeeping off its critical path.

Gradients of float32, float16 and bfloat16 may be compressed; float64, integer and other gradients
are reduced as Horovod reduces them (dense allreduce), as are `tf.IndexedSlices` (Horovod's sparse
allgather) unless `sparse_as_dense`. The exchange runs in TF2 (eager or inside `tf.function`); TF1
graph mode is refused at construction.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace

import horovod.tensorflow as hvd
import tensorflow as tf
from absl import logging

from tfcomp import calibration
from tfcomp.collectives import HorovodCollectives
from tfcomp.compressors import FP16, Compressor
from tfcomp.controller import DEPARTURE_THRESHOLD, REPLAN_MIN_GAIN, PlanController
from tfcomp.counters import ExchangeCounters
from tfcomp.horovod_glue import horovod_reduction
from tfcomp.memory import ExchangeState
from tfcomp.planner import Planner, TensorSignature
from tfcomp.step import StepGraph

__all__ = ["COMPRESSIBLE_DTYPES", "GradientExchange", "PlanEntry", "TensorRecord", "check_predivide_factor",
           "check_tf2_mode"]

COMPRESSIBLE_DTYPES = (tf.float32, tf.float16, tf.bfloat16)


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
                  + [bucket.elements for bucket in plan.buckets if bucket.strategy.compresses], default=0)
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


class PlanEntry:
    """A plan run for one list of gradients, what it was made from (the planner's tensors
    [(position, name, elements)] and signature, the gradients' specs, their sources), its
    `tfcomp.step.StepRuntime` (trial, timeline, residuals' flush), and its eager step function
    (made on first eager use)."""

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
      controller: the `tfcomp.controller.PlanController` that decides the plans, with a planner of
        this compressor (default: one with a `tfcomp.planner.Planner` of this exchange's settings,
        these collectives and `plan`; give either `plan` or `controller`, not both).
      dense_reduction: Horovod's own "allreduce grads" function, which every step of a plan that
        sends everything dense runs (`tfcomp.step.StepGraph.run_as_horovod`): the Horovod glue gives
        the one Horovod would have built from the user's arguments; default: the one of this
        exchange's settings (`tfcomp.horovod_glue.horovod_reduction`).

    The controller's `calibrate_step`, `calibrate`, `calibration_pending`, `calibration_seconds`,
    `ready_times_cached`, `replan`, `check_prediction`, `measured_plan` and `settle` are the
    exchange's too (one-line delegations: `exchange.controller.X` is the same). With planning="auto",
    no forced strategy and several workers, the first plan sends every gradient dense, as Horovod
    does, and calibration runs only where a driver runs it: `tfcomp.keras.Replan()` in `model.fit`,
    or `calibrate_step()` after each step of a custom loop (which also needs `settle()` after each
    step to drop a dropped plan's branch; see `tfcomp.keras.Replan`), or `calibrate()` at once.
    """

    def __init__(self, compressor: Compressor, *, op=hvd.Average, gradient_predivide_factor: float = 1.0,
                 sparse_as_dense: bool = False, process_set=hvd.global_process_set, name: str = "tfcomp",
                 plan=None, collectives=None, controller=None, dense_reduction=None):
        check_tf2_mode()
        super().__init__(name=name.replace(">", "_"))
        if not isinstance(compressor, Compressor):
            raise TypeError(f"compressor must be a tfcomp.Compressor instance, got {compressor!r}")
        if op not in (hvd.Average, hvd.Sum):
            raise ValueError(f"op must be hvd.Average or hvd.Sum for tfcomp compressors, got {op!r}")
        if controller is not None and plan is not None:
            raise ValueError("give a fixed plan either as plan= or to the controller (PlanController(fixed_plan=...)), "
                             "not both")
        if controller is not None and controller.compressor is not compressor:
            raise ValueError(f"controller plans for {controller.compressor!r}, not this exchange's compressor "
                             f"{compressor!r}")
        self.compressor = compressor
        self.op = op
        self.gradient_predivide_factor = check_predivide_factor(gradient_predivide_factor)
        self.sparse_as_dense = bool(sparse_as_dense)
        self.process_set = process_set
        collectives = collectives or HorovodCollectives(process_set)
        self.state = ExchangeState(collectives.rank, collectives.size) if collectives.included() else ExchangeState()
        self._collectives = collectives
        self.counters = ExchangeCounters()
        if dense_reduction is None:
            dense_reduction = horovod_reduction(compressor, name=self.name, sparse_as_dense=self.sparse_as_dense, op=op,
                                                gradient_predivide_factor=self.gradient_predivide_factor,
                                                process_set=process_set)
        self._step_graph = StepGraph(compressor, self.state, collectives, op=op,
                                     gradient_predivide_factor=self.gradient_predivide_factor, process_set=process_set,
                                     counters=self.counters, dense_reduction=dense_reduction)
        self.controller = controller or PlanController(Planner(compressor, process_set, {
            "op": int(op), "gradient_predivide_factor": self.gradient_predivide_factor,
            "sparse_as_dense": self.sparse_as_dense}), collectives, fixed_plan=plan)
        self.controller.bind(self)
        self._keras_optimizer = None  # a weak reference: the optimizer tracks this exchange, not the reverse
        self._plans = {}
        self._last_key = None
        self.plan = self.controller.fixed_plan
        self.trial = None
        self.timeline = None  # the current plan's tfcomp.timeline.ExchangeTimeline
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

    # -- what the controller decides (one-line delegations; see tfcomp.controller.PlanController) --

    @property
    def calibration_seconds(self) -> float:
        """`PlanController.calibration_seconds`."""
        return self.controller.calibration_seconds

    @property
    def ready_times_cached(self) -> bool:
        """`PlanController.ready_times_cached`."""
        return self.controller.ready_times_cached

    @property
    def calibration_pending(self) -> bool:
        """`PlanController.calibration_pending`."""
        return self.controller.calibration_pending

    def calibrate_step(self) -> bool:
        """`PlanController.calibrate_step`: the driver's call after each step (the gate, then calibration)."""
        return self.controller.calibrate_step()

    def calibrate(self) -> bool:
        """`PlanController.calibrate`: what calibration is pending, run at once, without the gate or the budget."""
        return self.controller.calibrate()

    def replan(self, min_gain: float = REPLAN_MIN_GAIN) -> bool:
        """`PlanController.replan`: the plan made again with the gradients' measured ready times."""
        return self.controller.replan(min_gain)

    def check_prediction(self, threshold: float = DEPARTURE_THRESHOLD):
        """`PlanController.check_prediction`: the measured exchange against its prediction."""
        return self.controller.check_prediction(threshold)

    def measured_plan(self):
        """`PlanController.measured_plan`: the running plan with its measured ready times, and its end."""
        return self.controller.measured_plan()

    def settle(self) -> bool:
        """`PlanController.settle`: a dropped or all-dense plan installed again without a trial or flush."""
        return self.controller.settle()

    # -- the Keras optimizer served (part of Horovod's Keras protocol) ------------------------------

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

    # Autograph would rewrite the exchange's planning and graph building when a tape is used inside a user's
    # tf.function (12.8 s against 1.5 s for a first call, same result): they build their graph explicitly.
    @tf.autograph.experimental.do_not_convert
    def __call__(self, grads, vars=None, use_generic_names=False):  # noqa: A002 (Horovod's signature)
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
        if entry.runtime.horovod:
            # Horovod's own step, on Horovod's own lists.
            def step(gs, srcs, generic_names):
                sized = [self._sized(g, source) for g, source in zip(gs, srcs) if g is not None]
                return self._step_graph.run_as_horovod(gs, srcs, generic_names, sized, entry.plan, entry.runtime)
            arguments = (grads, sources, bool(use_generic_names))
        else:
            def step(gs):
                return self._step_graph(entry.plan, gs, entry.sources, entry.runtime)
            arguments = (grads_in,)
        if not tf.executing_eagerly():
            reduced = step(*arguments)
        else:
            if entry.eager_step is None:
                entry.eager_step = _UntrackedFunction(tf.function(step, autograph=False))
            reduced = entry.eager_step(*arguments)
        if entry.runtime.horovod:
            return list(reduced)
        out = list(grads)
        for i, r in zip(present, reduced):
            out[i] = r
        return out

    def _sized(self, grad, source):
        """What `grad` puts on the wire as Horovod reduces it, for counting its bytes: itself, or,
        for `tf.IndexedSlices` with sparse_as_dense, a `tf.TensorSpec` of its source's shape."""
        if self.sparse_as_dense and isinstance(grad, tf.IndexedSlices):
            return tf.TensorSpec(source.shape, grad.dtype)
        return grad

    def _densify(self, grad, source):
        """With sparse_as_dense, IndexedSlices become dense tensors of the source's static shape."""
        if self.sparse_as_dense and isinstance(grad, tf.IndexedSlices):
            return tf.reshape(tf.convert_to_tensor(grad), source.shape)
        return grad

    # -- the plan ----------------------------------------------------------------------------------

    def _compressible(self, grad) -> bool:
        return (self.compressor.collective.compresses and not isinstance(grad, tf.IndexedSlices)
                and grad.dtype in COMPRESSIBLE_DTYPES and grad.shape.is_fully_defined())

    def _plan_for(self, grads, keys, names) -> PlanEntry:
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
        plan = self.controller.first_plan(tensors, signature)
        entry = self._install(cache_key, plan, tensors, signature, specs, keys)
        with tf.init_scope():
            self.state.adopt_restored(self._collectives.rank, self._collectives.size, self.compressor.error_feedback)
        if not plan.compressed and (pending := self.state.memory.pending_restores()):
            logging.warning("tfcomp: the restored checkpoint holds %d error-feedback residuals (an update still owed), "
                            "but this plan sends every gradient dense: they are sent only once a plan compresses "
                            "their gradients again", pending)
        if self._collectives.rank == 0 and (advice := _cpu_allocator_advice(plan, tensors)):
            logging.warning("%s", advice)
        return entry

    def _install(self, cache_key, plan, tensors, signature, specs, keys, residuals_sent: bool = False) -> PlanEntry:
        """Makes `plan` the one run for `cache_key`'s gradients: its memory and runtime created
        (eagerly), a trial where it compresses and the controller has plans tried
        (`residuals_sent`: see `tfcomp.step.StepRuntime`). The running plan's trial verdict is kept
        by the controller first (`PlanController.remember_trial_verdict`)."""
        self.controller.remember_trial_verdict()
        with tf.init_scope():
            runtime = self._step_graph.create_state(plan, specs, keys, self.controller.trial_steps, residuals_sent)
        self._plans[cache_key] = entry = PlanEntry(plan, tensors, signature, specs, keys, runtime)
        self._last_key = cache_key
        self.plan, self.trial, self.timeline = plan, runtime.trial, runtime.timeline
        return entry

    @property
    def last_entry(self) -> PlanEntry | None:
        """The `PlanEntry` of the plan run for the last list of gradients seen (None before the first call)."""
        return self._plans.get(self._last_key)

    def install(self, plan, residuals_sent: bool = False) -> PlanEntry:
        """Makes `plan` (of the same gradients) the one run for the last list of gradients, its
        runtime and trial created anew (the controller's re-plans; trace the step again to run it).
        `residuals_sent`: see `tfcomp.step.StepRuntime`. Eagerly."""
        entry = self.last_entry
        if entry is None:
            raise RuntimeError("tfcomp: no list of gradients has been exchanged yet: nothing to install a plan for")
        return self._install(self._last_key, plan, entry.tensors, entry.signature, entry.specs, entry.sources,
                             residuals_sent)

    def reprice(self, cluster, ready) -> None:
        """Keeps running the last list's plan, with `cluster` and `ready` as its figures (what a
        re-plan that changed no bucket measured)."""
        entry = self.last_entry
        entry.plan = self.plan = replace(entry.plan, cluster=cluster, ready=ready)

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
            elif bucket is not None and bucket.strategy.compresses:
                # The bucket's payload, shared out by elements.
                sent = round(bucket.strategy.wire_bytes(compressor, bucket.elements, self._collectives.size) * size
                             / bucket.elements)
                records.append(TensorRecord(name, size, f"{type(compressor).__name__} {bucket.strategy}",
                                            dense_bytes, sent, number))
            elif isinstance(compressor, FP16) and g.dtype.is_floating:
                records.append(TensorRecord(name, size, "fp16 allreduce", dense_bytes, 2 * size, number))
            else:
                records.append(TensorRecord(name, size, "allreduce", dense_bytes, dense_bytes, number))
        self.records = tuple(records)

    def bytes_per_step(self) -> tuple:
        """(dense bytes, sent bytes) one worker exchanges per step, over the tensors whose payload
        size is fixed (IndexedSlices are left out), with the plan (all dense once its trial
        dropped it)."""
        known = [r for r in self.records if r.sent_bytes >= 0]
        dense = sum(r.dense_bytes for r in known)
        return dense, dense if self.controller.trial_dropped_compression else sum(r.sent_bytes for r in known)

    def compressed_tensors(self) -> list:
        """Names of the tensors the compressor encodes (none once the plan's trial dropped it)."""
        if self.controller.trial_dropped_compression:
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
