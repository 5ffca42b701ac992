"""The exchange's step graph: a fixed plan turned into the ops of one training step.

`StepGraph(compressor, state, collectives, ...)(plan, grads, sources)` builds, inside or outside a
`tf.function`, the reduction of `grads` (one per source, the plan's positions index them) and
returns the reduced gradients. It never changes the plan and creates no variables: the state
(residuals, step counter) is an `ExchangeState` created beforehand, outside any trace.

  * compressed buckets: each tensor's gradient plus its error-feedback residual (or DGC momentum
    correction), concatenated, encoded as one tensor (MergeComp), the remainder kept as the new
    residuals; buckets of one strategy share one grouped collective: allgather (decoded by one
    `sparse_batched_decode` of all K workers' payloads), allreduce (RandomK's shared indices),
    AR-Topk (the owner's indices broadcast, values at them allreduced), or the hash-partitioned
    sparse allreduce (pairs to their index's owner by one alltoall, the owners' largest sums
    shared by one allgather; error feedback keeps the pairs an owner dropped); divided by K for Average;
  * dense buckets and the other dense tensors: one Horovod allreduce per tensor, as Horovod's own
    optimizer sends them (its cycle fuses those ready together), with Horovod's prescale/postscale
    factors (fp16 on the wire for `tfcomp.FP16()`);
  * `tf.IndexedSlices`: Horovod's sparse allreduce (allgather).

A plan that sends everything dense, with no optimizer moments and no residual left to send in the
exchange, runs Horovod's own reduction instead (`StepGraph.run_as_horovod`: the function Horovod's
optimizer or tape would have built for the same arguments, on Horovod's own lists of gradients):
the same ops as plain Horovod's step, its bookkeeping (counters, timeline) counted at the step's
start or sampled, off the step's critical path.

The first `compressor.warmup_steps` communicating steps send the compressed buckets dense (with
their residuals, which are then cleared). Under DGC momentum correction the momentum lives in the
exchange, so every float gradient the plan sends dense (its dense buckets, and warm-up steps) is
sent as its momentum u = m u + g (plus any residual) and keeps u: factor masking clears the
momentum only where a sparsifier sent elements, and a dense plan trains as momentum SGD does.
(Gradients outside the plan, `tf.IndexedSlices` and tensors of unknown shape, get no momentum.)
Under Adam correction the same holds for Adam's step direction d = m^ / (sqrt(v^) + eps) of each
worker's own moments m and v, which the exchange keeps (never masked). Residuals and moments are
updated only when every reduced gradient is finite, so a step that a loss-scale optimizer skips
leaves them untouched.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from tfcomp import ops
from tfcomp import strategies as st
from tfcomp.compressors import FP16, scale_values
from tfcomp.counters import stamp, stamps, tensor_bytes
from tfcomp.timeline import ExchangeTimeline
from tfcomp.trial import PlanTrial

__all__ = ["StepGraph", "StepRuntime"]


class _Payload(NamedTuple):
    """One bucket's wire tensors, what decoding needs besides them, and what this worker sent, for
    error feedback: (values, indices) pairs taken from the accumulated gradient, or their dense
    value (float32 [n]) for the quantisers; None without error feedback."""

    wire: tuple
    context: object
    sent: object


class _MemoryUpdate(NamedTuple):
    """One bucket's new error-feedback memory: the residual (float32 [n]; None: zero, after a
    dense step, which sent everything), still to be cleared at the (values, indices) this worker
    sent (`cleared`; None: nothing to clear), and the optimizer's moments (a tuple of float32 [n]:
    DGC's momentum u, cleared with the residual, or Adam's m and v, never cleared; None without).
    `residual_kept`: the residual was not sent (a dense step that knows it is zero, or one whose
    flag, which clears it, is handled by `StepGraph._with_memory_update`): left alone."""

    residual: object
    moments: object
    cleared: object
    residual_kept: bool = False


class _Unsummed(NamedTuple):
    """A bucket's gradients and their residuals' values (float32 [n_i] each, one of each per tensor
    of the bucket), kept apart for a compressor that `fuses_residual`: its kernels read the parts in
    place as one bucket (no concatenated copy) and add each gradient and residual in the pass that
    selects (the sums, which become the new residuals, written there), instead of an add pass, a
    concatenation and a second pass that reads the sum."""

    grads: list
    residuals: list  # empty without error feedback: the kernels then read the gradients' parts alone

    @property
    def shape(self):
        return tf.TensorShape([sum(int(g.shape[0]) for g in self.grads)])

    def total(self) -> tf.Tensor:
        return _concat([g + r for g, r in zip(self.grads, self.residuals)] if self.residuals else self.grads)


class _Partitioned(NamedTuple):
    """What the hash-partitioned sparse allreduce gives every rank: the reduced pairs (int32 and
    float32 [u], in the buckets' joint index space; index -1 rows carry the workers' flags) and
    whether any worker flagged a non-finite value or an owner's sum overflowed (bool scalar)."""

    indices: tf.Tensor
    values: tf.Tensor
    flagged: tf.Tensor

    def local_indices(self, offset: int, size: int) -> tf.Tensor:
        """int32 [u]: the pairs' indices within the bucket of `size` elements at `offset`; -1 elsewhere."""
        inside = (self.indices >= offset) & (self.indices < offset + size)
        return tf.where(inside, self.indices - offset, -1)


def _kept_by_owners(sent, total):
    """(values, indices): this worker's sent pairs that reached the reduced result, the others'
    values zero (error feedback clears the former and keeps the latter). A pair counts as kept
    where the reduced `total` (float32 [size]) is not zero: every worker's pair at a kept index
    went into its sum, and where a kept sum is exactly zero, keeping every contribution in the
    residuals conserves the same mass."""
    values, indices = sent
    reached = (indices >= 0) & (tf.gather(total, tf.maximum(indices, 0)) != 0)
    return tf.where(reached, values, 0.0), indices


def _dense(accumulated) -> tf.Tensor:
    """float32 [n]: an accumulated bucket as one tensor."""
    return accumulated.total() if isinstance(accumulated, _Unsummed) else accumulated


def _concat(flats):
    return flats[0] if len(flats) == 1 else tf.concat(flats, axis=0)


