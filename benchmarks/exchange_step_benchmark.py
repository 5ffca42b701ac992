"""Exchange-step benchmark: a whole compressed exchange step against its kernels and memory passes.

    python -m benchmarks.exchange_step_benchmark [--rows=512] [--cols=16384] [--workers=2]
        [--compressors=dragonn_0.001,dgc_0.001] [--tensors=1] [--correction=none] [--repeats=25] [--warmup=3]
        [--markdown_out=PATH]

One process, one TensorFlow thread (intra- and inter-op), float32 gradient of [rows, cols] (default
8.4 M elements), K = --workers simulated by `tfcomp.collectives.LocalCollectives` (the allgather
returns this worker's payload K times, so nothing is sent and the figures are the exchange's own
work). --correction=momentum or adam gives the compressors DGC's momentum correction (0.9) or the
Adam correction (0.9, 0.999, 1e-7), whose accumulation replaces the plain residual's. With --tensors=N the gradient is N tensors (blocks of rows) in one bucket, as MergeComp makes
them: DRAGONN's kernels then read the N tensors in place, the others encode a concatenated copy.
For each compressor configuration it times, each as one tf.function returning a scalar (so no
result is copied out):

  read       tf.reduce_max(g): one read pass over the gradient
  add        g + 1: one pass that reads it and writes a new tensor
  kernels    the compressor's kernels alone: threshold estimate and compress of g, and the batched
             decode of K payloads (DRAGONN and DGC)
  step       one exchange step of `tfcomp.step.StepGraph` with error feedback: residual added,
             encode, the flag of non-finite values, the collective, decode of the K payloads
             averaged, the finiteness check, the residual kept and its sent elements cleared
             (DRAGONN adds the residual inside its encode's pass: `Compressor.fuses_residual`)
  add-first  the same step with the residual added by a pass before the encode (as before the
             fusion, and as the other compressors do; with --tensors > 1 the sums concatenated)
  step noEF  the same without error feedback

interleaved round by round, in an order shuffled every round (medians over --repeats after
--warmup), and prints step / kernels and step / add.
"""

import functools

import numpy as np
import tensorflow as tf
from absl import app, flags

from benchmarks.tables import machine_header, print_table
from benchmarks.timing import shuffled_medians

__all__ = []

FLAGS = flags.FLAGS
flags.DEFINE_integer("rows", 512, "Gradient rows.")
flags.DEFINE_integer("cols", 16384, "Gradient columns.")
flags.DEFINE_integer("workers", 2, "K, simulated (LocalCollectives).")
flags.DEFINE_list("compressors", ["dragonn_0.001", "dgc_0.001"], "<dragonn|dgc>_<ratio> configurations.")
flags.DEFINE_integer("tensors", 1, "The gradient as this many tensors (blocks of rows) in one bucket.")
flags.DEFINE_enum("correction", "none", ["none", "momentum", "adam"], "The compressors' optimizer correction.")
flags.DEFINE_integer("repeats", 25, "Measured rounds.")
flags.DEFINE_integer("warmup", 3, "Discarded rounds.")
flags.DEFINE_string("markdown_out", None, "Also write the table as Markdown here.")

_COLUMNS = [
    ("compressor", 14, lambda r: r["name"]),
    ("read ms", 8, lambda r: f"{r['read']:.2f}"),
    ("add ms", 7, lambda r: f"{r['add']:.2f}"),
    ("kernels ms", 10, lambda r: f"{r['kernels']:.2f}"),
    ("step ms", 8, lambda r: f"{r['step']:.2f}"),
    ("add-first ms", 12, lambda r: f"{r['step_adding_first']:.2f}"),
    ("noEF ms", 8, lambda r: f"{r['step_no_ef']:.2f}"),
    ("step/kernels", 12, lambda r: f"{r['step'] / r['kernels']:.2f}"),
    ("step/add", 8, lambda r: f"{r['step'] / r['add']:.2f}"),
]


