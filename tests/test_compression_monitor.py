"""What the exchange counts (tfcomp.counters) and what tfcomp.keras.CompressionMonitor reports, in
one process (a Horovod world of one: the reduced gradient of a compressed tensor is exactly the
payload this worker sent, so the payload sizes can be read off it independently)."""

import csv

import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvd_keras
import numpy as np
import pytest
import tensorflow as tf

import tfcomp
from tests.helpers import random_gradient

SHAPES = {"kernel": (40, 50), "long": (3001,), "bias": (10,), "small": (5, 6)}
COMPRESSED = ("kernel", "long")
RATIO = 0.05


@pytest.fixture(scope="module", autouse=True)
def horovod_world_of_one():
    hvd.init()
    yield


def exchange_and_variables(compressor):
    variables = [tf.Variable(tf.zeros(shape), name=name) for name, shape in SHAPES.items()]
    return tfcomp.GradientExchange(compressor), variables


@pytest.mark.parametrize("make", [lambda: tfcomp.TopK(RATIO, planning="off", min_elements=1000),
                                  lambda: tfcomp.DGC(RATIO, planning="off", min_elements=1000)], ids=["TopK", "DGC"])
def test_counted_bytes_are_the_payloads_sent(rng, make):
    exchange, variables = exchange_and_variables(make())
    expected_sent, expected_dense = 0.0, 0.0
    for _ in range(3):
        grads = [tf.constant(random_gradient(rng, v.shape, np.float32)) for v in variables]
        reduced = exchange(grads, variables)
        for v, r in zip(variables, reduced):
            name = v.name.split(":")[0]
            expected_dense += 4 * v.shape.num_elements()
            if name in COMPRESSED:
                # (value, int32 index) pairs, one per element sent, and the bucket's non-finite flag.
                expected_sent += 8 * np.count_nonzero(r.numpy()) + 4
            else:
                expected_sent += 4 * v.shape.num_elements()
    counted = exchange.counters.read()
    assert counted["steps"] == 3
    assert counted["sent_bytes"] == expected_sent
    assert counted["dense_bytes"] == expected_dense
    assert counted["seconds"] > 0 and counted["timed_steps"] == 3  # a compressing plan times every step
    exchange.counters.reset()
    assert exchange.counters.read() == {"steps": 0, "sent_bytes": 0.0, "dense_bytes": 0.0, "seconds": 0.0,
                                        "timed_steps": 0}


def test_counters_are_not_in_checkpoints(rng, tmp_path):
    exchange, variables = exchange_and_variables(tfcomp.TopK(RATIO, planning="off", min_elements=1000))
    exchange([tf.constant(random_gradient(rng, v.shape, np.float32)) for v in variables], variables)
    saved = {name for name, _ in tf.train.list_variables(tf.train.Checkpoint(exchange=exchange).save(str(tmp_path / "c")))}
    assert not any("tfcomp_" in name or "counters" in name for name in saved), saved
    assert all(v.name.startswith(("residual", "momentum", "second_moment", "communication_step", "owner", "gathered"))
               for v in exchange.variables)


def fit_with_monitor(rng, tmp_path, compression, epochs=2, wrap=None):
    x = rng.standard_normal((64, 20)).astype(np.float32)
    y = rng.integers(0, 3, 64).astype(np.int32)
    model = tf.keras.Sequential([tf.keras.Input((20,)), tf.keras.layers.Dense(64, activation="relu"),
                                 tf.keras.layers.Dense(3)])
    optimizer = hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.01), compression=compression)
    if wrap:
        optimizer = wrap(optimizer)
    model.compile(optimizer, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    log = tmp_path / "log.csv"
    history = model.fit(x, y, batch_size=16, epochs=epochs, verbose=0, callbacks=[
        tfcomp.keras.CompressionMonitor(log_dir=str(tmp_path / "tb")), tf.keras.callbacks.CSVLogger(str(log))])
    with open(log) as f:
        rows = list(csv.DictReader(f))
    return model, optimizer, history.history, rows


def test_monitor_reports_each_epoch_in_the_logs_and_csv(rng, tmp_path):
    model, optimizer, history, rows = fit_with_monitor(rng, tmp_path, tfcomp.DRAGONN(0.1, planning="off", min_elements=100))
    exchange = tfcomp.exchange_of(optimizer)
    dense = 4.0 * sum(v.shape.num_elements() for v in model.trainable_variables)
    for key in ("tfcomp_sent_mb_per_step", "tfcomp_sent_fraction", "tfcomp_exchange_ms_per_step", "tfcomp_residual_norm",
                "tfcomp_gradients_ready_ms", "tfcomp_exposed_exchange_ms"):
        assert len(history[key]) == 2 and all(np.isfinite(history[key])), key
        assert [float(r[key]) for r in rows] == pytest.approx(history[key], rel=1e-6)
    timeline = exchange.timeline.read()
    assert timeline["steps"] == 8  # both epochs' steps, within the 20-step window
    assert history["tfcomp_gradients_ready_ms"][-1] == pytest.approx(1e3 * timeline["backward_seconds"])
    assert history["tfcomp_exposed_exchange_ms"][-1] >= 0.0
    # The last epoch's 4 steps, as the counters hold them; the fraction is sent over dense bytes.
    counted = exchange.counters.read()
    assert counted["steps"] == 4 and counted["dense_bytes"] == 4 * dense
    assert history["tfcomp_sent_mb_per_step"][-1] == pytest.approx(counted["sent_bytes"] / 4 / 1e6)
    assert history["tfcomp_sent_fraction"][-1] == pytest.approx(counted["sent_bytes"] / counted["dense_bytes"])
    assert 0 < history["tfcomp_sent_fraction"][-1] < 0.5
    residuals = np.concatenate([v.numpy() for v in exchange.memory.residuals])
    assert residuals.any()
    assert history["tfcomp_residual_norm"][-1] == pytest.approx(np.linalg.norm(residuals.astype(np.float64)), rel=1e-6)
    assert list((tmp_path / "tb").iterdir())  # the plan as TensorBoard text


def test_monitor_with_stock_horovod_reports_the_dense_size(rng, tmp_path):
    model, _, history, rows = fit_with_monitor(rng, tmp_path, hvd_keras.Compression.none, epochs=1)
    assert history["tfcomp_dense_mb_per_step"] == [4 * sum(v.shape.num_elements() for v in model.trainable_variables) / 1e6]
    assert "tfcomp_sent_fraction" not in history and "tfcomp_dense_mb_per_step" in rows[0]


def test_exchange_of_unwraps_a_loss_scale_optimizer(rng, tmp_path):
    _, optimizer, history, _ = fit_with_monitor(rng, tmp_path, tfcomp.TopK(0.1, planning="off", min_elements=100),
                                                epochs=1, wrap=tf.keras.mixed_precision.LossScaleOptimizer)
    assert isinstance(tfcomp.exchange_of(optimizer), tfcomp.GradientExchange)
    assert history["tfcomp_sent_fraction"][0] < 0.5
    with pytest.raises(TypeError, match="does not run a tfcomp exchange"):
        tfcomp.exchange_of(tf.keras.optimizers.SGD())
