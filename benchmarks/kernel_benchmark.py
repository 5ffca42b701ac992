"""Kernel benchmark: wall time of tfcomp's ops against a memory-read floor and TensorFlow's top-k.

For every size d = 2^min_log2 ... 2^max_log2 float32 elements (a standard-normal gradient, made once
per size outside the timing) it times, in eager TensorFlow on the CPU:

  floor      tf.reduce_max(g): one vectorised Eigen pass reading g, the same thread count as the ops
  estimate   estimate_threshold(g, ratio=0.001, num_samples=65536)
  dragonn    dragonn_compress(g, threshold, num_slots), threshold from `estimate` computed beforehand,
             num_slots = k = max(1, round(0.001 * d))
  dgc        dgc_compress(g, threshold, max_out=k)
  topk_c     topk_compress(g, k)
  tf.top_k   tf.math.top_k(tf.abs(g), k), the framework's exact top-k
  decode K   sparse_batched_decode of K = 1, 4, 16, 64 concatenated DRAGONN payloads (one per seed)
  dense K    tf.add_n of K separate sparse_batched_decode calls, one per payload (K = 4, 16, 64);
             skipped ('-') where the K dense tensors exceed --dense_sum_max_gib (default 12 GiB, which
             drops only K = 64 at 2^26: its 16 GiB of dense decodes exhaust a 24 GiB machine)

Measurements are interleaved: every repeat runs each variant once, in an order rotated by one per
repeat, so machine noise hits all variants alike. Warm-up repeats are discarded; the table reports the
median over repeats in milliseconds, plus ratios: `x fl` is a time over the read floor, `tk/drg` is
topk_compress over dragonn, `K16/K1` is decode K=16 over K=1, `b/dense` is decode K=16 over dense K=16.
Eager CPU ops run synchronously, so the clock stops when the op has finished.

Run from the repository root, with the op library built:

  python -m benchmarks.kernel_benchmark [--min_log2=20] [--max_log2=26] [--repeats=15] [--warmup=2]
      [--intra_op_threads=0] [--dense_sum_max_gib=12] [--markdown_out=PATH]
"""

import statistics
import sys
import time

import numpy as np
import tensorflow as tf
from absl import app, flags

from benchmarks.tables import machine_header, markdown_table, text_table
from tfcomp import ops

__all__ = []

FLAGS = flags.FLAGS
flags.DEFINE_integer("min_log2", 20, "Smallest size, as log2 of the element count.")
flags.DEFINE_integer("max_log2", 26, "Largest size, as log2 of the element count.")
flags.DEFINE_integer("repeats", 15, "Measured repeats per size; the table shows their median.")
flags.DEFINE_integer("warmup", 2, "Discarded warm-up repeats per size.")
flags.DEFINE_integer("intra_op_threads", 0, "TensorFlow intra-op threads; 0 keeps TensorFlow's default.")
flags.DEFINE_float(
    "dense_sum_max_gib", 12.0, "Skip a dense-sum variant whose K dense decodes (K * d * 4 bytes) exceed this."
)
flags.DEFINE_string("markdown_out", None, "If set, also write the table as Markdown to this path.")

RATIO = 0.001
NUM_SAMPLES = 65536
DECODE_KS = (1, 4, 16, 64)
DENSE_KS = (4, 16, 64)


def _ms(key: str, digits: int):
    """Cell formatter: the median of variant `key` in ms, or '-' where it was skipped."""
    return lambda r: f"{r[key]:.{digits}f}" if key in r else "-"


def _ratio(num: str, den: str, digits: int):
    """Cell formatter: median of `num` over median of `den`, or '-' where either was skipped."""
    return lambda r: f"{r[num] / r[den]:.{digits}f}" if num in r and den in r else "-"


