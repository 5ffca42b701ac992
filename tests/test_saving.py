"""model.save (SavedModel) carries the exchange's residuals and step; restoring them with
model.load_weights continues training exactly as the original model does."""

import sys

import horovod.tensorflow.keras as hvd
import numpy as np
import pytest
import tensorflow as tf

import tfcomp
from tfcomp.memory import ExchangeState


def build():
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.layers.Dense(64, activation="tanh", input_shape=(32,)),
                                 tf.keras.layers.Dense(1)])
    opt = tfcomp.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, momentum=0.5),
                                      compression=tfcomp.DRAGONN(0.01, strategy="allgather", min_elements=1))
    model.compile(opt, "mse")
    return model, opt


def test_savedmodel_round_trip_continues_exactly(rng, tmp_path):
    hvd.init()
    x = rng.standard_normal((96, 32)).astype(np.float32)
    y = rng.standard_normal((96, 1)).astype(np.float32)
    model, opt = build()
    model.fit(x[:64], y[:64], batch_size=16, epochs=1, shuffle=False, verbose=0)
    assert any(np.any(r.numpy() != 0) for r in tfcomp.exchange_of(opt).memory.residuals)
    model.save(str(tmp_path / "saved"))

    restored, restored_opt = build()
    restored.load_weights(str(tmp_path / "saved" / "variables" / "variables"))
    for m in (model, restored):
        m.fit(x[64:], y[64:], batch_size=16, epochs=1, shuffle=False, verbose=0)
    exchange, restored_exchange = tfcomp.exchange_of(opt), tfcomp.exchange_of(restored_opt)
    assert int(restored_exchange.step.numpy()) == int(exchange.step.numpy()) == 6
    np.testing.assert_array_equal(restored_exchange.memory.residuals[0].numpy(), exchange.memory.residuals[0].numpy())
    for a, b in zip(model.get_weights(), restored.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_residuals_saved_by_another_rank_are_reported(rng, tmp_path, caplog):
    hvd.init()
    x = rng.standard_normal((32, 32)).astype(np.float32)
    y = rng.standard_normal((32, 1)).astype(np.float32)
    model, opt = build()
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    tfcomp.exchange_of(opt).state.owner.assign([1, 2])  # as rank 1 of 2 would have saved it
    path = tf.train.Checkpoint(model=model, optimizer=opt).save(str(tmp_path / "ckpt"))

    restored, restored_opt = build()
    tf.train.Checkpoint(model=restored, optimizer=restored_opt).restore(path)
    caplog.clear()
    restored.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    assert "rank 0 of 1 restored error-feedback residuals saved by rank 1 of 2" in caplog.text
    assert list(tfcomp.exchange_of(restored_opt).state.owner.numpy()) == [0, 1]


@pytest.mark.parametrize("saved_ranks, expected", [(2, "exact"), (3, "mean")])
def test_gathered_memory_restores_own_row_or_the_mean(rng, tmp_path, saved_ranks, expected):
    rows = rng.standard_normal((saved_ranks, 10)).astype(np.float32)
    saved = tfcomp.memory.ExchangeState()
    saved.memory.residual(("watched tensor", 0), 10)
    saved.gathered_vector(0).assign(rows)
    saved.gathered_vector(1).assign(tf.zeros([saved_ranks, 0]))  # the (empty) momentum
    saved.step.assign(7)
    saved.gathered_step.assign(7)
    path = tf.train.Checkpoint(state=saved).save(str(tmp_path / "ckpt"))

    restored = tfcomp.memory.ExchangeState()
    tf.train.Checkpoint(state=restored).restore(path)
    residual = restored.memory.residual(("watched tensor", 0), 10)  # created after the restore, as in training
    assert restored.adopt_gathered(rank=1, size=2) == expected
    np.testing.assert_array_equal(residual.numpy(), rows[1] if expected == "exact" else rows.mean(axis=0))
    assert int(restored.gathered_step.numpy()) == -1
    assert restored.gathered_vector(0).numpy().size == 0


def test_residuals_a_restore_holds_are_counted_until_claimed(rng, tmp_path):
    values = [rng.standard_normal(n).astype(np.float32) for n in (10, 3)]
    saved = ExchangeState()
    for position, value in enumerate(values):
        saved.memory.residual(("watched tensor", position), value.size).assign(value)
    path = tf.train.Checkpoint(state=saved).save(str(tmp_path / "ckpt"))

    restored = ExchangeState()
    assert restored.memory.pending_restores() == 0
    tf.train.Checkpoint(state=restored).restore(path)
    assert restored.memory.pending_restores() == 2  # an all-dense plan claims none: the exchange warns
    first = restored.memory.residual(("watched tensor", 0), 10)
    assert restored.memory.pending_restores() == 1
    np.testing.assert_array_equal(first.numpy(), values[0])


@pytest.mark.parametrize("loader", [tf.keras.models.load_model, hvd.load_model], ids=["keras", "horovod"])
@pytest.mark.parametrize("file_name", ["model.keras", "saved_model"])
def test_saved_model_files_load_with_the_inner_optimizer(rng, tmp_path, loader, file_name):
    hvd.init()
    x = rng.standard_normal((32, 32)).astype(np.float32)
    model, _ = build()
    model.fit(x, x[:, :1], batch_size=16, epochs=1, shuffle=False, verbose=0)
    model.save(str(tmp_path / file_name))
    # A .keras file names the optimizer's class by its module, horovod._keras, where Horovod made it on the fly
    # and Keras cannot find it again: as with stock Horovod, name the inner class (tfcomp leaves Horovod's class
    # as it is).
    custom_objects = {"SGD": tf.keras.optimizers.SGD} if file_name == "model.keras" else None
    loaded = loader(str(tmp_path / file_name), custom_objects=custom_objects)
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert loaded.optimizer.__class__.__name__ == "SGD"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