def _split(flat, bucket, sizes):
    """The bucket's flat tensor cut back into its tensors' flat parts, in bucket order (a list of
    them, as a fusing compressor's encode gives the sums, is already that)."""
    if isinstance(flat, list):
        return flat
    if len(bucket.positions) == 1:
        return [flat]
    return tf.split(flat, [sizes[i] for i in bucket.positions])


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _any_non_finite(tensors):
    """float32 [1]: 1 where some element of `tensors` is NaN or Inf, else 0."""
    return tf.reshape(tf.cast(tf.reduce_any([tf.reduce_any(tf.logical_not(tf.math.is_finite(t))) for t in tensors]),
                              tf.float32), [1])


def _all_finite(tensors) -> tf.Tensor:
    """bool scalar: whether every element of `tensors` is finite, by one read pass (the sum of
    their sums, which any NaN or Inf makes non-finite) where that sum is finite, element by element
    only where it is not (a NaN or Inf, or finite values whose sum overflows)."""
    if not tensors:
        return tf.constant(True)
    total = tf.add_n([tf.reduce_sum(tf.cast(t, tf.float32)) for t in tensors])
    return tf.cond(tf.math.is_finite(total), lambda: tf.constant(True),
                   lambda: tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors]))


def _sum_stays_finite(wire, num_workers: int):
    """bool scalar: whether the decoded sum of K workers' payloads `wire` is surely finite: every
    floating-point wire tensor finite and K times its largest magnitude within float32's range
    (each element of the sum adds at most K values, one per worker, each at most that large in
    magnitude: a pass over the payloads, never over the dense result)."""
    checks = [tf.reduce_all(tf.math.is_finite(t)) & (tf.reduce_max(tf.abs(t)) * num_workers <= _FLOAT32_MAX)
              for t in wire if t.dtype.is_floating]
    return tf.reduce_all(checks) if checks else tf.constant(True)


def _bucket_end(plan, bucket, outputs) -> tf.Tensor:
    """float64 scalar: when `bucket`'s reduced gradients (in `outputs`, by position) are all
    computed, from one or two one-tensor clocks (a clock over a bucket's many tensors kept each
    alive until the last was reduced: 0.2 ms of the 82-tensor model's step on one worker here). A
    compressed bucket's come from one decode: a clock on its first. A dense bucket's: `_dense_end`."""
    if bucket.strategy.compresses:
        return stamp([outputs[bucket.positions[0]]])
    return _dense_end(plan, bucket.positions, outputs)


def _dense_end(plan, positions, outputs) -> tf.Tensor:
    """float64 scalar: when the reduced gradients at `positions` (of `outputs`), sent dense, are
    all computed. They go one allreduce each, which Horovod completes in the order they were
    ready: a clock on the latest-ready gradient's where the plan knows when each is ready, else on
    the first and last position's (the backward pass computes gradients in the order of their
    variables or its reverse; one clock where they are the same)."""
    if any(plan.ready.values()):
        return stamp([outputs[max(positions, key=lambda p: plan.ready.get(p, 0.0))]])
    ends = sorted({min(positions), max(positions)})
    return stamp([outputs[ends[0]]]) if len(ends) == 1 else tf.reduce_max(stamps([outputs[p] for p in ends]))


def _values(tensor) -> tf.Tensor:
    """A gradient or reduced gradient as one tensor: its values where it is `tf.IndexedSlices`."""
    return tensor.values if isinstance(tensor, tf.IndexedSlices) else tf.convert_to_tensor(tensor)


def _dense_bytes(grads) -> float:
    """Bytes of the gradients `grads` (tensors or TensorSpecs) as dense tensors of their own dtypes
    (IndexedSlices and tensors of unknown shape left out)."""
    return float(sum(g.shape.num_elements() * g.dtype.size for g in grads
                     if not isinstance(g, tf.IndexedSlices) and g.shape.is_fully_defined()))


class StepRuntime:
    """What one plan's steps keep besides the exchange's state, not checkpointed (a plain holder):
    `flush`, a bool variable per variant ("plan", "all_dense": the trial's all-dense twin), set while
    a dense bucket's tensor may hold a residual still to send (at first, in case a restore brought
    one; for the twin, after every step of the plan), the plan's `PlanTrial` or None, its
    `ExchangeTimeline` (when each gradient was ready and each bucket done), and
    `residuals_sent`: where True, the plan is all dense and its tensors' residuals are known to be
    zero (an earlier step sent them), so its steps send the gradients as Horovod's optimizer does,
    without reading or clearing any residual. `horovod`: the plan's steps are Horovod's own
    reduction (`StepGraph.run_as_horovod`; its timeline clocks one end for the whole exchange, on
    sampled steps). Made by `StepGraph.create_state`, eagerly."""

    def __init__(self, trial, timeline, residuals_sent: bool = False, horovod: bool = False):
        with tf.init_scope():
            # With residuals_sent the flags start, and stay, clear: nothing sets them in an all-dense plan's steps.
            self.flush = {variant: tf.Variable(not residuals_sent, trainable=False, name=f"tfcomp_flush_{variant}")
                          for variant in ("plan", "all_dense")}
        self.trial = trial
        self.timeline = timeline
        self.residuals_sent = residuals_sent
        self.horovod = horovod

    def dense_residuals_sent(self, plan) -> bool:
        """Whether every later step of `plan` (the plan run with this runtime) sends everything
        dense and no dense tensor's residual is left to send: read eagerly, after the trial (if
        any) has decided against the plan or where the plan is all dense."""
        if self.trial is not None:
            return not self.trial.read()["compressed"] and not bool(self.flush["all_dense"].numpy())
        return not plan.compressed and not bool(self.flush["plan"].numpy())