# (heading, width, cell(row) -> str); a row maps variant names to median milliseconds.
_COLUMNS = [
    ("log2 d", 6, lambda r: str(r["log2"])),
    ("floor", 7, _ms("floor", 2)),
    ("estimate", 8, _ms("estimate", 2)),
    ("x fl", 5, _ratio("estimate", "floor", 2)),
    ("dragonn", 7, _ms("dragonn", 2)),
    ("x fl", 5, _ratio("dragonn", "floor", 2)),
    ("dgc", 7, _ms("dgc", 2)),
    ("topk_c", 8, _ms("topk_c", 1)),
    ("tf.top_k", 8, _ms("tf.top_k", 1)),
    ("tk/drg", 6, _ratio("topk_c", "dragonn", 1)),
    *[(f"dec K{k}", 7, _ms(f"decode{k}", 2)) for k in DECODE_KS],
    *[(f"dense K{k}", 9, _ms(f"dense{k}", 1)) for k in DENSE_KS],
    ("K16/K1", 6, _ratio("decode16", "decode1", 2)),
    ("b/dense", 7, _ratio("decode16", "dense16", 3)),
]


def _variants(d: int, seed: int, dense_sum_max_bytes: float) -> dict:
    """The timed callables for size d, keyed by variant name; inputs are built here, untimed."""
    grad = tf.constant(np.random.default_rng(seed).standard_normal(d, dtype=np.float32))
    k = max(1, round(RATIO * d))
    threshold = ops.estimate_threshold(grad, RATIO, NUM_SAMPLES, seed)
    payloads = [ops.dragonn_compress(grad, threshold, k, s) for s in range(max(DECODE_KS))]
    variants = {
        "floor": lambda: tf.reduce_max(grad),
        "estimate": lambda: ops.estimate_threshold(grad, RATIO, NUM_SAMPLES, seed),
        "dragonn": lambda: ops.dragonn_compress(grad, threshold, k, seed),
        "dgc": lambda: ops.dgc_compress(grad, threshold, k),
        "topk_c": lambda: ops.topk_compress(grad, k),
        "tf.top_k": lambda: tf.math.top_k(tf.abs(grad), k),
    }
    for num in DECODE_KS:
        values = tf.concat([v for v, _ in payloads[:num]], 0)
        indices = tf.concat([i for _, i in payloads[:num]], 0)
        variants[f"decode{num}"] = lambda v=values, i=indices: ops.sparse_batched_decode(v, i, d)
    for num in (n for n in DENSE_KS if n * d * 4 <= dense_sum_max_bytes):
        variants[f"dense{num}"] = lambda p=payloads[:num]: tf.add_n(
            [ops.sparse_batched_decode(v, i, d) for v, i in p]
        )
    return variants


def _measure(variants: dict, repeats: int, warmup: int) -> dict:
    """Median milliseconds per variant over `repeats` interleaved rounds, after `warmup` rounds."""
    names = list(variants)
    times = {name: [] for name in names}
    for rep in range(warmup + repeats):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            result = variants[name]()
            elapsed = time.perf_counter() - start
            del result  # freed outside the timed region
            if rep >= warmup:
                times[name].append(elapsed * 1e3)
    return {name: statistics.median(ms) for name, ms in times.items()}


def main(argv):
    """Times all variants at every size, prints the table and optionally writes it as Markdown."""
    del argv
    if FLAGS.intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(FLAGS.intra_op_threads)
    header = machine_header()
    print(header, flush=True)
    rows = []
    for log2 in range(FLAGS.min_log2, FLAGS.max_log2 + 1):
        row = _measure(_variants(2**log2, log2, FLAGS.dense_sum_max_gib * 2**30), FLAGS.repeats, FLAGS.warmup)
        rows.append({"log2": log2, **row})
        print(f"measured d = 2^{log2}", file=sys.stderr, flush=True)
    print(
        f"Median ms over {FLAGS.repeats} interleaved repeats ({FLAGS.warmup} warm-up discarded); "
        f"'-': dense sum skipped, its K dense decodes exceed --dense_sum_max_gib={FLAGS.dense_sum_max_gib:g}."
    )
    print(text_table(_COLUMNS, rows))
    if FLAGS.markdown_out:
        with open(FLAGS.markdown_out, "w") as out:
            out.write(f"{header}; median ms over {FLAGS.repeats} repeats; '-': skipped\n\n{markdown_table(_COLUMNS, rows)}\n")


if __name__ == "__main__":
    app.run(main)
