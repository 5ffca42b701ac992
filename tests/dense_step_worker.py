"""Worker of tests/test_dense_step_jobs.py, run by horovodrun: an all-dense tfcomp plan against plain
Horovod (issue 44). Each rank writes a JSON report to --out:

  ops/<entry point>/<framework>: every Horovod collective of the traced training step, nested
    function graphs included, in order, each [type, its attributes, its inputs' dtypes and shapes];
  tfcomp_ops/<entry point>: the op library's ops in that step's graph, each [type, where: "step" or
    "sampled branch" (inside a tf.cond branch that holds the timeline's clocks)];
  weights_equal/fashion_mnist: whether 30 steps of `model.fit` on Fashion-MNIST end with weights
    bit-identical to plain Horovod's (same seed, same data), every weight compared.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd

import tfcomp
from examples import fashion_mnist
from tfcomp import ops

LIBRARY_PREFIX = "Tfcomp_"  # the op library's generated op classes: Tfcomp_X for the op type Tfcomp>X
COLLECTIVE_ATTRIBUTES = ("reduce_op", "prescale_factor", "postscale_factor", "process_set_id", "T")
FRAMEWORKS = {"horovod": lambda: hvd.Compression.none, "tfcomp": lambda: tfcomp.DRAGONN(0.01, strategy="dense")}


def _functions_called(graph, op) -> list:
    """The function graphs `op` calls (a function call's, a tf.cond's or a loop's branches)."""
    names = []
    for attribute in op.node_def.attr.values():
        names += [attribute.func.name] if attribute.func.name else [f.name for f in attribute.list.func]
    return [graph._get_function(name).graph for name in names]


def collectives(graph) -> list:
    """Every Horovod op of `graph` and the function graphs it calls, in creation order, depth first."""
    found = []
    for op in graph.get_operations():
        if op.type.startswith("Horovod"):
            attributes = {k: str(op.get_attr(k)) for k in COLLECTIVE_ATTRIBUTES if k in op.node_def.attr}
            found.append([op.type, attributes, [[t.dtype.name, t.shape.as_list()] for t in op.inputs]])
        for called in _functions_called(graph, op):
            found += collectives(called)
    return found


def tfcomp_ops(graph, where: str = "step") -> list:
    """[op type, where] of every op of tfcomp's op library in `graph` and the graphs it calls."""
    library = {name.replace("_", ">", 1) for name in dir(ops.load_library()) if name.startswith(LIBRARY_PREFIX)}
    found = []
    for op in graph.get_operations():
        if op.type in library:
            found.append([op.type, where])
        inner = "sampled branch" if op.type in ("If", "StatelessIf") else where
        for called in _functions_called(graph, op):
            found += tfcomp_ops(called, inner)
    return found


def small_model() -> tf.keras.Model:
    """A bias below DRAGONN's min_elements and a large kernel among others."""
    tf.keras.utils.set_random_seed(7)
    return tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(300, activation="relu"),
                                tf.keras.layers.Dense(10)])


def local_batch(rng):
    return rng.standard_normal((8, 64)).astype(np.float32), rng.integers(0, 10, 8).astype(np.int32)


def keras_step_graphs(compression) -> list:
    """The graphs of Keras's traced train function after `train_on_batch` with Horovod's
    DistributedOptimizer over TF 2.15's SGD."""
    model = small_model()
    model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05), compression=compression),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.train_on_batch(*local_batch(np.random.default_rng(hvd.rank())))
    return [f.graph for f in model.train_function._list_all_concrete_functions()]


def tape_step_graphs(compression) -> list:
    """The graph of a tf.function training step with Horovod's DistributedGradientTape built inside it."""
    model = small_model()
    optimizer = tf.keras.optimizers.SGD(0.05)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
        tape = hvd_tf.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(value, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return value

    x, y = local_batch(np.random.default_rng(hvd.rank()))
    step(x, y)
    return [step.get_concrete_function(x, y).graph]


def check_ops(report) -> None:
    for entry_point, graphs_of in (("keras", keras_step_graphs), ("tape", tape_step_graphs)):
        for framework, compression in FRAMEWORKS.items():
            graphs = graphs_of(compression())
            found = [collectives(g) for g in graphs]
            report[f"traces_alike/{entry_point}/{framework}"] = all(f == found[0] for f in found)
            report[f"ops/{entry_point}/{framework}"] = found[-1]
            if framework == "tfcomp":
                report[f"tfcomp_ops/{entry_point}"] = sorted({tuple(o) for g in graphs for o in tfcomp_ops(g)})


def fashion_mnist_weights(compression, steps: int = 30, batch_size: int = 16) -> list:
    """The weights after `steps` steps of `model.fit` on this worker's slice of Fashion-MNIST."""
    tf.keras.utils.set_random_seed(11)
    data = fashion_mnist.input_pipeline(hvd.rank(), hvd.size(), batch_size, seed=3,
                                        examples=steps * batch_size * hvd.size())
    model = tf.keras.Sequential([tf.keras.Input((28, 28, 1)), tf.keras.layers.Conv2D(4, 3, activation="relu"),
                                 tf.keras.layers.Flatten(), tf.keras.layers.Dense(32, activation="relu"),
                                 tf.keras.layers.Dense(10)])
    model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05, momentum=0.9), compression=compression),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(data, epochs=1, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert np.isfinite(history.history["loss"][-1])
    return model.get_weights()


def check_fashion_mnist(report) -> None:
    plain = fashion_mnist_weights(FRAMEWORKS["horovod"]())
    dense = fashion_mnist_weights(FRAMEWORKS["tfcomp"]())
    report["weights_equal/fashion_mnist"] = [bool(np.array_equal(a, b)) for a, b in zip(plain, dense)]
    report["weights_count/fashion_mnist"] = [len(plain), len(dense)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    hvd.init()
    report = {"size": hvd.size(), "rank": hvd.rank()}
    check_ops(report)
    check_fashion_mnist(report)
    with open(os.path.join(args.out, f"rank{hvd.rank()}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