class StepGraph:
    """Builds one step's exchange for a fixed plan.

    Args:
      compressor: a `tfcomp.Compressor`.
      state: the `tfcomp.memory.ExchangeState` whose residuals and step counter the step uses.
      collectives: `HorovodCollectives` or `LocalCollectives` (for the compressed buckets).
      op: `hvd.Average` or `hvd.Sum`.
      gradient_predivide_factor: Horovod's, for the tensors sent dense.
      process_set: the Horovod process set of the dense allreduces.
      counters: a `tfcomp.counters.ExchangeCounters` that every step adds its bytes sent, dense
        bytes and time to (None: nothing counted).
      dense_reduction: Horovod's own "allreduce grads" function for these settings
        (`tfcomp.horovod_glue.horovod_reduction`), which a plan that sends everything dense runs
        (`run_as_horovod`); None: such a plan runs tfcomp's dense path.
    """

    def __init__(self, compressor, state, collectives, *, op=hvd.Average, gradient_predivide_factor: float = 1.0,
                 process_set=hvd.global_process_set, counters=None, dense_reduction=None):
        self.compressor = compressor
        self.state = state
        self.collectives = collectives
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.process_set = process_set
        self.counters = counters
        self.dense_reduction = dense_reduction

    def _count_sent(self, nbytes) -> None:
        """Adds `nbytes` (a number or a float64 scalar tensor) to the bytes this step sends."""
        if self.counters is not None:
            self.counters.add_sent(nbytes)

    def _dense_wire_bytes(self, tensors) -> float:
        """Bytes a dense allreduce of `tensors` hands to Horovod (fp16 for tfcomp.FP16's floats)."""
        fp16 = isinstance(self.compressor, FP16)
        return float(sum(t.shape.num_elements() * (2 if fp16 and t.dtype.is_floating else t.dtype.size)
                         for t in tensors))

    def create_state(self, plan, grads, sources, trial_steps: int = 0, residuals_sent: bool = False) -> "StepRuntime":
        """Creates, eagerly (call it outside any trace, before the first step: a traced function
        must not create variables), the error-feedback memory the plan's compressed buckets need
        and the plan's `StepRuntime` (with a `PlanTrial` of `trial_steps` steps per arm where the
        plan compresses and `trial_steps` > 0; `residuals_sent`: the plan is all dense and no
        tensor's residual is left to send, see `StepRuntime`); returns the runtime, to pass to
        every step."""
        if residuals_sent and plan.compressed:
            raise ValueError("residuals_sent applies to an all-dense plan only: this plan compresses")
        with tf.init_scope():
            if self.compressor.error_feedback:
                sizes = [None if g is None else int(g.shape.num_elements() or 0) for g in grads]
                for bucket in plan.compressed + self._dense_buckets_with_memory(plan, sources, sizes, flush=None):
                    for i in bucket.positions:
                        self.state.memory.residual(sources[i], int(grads[i].shape.num_elements()),
                                                   self.compressor.optimizer_state)
            trial = PlanTrial(trial_steps) if plan.compressed and trial_steps > 0 else None
            horovod = trial is None and self._runs_as_horovod(plan, sources, residuals_sent)
            # Horovod's reduction is timed by one end for the whole exchange (where it has gradients).
            timeline = ExchangeTimeline(len(grads), min(len(grads), 1) if horovod else len(plan.buckets))
            return StepRuntime(trial, timeline, residuals_sent or horovod, horovod)

    def _runs_as_horovod(self, plan, sources, residuals_sent: bool) -> bool:
        """Whether `plan`'s steps can be Horovod's own reduction: the plan sends every bucket
        dense, the compressor keeps no optimizer moments in the exchange, and no residual is left
        to send (no error feedback, every residual sent already, or no source holding one: a
        residual that a restore brought into existing memory is sent by tfcomp's dense path
        first). Decided eagerly, when the plan's runtime is created."""
        if self.dense_reduction is None or plan.compressed or self.compressor.optimizer_state:
            return False
        return (not self.compressor.error_feedback or residuals_sent
                or not any(self.state.memory.has(source) for source in sources))

    def run_as_horovod(self, grads, sources, use_generic_names: bool, sized, plan, runtime: "StepRuntime"):
        """Horovod's own reduction (`dense_reduction`) of Horovod's lists `grads` (None entries,
        IndexedSlices and all, as Horovod's optimizer or tape gives them) and `sources`, with its
        `use_generic_names`: the same collectives, in the same order, with the same names and
        attributes as Horovod's step. `plan` (all dense) and `runtime` (its `create_state`) index
        the gradients that are not None; `sized`: what each of those puts on the wire (itself, or a
        `tf.TensorSpec` of the dense tensor Horovod makes of it), for its bytes.

        The bookkeeping stays off the step's critical path: the steps and bytes are counted at the
        step's start by assign_adds that wait for no tensor of the step (where only IndexedSlices'
        sizes vary, on those alone), `state.step` is counted likewise, and on the steps the
        timeline samples (`ExchangeTimeline.sampled`) one tf.cond records the gradients' ready
        times and the exchange's end (one or two clocks: `_dense_end`) and adds the time to the
        counters; on the other steps it runs nothing."""
        if self.counters is not None:
            self.counters.count_step(self._horovod_sent_bytes(sized), _dense_bytes(sized))
        self.state.step.assign_add(1)
        sampled = runtime.timeline.sampled()
        out = self.dense_reduction(grads, sources, use_generic_names)
        present = [i for i, g in enumerate(grads) if g is not None]
        values = [_values(grads[i]) for i in present]
        outputs = [_values(out[i]) for i in present]

        def record():
            ready = stamps([values[i] for i in runtime.timeline.clocked])
            ended = tf.reshape(_dense_end(plan, range(len(outputs)), outputs), [1]) if outputs \
                else tf.zeros([0], tf.float64)
            updates = [runtime.timeline.record(ready, ended)]
            if self.counters is not None:
                updates.append(self.counters.add_time(ready, ended))
            return tf.group(updates)

        tf.cond(sampled, record, tf.no_op)
        return out

    def _horovod_sent_bytes(self, sized):
        """What Horovod's reduction of `sized` (tensors, IndexedSlices or TensorSpecs) hands to its
        collectives: a number for dense tensors of known shape (fp16 for tfcomp.FP16's floats), plus
        a float64 scalar tensor for IndexedSlices (their values and indices) and tensors of unknown
        shape."""
        fixed, varying = [], []
        for g in sized:
            if isinstance(g, tf.IndexedSlices):
                varying += [g.values, g.indices]
            elif g.shape.is_fully_defined():
                fixed.append(g)
            else:
                varying.append(g)
        total = self._dense_wire_bytes(fixed)
        return tf.add_n([tensor_bytes(t) for t in varying]) + total if varying else total

    def __call__(self, plan, grads, sources, runtime: "StepRuntime"):
        """The reduced `grads` (a list of tensors or IndexedSlices) under `plan`. `sources`: what
        each gradient belongs to (variables, or keys of watched tensors), for error feedback;
        `runtime`: the plan's `create_state`. Under a trial, a tf.switch_case picks the plan, every
        bucket dense with the residuals the plan's steps left, or (once those are sent) every
        bucket dense as Horovod sends it."""
        # Each clock waits for its gradient alone: the buckets start as soon as theirs are ready.
        ready = stamps([_values(grads[i]) for i in runtime.timeline.clocked])
        if runtime.trial is None:
            out = self._reduce(plan, grads, sources, runtime, "plan")
        else:
            # The trial starts once the warm-up steps (which the plan's branch sends dense) are over.
            after_warmup = self.state.step >= self.compressor.warmup_steps
            compressed = tf.cond(after_warmup, lambda: runtime.trial.sends_compressed(self.collectives),
                                 lambda: tf.constant(True))
            # A dense step sends the residuals the plan's steps left (the first after them, or the first of all
            # where a restore may have brought some), and every other one sends the gradients as Horovod does: the
            # trial times that against the plan, not a dense step carrying the residuals' tf.conds (1.10x).
            index = tf.where(compressed, 0, tf.where(runtime.flush["all_dense"].read_value(), 1, 2))
            dense, sizes = plan.all_dense(), [int(g.shape.num_elements() or 0) for g in grads]
            out = tf.switch_case(index, [lambda: self._reduce(plan, grads, sources, runtime, "plan"),
                                         lambda: self._reduce(dense, grads, sources, runtime, "all_dense"),
                                         lambda: self._reduce_once(dense, grads, sources, sizes, flush=None)])
        self.state.step.assign_add(1)
        outputs = [_values(o) for o in out]
        bucket_ends = tf.stack([_bucket_end(plan, b, outputs) for b in plan.buckets]) if plan.buckets \
            else tf.zeros([0], tf.float64)
        runtime.timeline.record(ready, bucket_ends)
        if self.counters is not None:
            planned = {p for b in plan.buckets for p in b.positions}
            ended = tf.concat([bucket_ends, stamps([o for i, o in enumerate(outputs) if i not in planned])], 0)
            self.counters.finish(ready, ended, _dense_bytes(grads))
        return out

    def _reduce(self, plan, grads, sources, runtime, variant: str):
        """The reduced grads under `plan` (`variant`: "plan", or "all_dense" for a trial's all-dense
        twin). Where a dense bucket's tensor has error-feedback memory, its residual is sent (and
        cleared) only while `runtime.flush[variant]` is set: a residual is left after a restore and,
        for the dense twin, after each step of the plan's compressed buckets; once sent it stays
        zero, and later dense steps leave it alone. The flag selects only whether those residuals are
        added (one tf.cond over the dense buckets' accumulations) and cleared (one more): the
        reduction itself is built once. Where `runtime.residuals_sent`, none is read: the
        gradients go as Horovod's optimizer sends them (on 8 workers of this machine, the
        82-tensor model's step took 1.10x plain Horovod's with the flag's tf.conds, 1.01x without)."""
        sizes = [int(g.shape.num_elements() or 0) for g in grads]
        memory = self.state.memory if self.compressor.error_feedback and not runtime.residuals_sent else None
        with_residuals = memory is not None and any(
            memory.has(sources[i]) for b in plan.buckets if not b.strategy.compresses for i in b.positions)
        if plan.compressed:
            runtime.flush["all_dense"].assign(True)
        if not with_residuals:
            return self._reduce_once(plan, grads, sources, sizes, flush=None)
        flag = runtime.flush[variant]
        out = self._reduce_once(plan, grads, sources, sizes, flush=flag.read_value())
        # Automatic control dependencies order the assignment after every read of the flag above.
        with tf.control_dependencies([flag.assign(False)]):
            return [o if isinstance(o, tf.IndexedSlices) else tf.identity(o) for o in out]

    def _reduce_once(self, plan, grads, sources, sizes, flush):
        """`_reduce` with `flush`: None where no dense bucket's tensor has a residual, else a bool
        scalar tensor, set where the dense buckets' residuals are to be sent and cleared."""
        out = [None] * len(grads)
        compressed = plan.compressed
        planned = {p for b in plan.buckets for p in b.positions}
        memory_dense = self._dense_buckets_with_memory(plan, sources, sizes, flush)
        with_memory = {p for b in memory_dense for p in b.positions}
        # The dense buckets' tensors in the plan's order, then the tensors outside the plan.
        dense = [i for b in plan.buckets if not b.strategy.compresses for i in b.positions if i not in with_memory]
        dense += [i for i, g in enumerate(grads) if i not in planned and not isinstance(g, tf.IndexedSlices)]
        prescale, postscale = self._dense_factors()
        for i, g in enumerate(grads):
            if isinstance(g, tf.IndexedSlices):
                self._count_sent(tensor_bytes(g.values) + tensor_bytes(g.indices))
                out[i] = hvd.allreduce(g, op=self.op, prescale_factor=prescale, postscale_factor=postscale,
                                       process_set=self.process_set)
        for i, r in zip(dense, self._allreduce_dense([grads[i] for i in dense])):
            out[i] = r
        if compressed or memory_dense:
            self._place(compressed + memory_dense,
                        self._buckets_with_memory(compressed, memory_dense, grads, sources, sizes, out, flush),
                        grads, sizes, out)
        return out

    @staticmethod
    def _place(buckets, totals, grads, sizes, out) -> None:
        """Puts each bucket's reduced flat float32 total into `out`, split and shaped as `grads`."""
        for bucket, total in zip(buckets, totals):
            for i, part in zip(bucket.positions, _split(total, bucket, sizes)):
                out[i] = tf.cast(tf.reshape(part, tf.shape(grads[i])), grads[i].dtype)

    # -- dense -------------------------------------------------------------------------------------

    def _dense_buckets_with_memory(self, plan, sources, sizes, flush) -> tuple:
        """The tensors of the plan's dense buckets that go through error-feedback memory, as
        one-tensor buckets (so that their moments need no concatenated copy): under DGC momentum or
        Adam correction all of them, and unless `flush` is None also every other one whose tensor
        has a residual (to send it where the flag is set). `sizes`: elements of each gradient, by
        position."""
        if not self.compressor.error_feedback:
            return ()
        corrected, memory = bool(self.compressor.optimizer_state), self.state.memory
        return tuple(dataclasses.replace(b, positions=(i,), elements=sizes[i])
                     for b in plan.buckets if not b.strategy.compresses for i in b.positions
                     if corrected or (flush is not None and memory.has(sources[i])))

    def _dense_factors(self):
        if self.op == hvd.Average:
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _allreduce_dense(self, tensors):
        """The tensors reduced by one Horovod allreduce each, as Horovod's own optimizer sends
        them: each starts once it is ready, and Horovod's cycle fuses those ready together, so a
        dense bucket of the plan is a price, not a wait for its last tensor. (With one grouped
        allreduce per bucket, a plan whose re-plan merged the CNN's 22 tensors into one dense
        bucket stepped 1.27x plain Horovod's, unshaped at K = 2: research/notebook.md.)"""
        if not tensors:
            return []
        self._count_sent(self._dense_wire_bytes(tensors))
        prescale, postscale = self._dense_factors()
        compression = hvd.Compression.fp16 if isinstance(self.compressor, FP16) else hvd.Compression.none
        return [hvd.allreduce(t, op=self.op, prescale_factor=prescale, postscale_factor=postscale,
                              compression=compression, process_set=self.process_set) for t in tensors]

    # -- compressed --------------------------------------------------------------------------------

    def _buckets_with_memory(self, compressed, memory_dense, grads, sources, sizes, dense_results, flush):
        """The reduced flat float32 tensor of each compressed bucket, then of each one-tensor bucket
        of a dense bucket that goes through memory (`_dense_buckets_with_memory`, one allreduce
        each; their residuals added and cleared only where the bool scalar tensor `flush` is set,
        never where it is None), with their memory updated (all of it, or none where any reduced
        gradient is not finite)."""
        compressor = self.compressor
        buckets = compressed + memory_dense
        # Adam's bias corrections of this step, shared by every tensor.
        corrections = None if compressor.adam is None else ops.adam_bias_corrections(
            self.state.step + 1, *compressor.adam[:2])
        accumulated = [self._accumulate_bucket(b, grads, sources, corrections=corrections) for b in compressed]
        accumulated += self._accumulate_flushed(memory_dense, grads, sources, flush, corrections)
        sparse, dense = accumulated[:len(compressed)], accumulated[len(compressed):]
        # The dense buckets' residuals are left to `flushed`, cleared where `flush` is set.
        kept = [False] * len(compressed) + [True] * len(memory_dense)
        flushed = None if flush is None or not memory_dense else (flush, [
            self.state.memory.residual(sources[i], sizes[i], compressor.optimizer_state)
            for b in memory_dense for i in b.positions])
        # Uncorrected and all dense, the memory changes only where residuals are flushed.
        only_if = None if compressed or compressor.optimizer_state else flush

        def send_compressed():
            reduced, updates, finite = self._send_compressed(sparse, compressed) if compressed else ([], [], [])
            reduced_dense, updates_dense = self._send_dense(dense, kept[len(compressed):]) if dense \
                else ([], [])
            return self._with_memory_update(buckets, sources, sizes, reduced + reduced_dense, updates + updates_dense,
                                            dense_results, finite, flushed, only_if)

        if compressor.warmup_steps > 0 and compressed:
            def send_dense():
                return self._with_memory_update(buckets, sources, sizes, *self._send_dense(accumulated, kept),
                                                dense_results, flushed=flushed)

            return tf.cond(self.state.step < compressor.warmup_steps, send_dense, send_compressed)
        return send_compressed()

    def _accumulate_flushed(self, buckets, grads, sources, flush, corrections) -> list:
        """`_accumulate_bucket` of each of the dense buckets with memory `buckets`, their residuals
        added where the bool scalar tensor `flush` is set (one tf.cond for them all), never where it
        is None."""
        if flush is None or not buckets:
            return [self._accumulate_bucket(b, grads, sources, False, corrections) for b in buckets]

        def accumulate(with_residual: bool):
            return [(acc,) + (moments or ()) for acc, moments in
                    (self._accumulate_bucket(b, grads, sources, with_residual, corrections) for b in buckets)]

        rows = tf.cond(flush, lambda: accumulate(True), lambda: accumulate(False))
        return [(row[0], tuple(row[1:]) or None) for row in rows]

    def _with_memory_update(self, buckets, sources, sizes, reduced, updates, dense_results, finite=(), flushed=None,
                            only_if=None):
        """`reduced`, once the buckets' memory is updated: unless some reduced gradient (of the
        buckets, or of the floating-point `dense_results`) is not finite (a step a loss-scale
        optimizer skips), when the memory stays as it was. `finite`: whether each of the first
        reduced tensors is finite, where the payloads already tell (the compressed buckets: no
        pass over their dense results); the others are checked. `flushed`: None, or (bool scalar
        tensor, residual variables) to clear where it is set (sent by dense buckets). `only_if` (a
        bool scalar tensor, or None: always): the updates change nothing unless it is set, and
        neither they nor the check run then."""
        if not self.compressor.error_feedback:
            return reduced
        dense = [tf.convert_to_tensor(o) for o in dense_results if o is not None and o.dtype.is_floating]

        def all_finite():
            return tf.reduce_all(list(finite) + [_all_finite(list(reduced)[len(finite):] + dense)])

        def update_memory():
            assignments = [self._update_memory(b, sources, sizes, u) for b, u in zip(buckets, updates)]
            if flushed is not None:
                flag, residuals = flushed
                assignments.append(tf.cond(flag, lambda: tf.group(
                    [r.assign(tf.zeros_like(r), read_value=False) for r in residuals]), tf.no_op))
            return tf.group(assignments)

        update = all_finite() if only_if is None else tf.cond(only_if, all_finite, lambda: tf.constant(False))
        assigned = tf.cond(update, update_memory, tf.no_op)
        with tf.control_dependencies([assigned]):
            return [tf.identity(r) for r in reduced]

    def _accumulate_bucket(self, bucket, grads, sources, with_residual: bool = True, corrections=None):
        """(flat float32 gradients plus memory of the bucket's tensors, concatenated, or an
        `_Unsummed` gradient and residual where the compressor's kernels add them; their new
        optimizer moments, each concatenated, or None). Without `with_residual` the residuals
        (known to be zero) are not read. `corrections`: under Adam correction, this step's
        `ops.adam_bias_corrections`."""
        apart = self.compressor.fuses_residual and bucket.strategy.compresses and _GRAPHS[bucket.strategy].encodes
        parts = [self._accumulate(grads[i], sources[i], apart, with_residual, corrections) for i in bucket.positions]
        if all(isinstance(acc, _Unsummed) for acc, _ in parts):
            accumulated = _Unsummed([g for acc, _ in parts for g in acc.grads],
                                    [r for acc, _ in parts for r in acc.residuals])
        else:
            accumulated = _concat([acc for acc, _ in parts])
        moments = None if parts[0][1] is None else tuple(_concat(list(m)) for m in zip(*[m for _, m in parts]))
        return accumulated, moments

    def _accumulate(self, grad, source, apart: bool = False, with_residual: bool = True, corrections=None):
        """(flat float32 gradient plus memory of one tensor, its new optimizer moments or None):
        g + r (with `apart`, `_Unsummed([g], [r])` for the compressor's kernels to add); under DGC
        momentum correction r + u with u = mu u + g, moments (u,) (`ops.momentum_accumulate`, one
        pass); under Adam correction r + d with d = m^ / (sqrt(v^) + eps) of m = b1 m + (1 - b1) g
        and v = b2 v + (1 - b2) g^2, bias-corrected for the step t = communicating steps so far + 1
        (`corrections`), moments (m, v) (`ops.adam_accumulate`, one pass). Without `with_residual`, r (known to be
        zero) is left out; without error feedback, g (with `apart`, `_Unsummed([g], [])`, for the
        kernels to read the bucket's parts in place)."""
        compressor = self.compressor
        flat = tf.reshape(tf.cast(grad, tf.float32), [-1])
        if not compressor.error_feedback:
            return (_Unsummed([flat], []) if apart else flat), None
        size = int(flat.shape[0])
        memory = self.state.memory
        residual = memory.residual(source, size, compressor.optimizer_state)

        added = residual.value() if with_residual else None
        if compressor.adam is not None:
            beta_1, beta_2, epsilon = compressor.adam
            m, v, accumulated = ops.adam_accumulate(flat, memory.momentum(source, size),
                                                    memory.second_moment(source, size), None, beta_1, beta_2, epsilon,
                                                    residual=added, bias_corrections=corrections)
            return accumulated, (m, v)
        if compressor.momentum is None:
            if added is None:
                return flat, None
            return (_Unsummed([flat], [added]) if apart else added + flat), None
        momentum, accumulated = ops.momentum_accumulate(flat, memory.momentum(source, size), compressor.momentum,
                                                        residual=added)
        return accumulated, (momentum,)

    def _update_memory(self, bucket, sources, sizes, update):
        """The assignments of the bucket's new memory: each residual (and DGC momentum) becomes its
        part of `update`, with the sent elements then cleared in place by `ops.zero_at` (k writes,
        no dense copy of what was sent, and the variable stays out of TensorFlow's copy-on-read
        mode, in which every later read would copy it), or zero after a warm-up step; Adam's
        moments become theirs, nothing cleared."""
        memory = self.state.memory
        compressor = self.compressor
        residuals = [None] * len(bucket.positions) if update.residual is None else _split(update.residual, bucket, sizes)
        moments = [[None] * len(bucket.positions)] * compressor.optimizer_state if update.moments is None else [
            _split(m, bucket, sizes) for m in update.moments]
        assignments, offset = [], 0
        for n, i in enumerate(bucket.positions):
            residual = memory.residual(sources[i], sizes[i], compressor.optimizer_state)
            cleared, kept = ([] if update.residual_kept else [(residual, residuals[n])]), []
            if compressor.momentum is not None:
                cleared.append((memory.momentum(sources[i], sizes[i]), moments[0][n]))
            if compressor.adam is not None:
                kept = [(memory.momentum(sources[i], sizes[i]), moments[0][n]),
                        (memory.second_moment(sources[i], sizes[i]), moments[1][n])]
            assignments += [v.assign(x, read_value=False) for v, x in kept]
            if update.cleared is None:
                assignments += [v.assign(tf.zeros_like(v) if x is None else x) for v, x in cleared]
            else:
                # Slots that carried a zero sent nothing: their element keeps its memory.
                sent_values, sent_indices = update.cleared
                sent = tf.where(sent_values != 0, sent_indices, -1)
                for v, x in cleared:
                    with tf.control_dependencies([v.assign(x, read_value=False)]):
                        assignments.append(ops.zero_at(v, sent, offset))
            offset += sizes[i]
        return tf.group(assignments)

    @staticmethod
    def _memory_update(acc, moments, payload, after) -> _MemoryUpdate:
        """What error feedback keeps of one bucket. Where the payload is acc's own values at known
        indices, acc itself, to be cleared there later (DGC's momentum with it: factor masking);
        else (the quantisers) acc less the dense value sent, computed right `after` the encode so
        that acc's and the sent tensor's buffers are free before the decode. A quantiser's momentum
        and Adam's moments are kept as they are: a quantiser sends nearly every element, so factor
        masking would clear the momentum almost everywhere (IntQuant's CNN lost 4.2 points that
        way), while with the momentum kept the sum of what is sent follows momentum SGD."""
        if isinstance(payload.sent, tuple):
            return _MemoryUpdate(acc, moments, payload.sent)
        with tf.control_dependencies(after):
            remainder = tf.identity(acc) - payload.sent
        return _MemoryUpdate(remainder, moments, None)

    def _send_compressed(self, accumulated, buckets):
        """Encodes, exchanges and decodes the accumulated buckets, each by its strategy's graph
        (`_GRAPHS`).

        Returns (reduced buckets, [_MemoryUpdate] or [], whether each reduced bucket is finite).
        Buckets of one strategy share one grouped collective. A non-finite value anywhere in a
        bucket on any worker makes the bucket's reduced values NaN, as a dense allreduce would,
        even where the compressor did not send that value: each bucket's flag of such values
        rides along with its payload. For Average, the payloads' values are divided by K before
        the decode sums them (no pass over the dense result).
        """
        compressor = self.compressor
        groups = [(graph, [n for n, b in enumerate(buckets) if b.strategy == strategy])
                  for strategy, graph in _GRAPHS.items()]
        groups = [(graph, members) for graph, members in groups if members]
        agreed = [None] * len(buckets)
        for graph, members in groups:
            for n, value in zip(members, graph.agree(self, [accumulated[n][0] for n in members])):
                agreed[n] = value
        payloads, updates = [], []
        for position, ((acc, moments), bucket) in enumerate(zip(accumulated, buckets)):
            graph = _GRAPHS[bucket.strategy]
            payload, acc = graph.payload(self, acc, agreed[position], self.state.step * 65536 + position)
            shown = compressor.payload_shows_non_finite and graph.encodes
            non_finite = _any_non_finite([t for t in payload.wire if t.dtype.is_floating] if shown else [acc])
            payloads.append(payload._replace(wire=tuple(payload.wire) + (non_finite,)))
            if compressor.error_feedback:
                updates.append(self._memory_update(acc, moments, payload, [non_finite, *payload.wire]))
        received = [None] * len(buckets)
        for graph, members in groups:
            exchanged = graph.exchange(self, [payloads[n].wire for n in members],
                                       [int(accumulated[n][0].shape[0]) for n in members])
            for n, result in zip(members, exchanged):
                received[n] = result
        reduced, finite = [], []
        scale = 1.0 / self.collectives.size if self.op == hvd.Average else 1.0
        for n, ((acc, _), bucket, payload) in enumerate(zip(accumulated, buckets, payloads)):
            total, is_finite, cleared = _GRAPHS[bucket.strategy].decode(self, received[n], payload,
                                                                        int(acc.shape[0]), scale)
            if cleared is not None:
                updates[n] = updates[n]._replace(cleared=cleared)
            reduced.append(total)
            finite.append(is_finite)
        return reduced, updates, finite

    def _send_dense(self, accumulated, residual_kept):
        """Warm-up steps and dense buckets with memory: gradient (or its momentum u, or Adam's
        direction d), plus the residual where it was added, sent dense (`_allreduce_dense`); the
        residual is then empty (or, where `residual_kept` says it was not added, being zero, left
        alone), and the moments stay as computed (nothing masked: a dense send is momentum SGD, or
        Adam)."""
        reduced = self._allreduce_dense([_dense(acc) for acc, _ in accumulated])
        updates = []
        if self.compressor.error_feedback:
            updates = [_MemoryUpdate(None, moments, None, kept) for (_, moments), kept in zip(accumulated, residual_kept)]
        return reduced, updates