def _compressor(config: str, error_feedback: bool, adding_first: bool = False):
    import tfcomp

    name, _, ratio = config.partition("_")
    classes = {"dragonn": tfcomp.DRAGONN, "dgc": tfcomp.DGC}
    if name not in classes or not ratio:
        raise ValueError(f"--compressors: {config!r} is not <dragonn|dgc>_<ratio>")
    corrections = {"none": {}, "momentum": {"momentum": 0.9}, "adam": {"adam": (0.9, 0.999, 1e-7)}}
    compressor = classes[name](float(ratio), error_feedback=error_feedback,
                               **(corrections[FLAGS.correction] if error_feedback else {}))
    if adding_first:
        compressor.fuses_residual = False  # the exchange then adds gradient and residual first
    return compressor


def _step_function(compressor, grads, workers: int):
    """A tf.function running one exchange step of `grads` (one compressed allgather bucket)."""
    from tfcomp.collectives import LocalCollectives
    from tfcomp.cost_model import ClusterModel, StrategyTime
    from tfcomp.memory import ExchangeState
    from tfcomp.planning import Bucket, Plan
    from tfcomp.step import StepGraph

    size = sum(int(np.prod(g.shape)) for g in grads)
    variables = [tf.Variable(tf.zeros(g.shape)) for g in grads]
    plan = Plan((Bucket(tuple(range(len(grads))), size, "allgather", StrategyTime(0.0, 0.0), 0.0),),
                {i: f"gradient_{i}" for i in range(len(grads))}, compressor, ClusterModel.unpriced(workers),
                sizes={i: int(np.prod(g.shape)) for i, g in enumerate(grads)})
    step = StepGraph(compressor, ExchangeState(), LocalCollectives(workers))
    runtime = step.create_state(plan, grads, variables)
    return tf.function(lambda *g: tf.reshape(step(plan, list(g), variables, runtime)[0], [-1])[0], autograph=False)


def _kernels_function(compressor, flat, workers: int):
    """A tf.function of the compressor's kernels alone: encode, and the decode of K payloads."""
    from tfcomp import ops

    def kernels():
        values, indices = compressor.encode(flat, tf.constant(7, tf.int64), 0).wire
        return ops.sparse_batched_decode(tf.concat([values] * workers, 0), tf.concat([indices] * workers, 0),
                                         int(flat.shape[0]))[0]

    return tf.function(kernels, autograph=False)


def _measure(config: str, grad) -> dict:
    flat = tf.reshape(grad, [-1])
    grads = tf.split(grad, FLAGS.tensors, axis=0)
    runs = {
        "read": tf.function(lambda: tf.reduce_max(flat), autograph=False),
        "add": tf.function(lambda: (flat + 1.0)[0], autograph=False),
        "kernels": _kernels_function(_compressor(config, True), flat, FLAGS.workers),
        "step": _step_function(_compressor(config, True), grads, FLAGS.workers),
        "step_adding_first": _step_function(_compressor(config, True, adding_first=True), grads, FLAGS.workers),
        "step_no_ef": _step_function(_compressor(config, False), grads, FLAGS.workers),
    }
    for name in ("step", "step_adding_first", "step_no_ef"):
        runs[name] = functools.partial(runs[name], *grads)
    return {"name": config, **shuffled_medians(runs, FLAGS.repeats, FLAGS.warmup)}


def main(argv):
    del argv
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    if FLAGS.tensors < 1 or FLAGS.rows % FLAGS.tensors:
        raise app.UsageError(f"--tensors must divide --rows ({FLAGS.rows}), got {FLAGS.tensors}")
    grad = tf.constant(np.random.default_rng(0).standard_normal((FLAGS.rows, FLAGS.cols), dtype=np.float32))
    rows = [_measure(config, grad) for config in FLAGS.compressors]
    header = (f"{machine_header()}; one inter-op thread; gradient {FLAGS.rows}x{FLAGS.cols} float32 "
              f"in {FLAGS.tensors} tensor(s) of one bucket, correction {FLAGS.correction}, "
              f"K = {FLAGS.workers} (LocalCollectives); median ms of {FLAGS.repeats} interleaved rounds")
    print_table(header, _COLUMNS, rows, FLAGS.markdown_out)


if __name__ == "__main__":
    app.run(main)
