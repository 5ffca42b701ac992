"""Compress one real Keras gradient with each tfcomp op and decode K workers' payloads at once.

    python examples/compress_a_gradient.py --ratio=0.01 --workers=4

Later issues add the Horovod training example; this one shows the op library on its own.
"""

import numpy as np
import tensorflow as tf
from absl import app, flags

from tfcomp import ops

FLAGS = flags.FLAGS
flags.DEFINE_float("ratio", 0.01, "Fraction of gradient elements to send.")
flags.DEFINE_integer("workers", 4, "Number of simulated workers whose payloads are decoded together.")
flags.DEFINE_integer("seed", 0, "Seed of the model, the data and the hash functions.")


def dense_layer_gradient(seed: int) -> tf.Tensor:
    """The gradient of a small MLP's first kernel on random data: float32 [784, 256]."""
    tf.random.set_seed(seed)
    model = tf.keras.Sequential([tf.keras.layers.Dense(256, activation="relu"), tf.keras.layers.Dense(10)])
    x = tf.random.normal([64, 784])
    y = tf.random.uniform([64], maxval=10, dtype=tf.int32)
    with tf.GradientTape() as tape:
        loss = tf.keras.losses.sparse_categorical_crossentropy(y, model(x), from_logits=True)
    return tape.gradient(loss, model.trainable_variables[0])


def main(argv):
    del argv
    grads = [dense_layer_gradient(FLAGS.seed + w) for w in range(FLAGS.workers)]
    size = int(tf.size(grads[0]))
    num_slots = max(1, round(FLAGS.ratio * size))
    payloads = []
    for worker, grad in enumerate(grads):
        threshold = ops.estimate_threshold(grad, FLAGS.ratio, num_samples=65536, seed=worker)
        values, indices = ops.dragonn_compress(grad, threshold, num_slots, seed=worker)
        payloads.append((values, indices))
        kept = np.count_nonzero(indices.numpy() >= 0)
        energy = float(tf.reduce_sum(values**2) / tf.reduce_sum(grad**2))
        print(f"worker {worker}: threshold {float(threshold):.3g}, {kept}/{num_slots} slots filled, "
              f"{energy:.1%} of the gradient's energy sent in {num_slots / size:.2%} of its elements")
    summed = ops.sparse_batched_decode(
        tf.concat([v for v, _ in payloads], 0), tf.concat([i for _, i in payloads], 0), size
    )
    dense_sum = tf.add_n([tf.reshape(g, [-1]) for g in grads])
    cosine = float(tf.reduce_sum(summed * dense_sum) / (tf.norm(summed) * tf.norm(dense_sum)))
    print(f"decoded {FLAGS.workers} payloads in one sparse_batched_decode; cosine to the dense sum: {cosine:.3f}")


if __name__ == "__main__":
    app.run(main)