# -- the strategies' graphs --------------------------------------------------------------------------

class _CompressedGraph:
    """The graph of a compressing strategy (`tfcomp.strategies`, whose object prices it), registered
    under it in `_GRAPHS`: what the buckets of one exchange with it agree on before encoding, each
    bucket's payload, the group's collective, and each bucket's decode. Methods take the
    `StepGraph` that builds the step (its compressor, collectives, state and counters).

    `encodes`: the payload is the compressor's encode of the bucket (so a compressor that
    `fuses_residual` may read its parts apart, and one whose `payload_shows_non_finite` flags a
    non-finite value from the payload); False: the strategy makes its own payload."""

    encodes = True

    def agree(self, step: "StepGraph", accumulated: list) -> list:
        """What each of the group's accumulated buckets (float32 [n_i], or `_Unsummed`) is encoded
        with besides itself, agreed by all ranks (None each: nothing)."""
        return [None] * len(accumulated)

    def payload(self, step: "StepGraph", acc, agreed, seed) -> tuple:
        """(`_Payload`, the accumulated bucket as float32 [n]) of one bucket, encoded by the
        compressor with `seed` (int64 scalar; `agreed`: what `agree` gave it). Where the compressor
        adds the residual in its kernels, the sum they wrote is the accumulated bucket."""
        compressor = step.compressor
        worker = step.collectives.rank
        if isinstance(acc, _Unsummed) and not acc.residuals:
            encoded = compressor.encode(acc.grads, seed, worker)
        elif isinstance(acc, _Unsummed):
            encoded, acc = compressor.encode_sum(acc.grads, acc.residuals, seed, worker)
        elif agreed is not None:
            encoded = compressor.encode_scaled(acc, agreed, seed, worker, step.collectives.size)
        else:
            encoded = compressor.encode(acc, seed, worker)
        sent = None
        if compressor.error_feedback:
            pairs = compressor.sent_pairs(encoded)
            sent = tuple(pairs) if pairs else compressor.decode_local(encoded, int(acc.shape[0]))
        return _Payload(encoded.wire, encoded.context, sent), acc

    def exchange(self, step: "StepGraph", wires: list, sizes: list) -> list:
        """What each bucket receives from the group's one collective of `wires` (each bucket's wire
        tensors, its non-finite flag last; `sizes`: its elements)."""
        raise NotImplementedError

    def decode(self, step: "StepGraph", received, payload: _Payload, size: int, scale: float) -> tuple:
        """(reduced float32 [size], bool scalar: whether it is finite, the (values, indices) that
        error feedback clears instead of those this worker sent, or None) of one bucket: `scale`
        times the decoded sum of the workers' payloads, NaN where a worker flagged a non-finite
        value."""
        total = step.compressor.decode_sum(received[:-1], payload.context, size, step.collectives.size, scale)
        return _voided_where_flagged(received, total, size, step.collectives.size)


