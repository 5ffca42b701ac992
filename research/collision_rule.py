"""Which element should keep a DRAGONN slot when several selected elements hash to it?

004's Lemma A.5 analyses "the largest index wins" (the last write of a sequential loop). tfcomp's
kernels keep the element of largest magnitude instead (ties: the larger index), which is as cheap
(the slot holds one 64-bit word, magnitude first) and sends more of the gradient. This script
measures that: for gradients of several shapes of distribution it compresses with
`dragonn_compress` (largest magnitude) and evaluates the largest-index rule on the very same
hash function (tests/numpy_reference.slot_hash, the documented hash), then reports the fraction of
the selected elements' squared L2 norm that reaches the payload under each rule.

  python -m research.collision_rule [--size=1048576] [--ratio=0.001] [--slots_per_selected=1] [--seeds=10]
"""

import numpy as np
import tensorflow as tf
from absl import app, flags

from tests import numpy_reference as ref
from tfcomp import ops

__all__ = []

FLAGS = flags.FLAGS
flags.DEFINE_integer("size", 1 << 20, "Gradient elements.")
flags.DEFINE_float("ratio", 0.001, "Fraction of elements selected by the threshold.")
flags.DEFINE_float("slots_per_selected", 1.0, "num_slots over the number of selected elements.")
flags.DEFINE_integer("seeds", 10, "Hash seeds (and gradients) averaged over.")
flags.DEFINE_string("markdown_out", None, "If set, also write the table as Markdown to this path.")

DISTRIBUTIONS = {
    "gaussian": lambda rng, n: rng.standard_normal(n),
    "laplace": lambda rng, n: rng.laplace(size=n),
    "student-t (3 dof)": lambda rng, n: rng.standard_t(3, n),
    "1% outliers x30": lambda rng, n: rng.standard_normal(n) * np.where(rng.random(n) < 0.01, 30.0, 1.0),
}


def largest_index_energy(g: np.ndarray, threshold: float, num_slots: int, seed: int) -> float:
    """Squared norm kept when, per slot, the selected element with the largest index wins."""
    chosen = np.flatnonzero(np.abs(g) >= threshold)
    slots = ref.slot_hash(chosen, seed, num_slots)
    winner = np.full(num_slots, -1, dtype=np.int64)
    np.maximum.at(winner, slots, chosen)
    kept = winner[winner >= 0]
    return float(np.sum(g[kept].astype(np.float64) ** 2))


def main(argv):
    del argv
    rows = []
    for name, draw in DISTRIBUTIONS.items():
        magnitude_rule, index_rule = [], []
        for seed in range(FLAGS.seeds):
            g = draw(np.random.default_rng(seed), FLAGS.size).astype(np.float32)
            threshold = float(np.quantile(np.abs(g), 1 - FLAGS.ratio))
            selected_energy = float(np.sum(g[np.abs(g) >= threshold].astype(np.float64) ** 2))
            num_slots = max(1, round(FLAGS.slots_per_selected * np.count_nonzero(np.abs(g) >= threshold)))
            values, _ = ops.dragonn_compress(g, threshold, num_slots, seed)
            magnitude_rule.append(float(tf.reduce_sum(tf.cast(values, tf.float64) ** 2)) / selected_energy)
            index_rule.append(largest_index_energy(g, threshold, num_slots, seed) / selected_energy)
        rows.append((name, np.mean(magnitude_rule), np.mean(index_rule)))
    header = ("distribution", "largest magnitude", "largest index", "gain")
    lines = [f"| {' | '.join(header)} |", "|---|---:|---:|---:|"]
    lines += [f"| {n} | {m:.3f} | {i:.3f} | {m / i:.3f}x |" for n, m, i in rows]
    caption = (
        f"Fraction of the selected elements' squared norm sent, d = {FLAGS.size}, ratio {FLAGS.ratio}, "
        f"{FLAGS.slots_per_selected:g} slot(s) per selected element, mean of {FLAGS.seeds} seeds"
    )
    print(caption)
    print("\n".join(lines))
    if FLAGS.markdown_out:
        with open(FLAGS.markdown_out, "w") as out:
            out.write(caption + "\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    app.run(main)
