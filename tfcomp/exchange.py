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


@dataclass(frozen=True)
class TensorRecord:
    """How one gradient is exchanged: name, elements, strategy, bytes per worker per step."""

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
        self._graph_fn = tf.function(self._exchange, autograph=False)

    def __call__(self, grads, vars=None, use_generic_names=False):  # noqa: A002 (Horovod's signature)
        del use_generic_names
        grads = list(grads)
        if vars is None:
            raise ValueError("tfcomp's exchange needs the variables of the gradients (for error feedback)")
        if not self.process_set.included():
            return grads
        present = [i for i, g in enumerate(grads) if g is not None]
        reduced = self._graph_fn([grads[i] for i in present], [vars[i] for i in present])
        out = list(grads)
        for i, r in zip(present, reduced):
            out[i] = r
        return out

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

    def _exchange(self, grads, vars):  # noqa: A002
        compressor = self.compressor
        if self.sparse_as_dense:  # the variable's static shape survives the conversion
            grads = [tf.reshape(tf.convert_to_tensor(g), v.shape) if isinstance(g, tf.IndexedSlices) else g
                     for g, v in zip(grads, vars)]
        out = [None] * len(grads)
        records = []
        dense, compressed = [], []
        for i, (g, v) in enumerate(zip(grads, vars)):
            name = getattr(v, "name", f"grad_{i}")
            if isinstance(g, tf.IndexedSlices):
                prescale, postscale = self._dense_factors()
                out[i] = hvd.allreduce(g, op=self.op, prescale_factor=prescale, postscale_factor=postscale,
                                       process_set=self.process_set)
                records.append(TensorRecord(name, int(g.values.shape.num_elements() or 0), "sparse allgather", 0, 0))
                continue
            size = int(g.shape.num_elements())
            if compressor.compresses(size) and g.dtype.is_floating:
                compressed.append(i)
                strategy = f"{type(compressor).__name__} {compressor.collective}"
                sent = compressor.payload_bytes(size)
            else:
                dense.append(i)
                strategy = "fp16 allreduce" if isinstance(compressor, FP16) else "allreduce"
                sent = (2 if isinstance(compressor, FP16) else g.dtype.size) * size
            records.append(TensorRecord(name, size, strategy, g.dtype.size * size, sent))
        self.records = tuple(records)

        for i, r in zip(dense, self._allreduce_dense([grads[i] for i in dense])):
            out[i] = r
        if compressed:
            warm = compressor.warmup_steps > 0
            reduced = (
                tf.cond(self.step < compressor.warmup_steps,
                        lambda: self._send_dense_with_residuals(grads, vars, compressed),
                        lambda: self._send_compressed(grads, vars, compressed))
                if warm else self._send_compressed(grads, vars, compressed)
            )
            for i, r in zip(compressed, reduced):
                out[i] = tf.cast(tf.reshape(r, tf.shape(grads[i])), grads[i].dtype)
        self.step.assign_add(1)
        return out

    def _accumulate(self, grad, var):
        """Flat float32 gradient plus memory; returns (accumulated, momentum or None)."""
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

    def _update_memory(self, var, size, new_residual, new_momentum, keep):
        """Assigns the new memory of `var` unless `keep` (a bool tensor) says to leave it."""
        residual = self.memory.residual(var, size, with_momentum=new_momentum is not None)
        updates = [residual.assign(tf.where(keep, residual, new_residual))]
        if new_momentum is not None:
            momentum = self.memory.momentum(var, size)
            updates.append(momentum.assign(tf.where(keep, momentum, new_momentum)))
        return updates

    def _send_compressed(self, grads, vars, indices):  # noqa: A002
        compressor = self.compressor
        num_workers = self.process_set.size()
        worker = self.process_set.rank()
        accumulated, encoded, memory = [], [], []
        for position, i in enumerate(indices):
            acc, momentum = self._accumulate(grads[i], vars[i])
            seed = self.step * 65536 + position
            enc = compressor.encode(acc, seed, worker)
            accumulated.append(acc)
            encoded.append(enc)
            if compressor.error_feedback:
                sent = compressor.decode_local(enc, int(acc.shape[0]))
                new_momentum = None if momentum is None else tf.where(sent != 0, 0.0, momentum)
                memory.append((acc - sent, new_momentum))
        wires = [list(enc.wire) for enc in encoded]
        flat_wires = [t for wire in wires for t in wire]
        if compressor.collective == "allreduce":
            exchanged = _grouped_by_dtype(hvd.grouped_allreduce, flat_wires, op=hvd.Sum, process_set=self.process_set)
        else:
            exchanged = _grouped_by_dtype(hvd.grouped_allgather, flat_wires, process_set=self.process_set)
        reduced, start = [], 0
        for enc, acc, wire in zip(encoded, accumulated, wires):
            received = tuple(exchanged[start:start + len(wire)])
            start += len(wire)
            total = compressor.decode_sum(received, enc.context, int(acc.shape[0]), num_workers)
            reduced.append(total / num_workers if self.op == hvd.Average else total)
        if compressor.error_feedback:
            keep = tf.logical_not(tf.reduce_all([tf.reduce_all(tf.math.is_finite(r)) for r in reduced]))
            updates = []
            for i, acc, (new_residual, new_momentum) in zip(indices, accumulated, memory):
                updates += self._update_memory(vars[i], int(acc.shape[0]), new_residual, new_momentum, keep)
            with tf.control_dependencies(updates):
                reduced = [tf.identity(r) for r in reduced]
        return reduced

    def _send_dense_with_residuals(self, grads, vars, indices):  # noqa: A002
        """Warm-up: send gradient plus residual dense; the residual is then empty."""
        accumulated = [self._accumulate(grads[i], vars[i]) for i in indices]
        reduced = self._allreduce_dense([acc for acc, _ in accumulated])
        if self.compressor.error_feedback:
            keep = tf.logical_not(tf.reduce_all([tf.reduce_all(tf.math.is_finite(r)) for r in reduced]))
            updates = []
            for i, (acc, momentum) in zip(indices, accumulated):
                zeros = tf.zeros_like(acc)
                updates += self._update_memory(vars[i], int(acc.shape[0]), zeros,
                                               None if momentum is None else zeros, keep)
            with tf.control_dependencies(updates):
                reduced = [tf.identity(r) for r in reduced]
        return list(reduced)

    def describe(self) -> str:
        """A table of how each gradient is exchanged and the bytes sent per step against dense."""
        if not self.records:
            return "tfcomp: no gradients exchanged yet"
        lines = [f"{'tensor':40s} {'elements':>10s} {'strategy':>22s} {'dense B':>10s} {'sent B':>10s}"]
        for r in self.records:
            lines.append(f"{r.name[:40]:40s} {r.elements:10d} {r.strategy:>22s} {r.dense_bytes:10d} {r.sent_bytes:10d}")
        dense = sum(r.dense_bytes for r in self.records)
        sent = sum(r.sent_bytes for r in self.records)
        lines.append(f"{'total':40s} {'':10s} {'':22s} {dense:10d} {sent:10d}  ({sent / max(dense, 1):.2%} of dense)")
        return "\n".join(lines)