def _voided_where_flagged(received, total, size: int, num_workers: int) -> tuple:
    """`decode`'s result for a bucket whose wire tensors `received` end with the workers' summed or
    gathered non-finite flags: `total`, or NaN where a worker flagged (only then is a new tensor made)."""
    flagged = tf.reduce_sum(received[-1]) > 0
    reduced = tf.cond(flagged, lambda: tf.fill([size], float("nan")), lambda: total)
    return reduced, tf.logical_and(tf.logical_not(flagged), _sum_stays_finite(received[:-1], num_workers)), None


def _grouped(step: "StepGraph", wires: list, collective) -> list:
    """Each bucket's part of one `collective` (the collectives' allgather or allreduce_sum) of all
    the buckets' wire tensors."""
    flat = [t for wire in wires for t in wire]
    step._count_sent(tf.add_n([tensor_bytes(t) for t in flat]))
    exchanged, parts, start = collective(flat), [], 0
    for wire in wires:
        parts.append(tuple(exchanged[start:start + len(wire)]))
        start += len(wire)
    return parts


class _AllgatherGraph(_CompressedGraph):
    """Every worker's payload by one allgather, decoded together (`sparse_batched_decode` of all K
    payloads for the sparsifiers)."""

    def exchange(self, step, wires, sizes):
        return _grouped(step, wires, step.collectives.allgather)


