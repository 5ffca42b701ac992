"""The compressed gradient exchange behind both entry points.

`GradientExchange` is what Horovod's Keras `DistributedOptimizer` calls as its "allreduce grads"
function once `tfcomp` is imported and a tfcomp compressor is given (see `tfcomp.horovod_glue`).
For a list of gradients it returns the list of reduced gradients, averaged or summed over the
process set as `op` says:

  * tensors the compressor handles (`compressor.compresses(size)`): add the error-feedback residual
    (or DGC momentum correction), encode, keep the remainder as the new residual, send the payloads
    in one grouped allgather (or one grouped allreduce for summable payloads), decode all K workers'
    payloads of a tensor at once (one `sparse_batched_decode` for the sparsifiers), divide by K for
    Average;
  * every other dense tensor: Horovod's grouped allreduce with its own prescale/postscale factors
    (fp16 on the wire for `tfcomp.FP16()`), i.e. exactly what plain Horovod does;
  * `tf.IndexedSlices` (embeddings) unless `sparse_as_dense`: Horovod's sparse allreduce (allgather).

The first `compressor.warmup_steps` communicating steps send the compressible tensors dense (with
their residuals, which are then cleared). Residuals are updated only when every reduced gradient is
finite, so a step that a loss-scale optimizer skips leaves them untouched. A step counter, saved with
the residuals, derives the per-step seeds, equal on all ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import horovod.tensorflow as hvd
import tensorflow as tf

from tfcomp.compressors import Compressor, FP16
from tfcomp.memory import ErrorFeedback

__all__ = ["GradientExchange", "TensorRecord"]


def _grouped_by_dtype(collective, tensors, **kwargs):
    """Runs a Horovod grouped collective (which needs one dtype per group) once per dtype, in order
    of first appearance, and returns the results in the order of `tensors`."""
    results = [None] * len(tensors)
    dtypes = list(dict.fromkeys(t.dtype for t in tensors))
    for dtype in dtypes:
        positions = [i for i, t in enumerate(tensors) if t.dtype == dtype]
        for i, r in zip(positions, collective([tensors[i] for i in positions], **kwargs)):
            results[i] = r
    return results


class _UntrackedFunction:
    """Holds the exchange's tf.function out of sight of object tracking: SavedModel export would
    otherwise retrace it in its own graph, where the variables it uses are stand-ins."""

    def __init__(self, function):
        self._function = function

    def __call__(self, *args):
        return self._function(*args)


@dataclass(frozen=True)
class TensorRecord:
    """How one gradient is exchanged: name, elements, strategy, bytes per worker per step
    (sent_bytes -1: depends on the step, as for IndexedSlices)."""

    name: str
    elements: int
    strategy: str
    dense_bytes: int
    sent_bytes: int


class GradientExchange(tf.Module):
    """Callable (grads, vars) -> reduced grads, with error feedback state tracked as a tf.Module.

    Args:
      compressor: a `tfcomp.Compressor`.
      op: `hvd.Average` or `hvd.Sum`.
      gradient_predivide_factor: as in Horovod; applies to the tensors sent dense (the compressed
        ones are summed in float32 by the decode and then divided by K).
      sparse_as_dense: convert `tf.IndexedSlices` gradients to dense tensors first.
      process_set: the Horovod process set to reduce over.
      name: name scope of the exchange's ops.
    """

    def __init__(self, compressor: Compressor, *, op=hvd.Average, gradient_predivide_factor: float = 1.0,
                 sparse_as_dense: bool = False, process_set=hvd.global_process_set, name: str = "tfcomp"):
        super().__init__(name=name.replace(">", "_"))
        if op not in (hvd.Average, hvd.Sum):
            raise ValueError(f"op must be hvd.Average or hvd.Sum for tfcomp compressors, got {op!r}")
        self.compressor = compressor
        self.op = op
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self.sparse_as_dense = bool(sparse_as_dense)
        self.process_set = process_set
        self.memory = ErrorFeedback()
        with tf.init_scope():
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="communication_step")
        self.records: tuple = ()
        self._graph_fn = _UntrackedFunction(tf.function(self._exchange, autograph=False))

    def __call__(self, grads, vars=None, use_generic_names=False):  # noqa: A002 (Horovod's signature)
        del use_generic_names
        grads = list(grads)
        if vars is None:
            raise ValueError("tfcomp's exchange needs the variables of the gradients (for error feedback)")
        if not self.process_set.included():
            return grads
        present = [i for i, g in enumerate(grads) if g is not None]
        grads_in = [self._densify(grads[i], vars[i]) for i in present]
        vars_in = [vars[i] for i in present]
        # Memory is created here, outside the exchange's tf.function, so that a variable whose
        # gradient first appears on a later call (a retrace) can still get its residual.
        for g, v in zip(grads_in, vars_in):
            if self._compresses(g) and self.compressor.error_feedback:
                self.memory.residual(v, g.shape.num_elements(), with_momentum=self.compressor.momentum is not None)
        reduced = self._graph_fn(grads_in, vars_in)
        out = list(grads)
        for i, r in zip(present, reduced):
            out[i] = r
        return out

    def _densify(self, grad, var):
        """With sparse_as_dense, IndexedSlices become dense tensors of the variable's static shape."""
        if self.sparse_as_dense and isinstance(grad, tf.IndexedSlices):
            return tf.reshape(tf.convert_to_tensor(grad), var.shape)
        return grad

    def _compresses(self, grad) -> bool:
        return (not isinstance(grad, tf.IndexedSlices) and grad.dtype.is_floating
                and self.compressor.compresses(grad.shape.num_elements()))

    # -- the graph ---------------------------------------------------------------------------------

    def _dense_factors(self):
        if self.op == hvd.Average:
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _allreduce_dense(self, tensors):
        if not tensors:
            return []
        prescale, postscale = self._dense_factors()
        return _grouped_by_dtype(
            hvd.grouped_allreduce, tensors, op=self.op, prescale_factor=prescale, postscale_factor=postscale,
            compression=hvd.Compression.fp16 if isinstance(self.compressor, FP16) else hvd.Compression.none,
            process_set=self.process_set,
        )

    def _record(self, grads, vars):  # noqa: A002
        """How each gradient will be exchanged (for describe())."""
        compressor = self.compressor
        records = []
        for i, (g, v) in enumerate(zip(grads, vars)):
            name = getattr(v, "name", f"grad_{i}")
            size = int(v.shape.num_elements())
            dense_bytes = g.dtype.size * size
            if isinstance(g, tf.IndexedSlices):
                records.append(TensorRecord(name, size, "sparse allgather", dense_bytes, -1))
            elif self._compresses(g):
                records.append(TensorRecord(name, size, f"{type(compressor).__name__} {compressor.collective}",
                                            dense_bytes, compressor.payload_bytes(size)))
            elif isinstance(compressor, FP16):
                records.append(TensorRecord(name, size, "fp16 allreduce", dense_bytes, 2 * size))
            else:
                records.append(TensorRecord(name, size, "allreduce", dense_bytes, dense_bytes))
        self.records = tuple(records)

    def _exchange(self, grads, vars):  # noqa: A002
        self._record(grads, vars)
        out = [None] * len(grads)
        compressed = [i for i, g in enumerate(grads) if self._compresses(g)]
        dense = [i for i, g in enumerate(grads) if i not in compressed and not isinstance(g, tf.IndexedSlices)]
        prescale, postscale = self._dense_factors()
        for i, g in enumerate(grads):
            if isinstance(g, tf.IndexedSlices):
                out[i] = hvd.allreduce(g, op=self.op, prescale_factor=prescale, postscale_factor=postscale,
                                       process_set=self.process_set)
        for i, r in zip(dense, self._allreduce_dense([grads[i] for i in dense])):
            out[i] = r
        if compressed:
            accumulated = [self._accumulate(grads[i], vars[i]) for i in compressed]
            if self.compressor.warmup_steps > 0:
                reduced, memory = tf.cond(self.step < self.compressor.warmup_steps,
                                          lambda: self._send_dense(accumulated),
                                          lambda: self._send_compressed(accumulated))
            else:
                reduced, memory = self._send_compressed(accumulated)
            if self.compressor.error_feedback:
                # A step whose reduced gradients are not all finite is one a loss-scale optimizer
                # skips: the memory stays as it was.
                finite = [tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(r)))
                          for r in list(reduced) + [o for o in out if o is not None]]
                keep = tf.logical_not(tf.reduce_all(finite))
                updates = []
                for i, (new_residual, new_momentum) in zip(compressed, memory):
                    updates += self._update_memory(vars[i], new_residual, new_momentum, keep)
                with tf.control_dependencies(updates):
                    reduced = [tf.identity(r) for r in reduced]
            for i, r in zip(compressed, reduced):
                out[i] = tf.cast(tf.reshape(r, tf.shape(grads[i])), grads[i].dtype)
        self.step.assign_add(1)
        return out

    def _accumulate(self, grad, var):
        """(flat float32 gradient plus memory, DGC momentum or None) of one compressed tensor."""
        compressor = self.compressor
        flat = tf.reshape(tf.cast(grad, tf.float32), [-1])
        if not compressor.error_feedback:
            return flat, None
        size = int(flat.shape[0])
        residual = self.memory.residual(var, size, with_momentum=compressor.momentum is not None)
        if compressor.momentum is None:
            return flat + residual, None
        momentum = compressor.momentum * self.memory.momentum(var, size) + flat
        return residual + momentum, momentum

    def _update_memory(self, var, new_residual, new_momentum, keep):
        """Assigns the new memory of `var` unless `keep` (a bool tensor) says to leave it."""
        size = int(new_residual.shape[0])
        residual = self.memory.residual(var, size, with_momentum=new_momentum is not None)
        updates = [residual.assign(tf.where(keep, residual, new_residual))]
        if new_momentum is not None:
            momentum = self.memory.momentum(var, size)
            updates.append(momentum.assign(tf.where(keep, momentum, new_momentum)))
        return updates

    def _send_compressed(self, accumulated):
        """Encodes, exchanges and decodes the accumulated tensors.

        Returns (reduced tensors, [(new residual, new momentum or None)] or []). A non-finite value
        anywhere in any worker's accumulated tensors makes every reduced tensor NaN, as a dense
        allreduce would, even where the compressor did not send that value; the count of such
        values rides along in the same grouped collective.
        """
        compressor = self.compressor
        num_workers = self.process_set.size()
        worker = self.process_set.rank()
        encoded, memory = [], []
        for position, (acc, momentum) in enumerate(accumulated):
            enc = compressor.encode(acc, self.step * 65536 + position, worker)
            encoded.append(enc)
            if compressor.error_feedback:
                sent = compressor.decode_local(enc, int(acc.shape[0]))
                new_momentum = None if momentum is None else tf.where(sent != 0, 0.0, momentum)
                memory.append((acc - sent, new_momentum))
        non_finite = tf.reshape(tf.add_n([tf.reduce_sum(tf.cast(~tf.math.is_finite(acc), tf.float32))
                                          for acc, _ in accumulated]), [1])
        wires = [t for enc in encoded for t in enc.wire] + [non_finite]
        if compressor.collective == "allreduce":
            exchanged = _grouped_by_dtype(hvd.grouped_allreduce, wires, op=hvd.Sum, process_set=self.process_set)
        else:
            exchanged = _grouped_by_dtype(hvd.grouped_allgather, wires, process_set=self.process_set)
        any_non_finite = tf.reduce_sum(exchanged[-1]) > 0
        reduced, start = [], 0
        for enc, (acc, _) in zip(encoded, accumulated):
            received = tuple(exchanged[start:start + len(enc.wire)])
            start += len(enc.wire)
            total = compressor.decode_sum(received, enc.context, int(acc.shape[0]), num_workers)
            total = total / num_workers if self.op == hvd.Average else total
            reduced.append(tf.where(any_non_finite, float("nan"), total))
        return reduced, memory

    def _send_dense(self, accumulated):
        """Warm-up: gradient plus residual sent dense; the memory is then empty."""
        reduced = list(self._allreduce_dense([acc for acc, _ in accumulated]))
        memory = []
        if self.compressor.error_feedback:
            memory = [(tf.zeros_like(acc), None if momentum is None else tf.zeros_like(acc))
                      for acc, momentum in accumulated]
        return reduced, memory

    def bytes_per_step(self) -> tuple:
        """(dense bytes, sent bytes) one worker exchanges per step, over the tensors whose payload
        size is fixed (IndexedSlices are left out)."""
        known = [r for r in self.records if r.sent_bytes >= 0]
        return sum(r.dense_bytes for r in known), sum(r.sent_bytes for r in known)

    def compressed_tensors(self) -> list:
        """Names of the tensors the compressor encodes."""
        return [r.name for r in self.records if r.strategy.startswith(type(self.compressor).__name__)]

    def describe(self) -> str:
        """A table of how each gradient is exchanged and the bytes sent per step against dense."""
        if not self.records:
            return "tfcomp: no gradients exchanged yet"
        lines = [f"{'tensor':40s} {'elements':>10s} {'strategy':>22s} {'dense B':>10s} {'sent B':>10s}"]
        for r in self.records:
            sent_text = "varies" if r.sent_bytes < 0 else str(r.sent_bytes)
            lines.append(f"{r.name[:40]:40s} {r.elements:10d} {r.strategy:>22s} {r.dense_bytes:10d} {sent_text:>10s}")
        dense, sent = self.bytes_per_step()
        lines.append(f"{'total':40s} {'':10s} {'':22s} {dense:10d} {sent:10d}  ({sent / max(dense, 1):.2%} of dense)")
        return "\n".join(lines)
