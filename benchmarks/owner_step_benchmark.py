"""Owner-step benchmark: the hash-partitioned sparse allreduce's owner step, `ops.sum_pairs`
against the TensorFlow ops it replaced (unique, unsorted_segment_sum, top_k by magnitude, two
gathers), one thread, on the rows one owner receives.

For each gradient of d float32 elements and K workers: every worker selects k = ratio * d indices,
a fraction --shared of them common to all workers (the largest elements overlap) and the rest its
own, with standard-normal values; the rows owner 0 receives are every worker's pairs that
`ops.hash_partition` gives it, in rank order (as Horovod's alltoall delivers them). The owner keeps
ceil(k / K) sums (union_limit 1, the default). Both variants are tf.functions, timed interleaved in
a shuffled order (`benchmarks.timing.shuffled_medians`); the table gives median milliseconds, their
ratio, and the rows and distinct indices of owner 0. The kept sums of both are checked equal.

  python -m benchmarks.owner_step_benchmark [--sizes=1048576,4194304,16777216] [--workers=4,8]
      [--ratio=0.01] [--shared=0.3] [--repeats=41] [--warmup=5] [--markdown_out=PATH]
"""

import math

import numpy as np
import tensorflow as tf
from absl import app, flags

from benchmarks.tables import machine_header, print_table
from benchmarks.timing import shuffled_medians
from tfcomp import ops

__all__ = []

FLAGS = flags.FLAGS
flags.DEFINE_list("sizes", ["1048576", "4194304", "16777216"], "Gradient sizes d (elements).")
flags.DEFINE_list("workers", ["4", "8"], "Worker counts K.")
flags.DEFINE_float("ratio", 0.01, "Each worker's k = ratio * d.")
flags.DEFINE_float("shared", 0.3, "Fraction of each worker's indices common to all workers.")
flags.DEFINE_integer("repeats", 41, "Measured rounds.")
flags.DEFINE_integer("warmup", 5, "Discarded rounds.")
flags.DEFINE_string("markdown_out", None, "Also write the table as Markdown here.")

_COLUMNS = [
    ("d", 10, lambda r: str(r["d"])),
    ("K", 3, lambda r: str(r["K"])),
    ("rows", 8, lambda r: str(r["rows"])),
    ("distinct", 8, lambda r: str(r["distinct"])),
    ("kept", 6, lambda r: str(r["kept"])),
    ("tf ops ms", 9, lambda r: f"{r['tf_ops']:.3f}"),
    ("sum_pairs ms", 12, lambda r: f"{r['sum_pairs']:.3f}"),
    ("tf/sum_pairs", 12, lambda r: f"{r['tf_ops'] / r['sum_pairs']:.2f}x"),
]


def owner_rows(rng, d: int, workers: int, k: int, shared: float) -> np.ndarray:
    """int32 [n, 2]: the rows owner 0 receives from `workers` workers of k pairs each."""
    common = rng.choice(d, size=int(shared * k), replace=False)
    received = []
    for _ in range(workers):
        own = rng.choice(d, size=k - common.size, replace=False)
        indices = np.unique(np.concatenate([common, own]))[:k].astype(np.int32)
        values = rng.standard_normal(indices.size).astype(np.float32)
        rows, splits = ops.hash_partition(values, indices, workers)
        received.append(rows.numpy()[:int(splits.numpy()[0])])
    return np.concatenate(received)


@tf.function
def tensorflow_ops(rows, budget):
    owned, position = tf.unique(rows[:, 0])
    sums = tf.math.unsorted_segment_sum(tf.bitcast(rows[:, 1], tf.float32), position, tf.size(owned))
    magnitude = tf.where(tf.math.is_nan(sums), float("inf"), tf.abs(sums))
    largest = tf.math.top_k(magnitude, tf.minimum(budget, tf.size(sums)), sorted=False).indices
    return tf.stack([tf.gather(owned, largest), tf.bitcast(tf.gather(sums, largest), tf.int32)], axis=1)


def main(argv):
    del argv
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    header = machine_header()
    rng = np.random.default_rng(0)
    results = []
    for d in (int(s) for s in FLAGS.sizes):
        for workers in (int(w) for w in FLAGS.workers):
            k = max(1, round(FLAGS.ratio * d))
            rows = tf.constant(owner_rows(rng, d, workers, k, FLAGS.shared))
            budget = math.ceil(k / workers)
            fused = tf.function(lambda r, b=budget: ops.sum_pairs(r, b))
            expected = tensorflow_ops(rows, budget).numpy()
            got = fused(rows).numpy()
            np.testing.assert_array_equal(got, expected[np.argsort(expected[:, 0])])
            medians = shuffled_medians({"tf_ops": lambda: tensorflow_ops(rows, budget), "sum_pairs": lambda: fused(rows)},
                                       FLAGS.repeats, FLAGS.warmup)
            results.append({"d": d, "K": workers, "rows": int(rows.shape[0]),
                            "distinct": int(np.unique(rows.numpy()[:, 0]).size), "kept": int(got.shape[0]), **medians})
    print_table(f"{header}; median ms over {FLAGS.repeats} shuffled rounds ({FLAGS.warmup} warm-up), one thread, "
                f"ratio {FLAGS.ratio:g}, shared {FLAGS.shared:g}, owner budget ceil(k / K)", _COLUMNS, results,
                FLAGS.markdown_out)


if __name__ == "__main__":
    app.run(main)