class _SummedAllreduceGraph(_CompressedGraph):
    """Payloads that add up, summed by one allreduce; for a compressor that `agrees_scale`
    (IntQuant), encoded on the largest of all workers' `local_scale`, by one allgather of one
    float32 per bucket of the group."""

    def agree(self, step, accumulated):
        compressor = step.compressor
        if not compressor.agrees_scale:
            return super().agree(step, accumulated)
        local = tf.stack([compressor.local_scale(acc) for acc in accumulated])
        step._count_sent(tensor_bytes(local))
        gathered, = step.collectives.allgather([local])
        # Non-finite where some worker's bucket is; its flag then voids the sum.
        agreed = tf.reduce_max(tf.reshape(gathered, [step.collectives.size, len(accumulated)]), axis=0)
        return [agreed[i] for i in range(len(accumulated))]

    def exchange(self, step, wires, sizes):
        return _grouped(step, wires, step.collectives.allreduce_sum)


class _ArtopkGraph(_CompressedGraph):
    """AR-Topk (003 Algorithm 1): the owner's selected indices are broadcast, every worker sends
    its values at them, summed by one allreduce. Owner: round-robin over steps (STAR), or the
    worker whose accumulated gradient has the largest variance (VAR, ties to the lowest rank)."""

    encodes = False

    def payload(self, step, acc, agreed, seed):
        compressor, collectives = step.compressor, step.collectives
        worker, num_workers = collectives.rank, collectives.size
        _, own_indices = compressor.encode(acc, seed, worker).wire
        if compressor.artopk_owner == "var":
            variances, = collectives.allgather([tf.reshape(tf.math.reduce_variance(acc), [1])])
            owner = tf.cast(tf.argmax(variances), tf.int32)
        else:
            owner = tf.cast(step.state.step % num_workers, tf.int32)
        step._count_sent(tf.where(tf.equal(owner, worker), tensor_bytes(own_indices), tf.constant(0.0, tf.float64)))
        indices = tf.switch_case(owner, [
            functools.partial(collectives.broadcast, own_indices, root, f"tfcomp_artopk_indices_from_{root}")
            for root in range(num_workers)
        ])
        values = tf.where(indices >= 0, tf.gather(acc, tf.maximum(indices, 0)), 0.0)
        return _Payload((values,), indices, (values, indices) if compressor.error_feedback else None), acc

    def exchange(self, step, wires, sizes):
        return _grouped(step, wires, step.collectives.allreduce_sum)

    def decode(self, step, received, payload, size, scale):
        total = ops.sparse_batched_decode(scale_values(received[0], scale), payload.context, size)
        return _voided_where_flagged(received, total, size, step.collectives.size)


class _PartitionedGraph(_CompressedGraph):
    """The hash-partitioned sparse allreduce of the group's payloads ((values, indices, non-finite
    flag) of each bucket, joined in one index space, each bucket at the sum of the sizes before
    it): every worker's pairs go to the owner of their index (`ops.hash_partition`) by one
    alltoall; each owner sums its pairs per index and keeps at most its budget of sums, the largest
    in magnitude (`ops.sum_pairs`, `compressor.owner_budget`); one allgather shares the owners'
    sums, each with a row (index -1) carrying its worker's flag, NaN where set, so that every rank
    voids the buckets alike. Error feedback keeps the pairs an owner dropped."""

    def exchange(self, step, wires, sizes):
        """(`_Partitioned`, the bucket's offset in it) for each bucket."""
        num_workers = step.collectives.size
        offsets = [int(o) for o in np.cumsum([0] + list(sizes[:-1]))]
        if sum(sizes) > ops.MAX_LENGTH:
            raise ValueError(f"the partitioned buckets hold {sum(sizes)} elements together, more than the "
                             f"{ops.MAX_LENGTH} that int32 indices can name; force another strategy")
        values = _concat([w[0] for w in wires])
        indices = _concat([w[1] if o == 0 else tf.where(w[1] >= 0, w[1] + o, -1) for w, o in zip(wires, offsets)])
        flagged = tf.reduce_max(tf.concat([w[2] for w in wires], axis=0)) > 0
        rows, splits = ops.hash_partition(values, indices, num_workers)
        step._count_sent(tensor_bytes(rows))
        received, _ = step.collectives.alltoall(rows, splits)
        budget = step.compressor.owner_budget(sum(int(w[1].shape[0]) for w in wires), num_workers)
        flag = tf.bitcast(tf.where(flagged, float("nan"), 0.0), tf.int32)
        mine = tf.concat([ops.sum_pairs(received, None if budget is None else min(budget, ops.MAX_LENGTH)),
                          tf.reshape(tf.stack([tf.constant(-1, tf.int32), flag]), [1, 2])], axis=0)
        step._count_sent(tensor_bytes(mine))
        gathered, = step.collectives.allgather([mine])
        values = tf.bitcast(gathered[:, 1], tf.float32)
        joint = _Partitioned(gathered[:, 0], values, tf.reduce_any(tf.logical_not(tf.math.is_finite(values))))
        return [(joint, offset) for offset in offsets]

    def decode(self, step, received, payload, size, scale):
        joint, offset = received
        total = ops.sparse_batched_decode(scale_values(joint.values, scale), joint.local_indices(offset, size), size)
        cleared = None if payload.sent is None else _kept_by_owners(payload.sent, total)
        reduced = tf.cond(joint.flagged, lambda: tf.fill([size], float("nan")), lambda: total)
        return reduced, tf.logical_not(joint.flagged), cleared


# Each compressing strategy's graph, in the order the exchange runs the groups' collectives.
_GRAPHS = {st.PARTITIONED: _PartitionedGraph(), st.ALLGATHER: _AllgatherGraph(), st.ALLREDUCE: _SummedAllreduceGraph(),
           st.ARTOPK: _ArtopkGraph()}
