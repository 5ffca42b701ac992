"""An all-dense plan's step is Horovod's own reduction, with its bookkeeping sampled (issue 44), in
one process (a Horovod world of one, where Horovod's reduction gives every gradient back as it is):
the counters count every step's bytes and steps and time only the sampled steps, the timeline
records every step of its first window and then one in `sample_every`, in eager calls and inside a
`tf.function`; the Keras monitor's time per step is over the timed steps."""

import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvd_keras
import numpy as np
import pytest
import tensorflow as tf

import tfcomp
from tests.helpers import assert_same_bits, random_gradient
from tfcomp.timeline import TIMELINE_SAMPLE_EVERY, ExchangeTimeline


@pytest.fixture(scope="module", autouse=True)
def horovod_world_of_one():
    hvd.init()
    yield


def _sampled_steps(steps: int, window: int, every: int) -> int:
    """How many of `steps` steps a timeline of `window` and `sample_every` records (the reference)."""
    return sum(1 for s in range(steps) if s < window or s % every == 0)


def _random_shapes(rng) -> list:
    """A few tensors of random shapes: small ones and a large one."""
    shapes = [tuple(int(d) for d in rng.integers(1, 12, size=rng.integers(1, 3))) for _ in range(rng.integers(2, 5))]
    return shapes + [(int(rng.integers(3000, 9000)),)]


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf.function"])
@pytest.mark.parametrize("compressor", [lambda: tfcomp.DRAGONN(0.01, strategy="dense"), tfcomp.NoCompression,
                                        tfcomp.FP16], ids=["DRAGONN dense", "NoCompression", "FP16"])
def test_every_step_is_counted_and_the_sampled_steps_timed(rng, traced, compressor):
    compressor = compressor()
    shapes = _random_shapes(rng)
    variables = [tf.Variable(tf.zeros(s)) for s in shapes]
    exchange = tfcomp.GradientExchange(compressor)
    run = tf.function(exchange.__call__, autograph=False) if traced else exchange
    steps = int(rng.integers(3, 12)) if not traced else int(rng.integers(25, 45))
    for _ in range(steps):
        grads = [tf.constant(random_gradient(rng, s, np.float32)) for s in shapes]
        reduced = run(grads, variables)
        for r, g in zip(reduced, grads):
            assert_same_bits(r.numpy(), g.numpy())
    assert exchange.last_entry.runtime.horovod
    elements = sum(int(np.prod(s)) for s in shapes)
    counted = exchange.counters.read()
    timeline = exchange.timeline
    sampled = _sampled_steps(steps, timeline.window, timeline.sample_every)
    assert counted["steps"] == steps and int(exchange.step.numpy()) == steps
    assert counted["dense_bytes"] == 4.0 * elements * steps
    assert counted["sent_bytes"] == (2.0 if isinstance(compressor, tfcomp.FP16) else 4.0) * elements * steps
    assert counted["timed_steps"] == sampled and np.isfinite(counted["seconds"])
    assert int(timeline.steps.numpy()) == sampled and int(timeline.seen.numpy()) == steps
    assert timeline.read()["steps"] == min(sampled, timeline.window)
    assert len(timeline.read()["bucket_end_seconds"]) == 1  # one end for the whole exchange


def test_indexed_slices_are_counted_as_they_are_sent_every_step(rng):
    """IndexedSlices go as Horovod sends them (values and indices, a number of rows that varies from
    step to step): each step's bytes are counted; with sparse_as_dense, the dense tensor's."""
    rows, width = int(rng.integers(50, 200)), int(rng.integers(3, 9))
    table, dense = tf.Variable(tf.zeros([rows, width])), tf.Variable(tf.zeros([int(rng.integers(300, 900))]))
    for sparse_as_dense in (False, True):
        exchange = tfcomp.GradientExchange(tfcomp.DRAGONN(0.01, strategy="dense"), sparse_as_dense=sparse_as_dense)
        step = tf.function(exchange.__call__, autograph=False)
        expected_sent = 0.0
        for _ in range(int(rng.integers(3, 8))):
            picked = rng.choice(rows, size=int(rng.integers(1, rows)), replace=False).astype(np.int64)
            values = random_gradient(rng, (len(picked), width), np.float32)
            slices = tf.IndexedSlices(tf.constant(values), tf.constant(picked), tf.constant([rows, width], tf.int64))
            reduced_slices, _ = step([slices, tf.constant(random_gradient(rng, dense.shape, np.float32))],
                                     [table, dense])
            expected = np.zeros([rows, width], np.float32)
            expected[picked] = values
            assert_same_bits(tf.convert_to_tensor(reduced_slices).numpy(), expected)
            sent_slices = 4.0 * rows * width if sparse_as_dense else (4.0 * values.size + 8.0 * len(picked))
            expected_sent += sent_slices + 4.0 * dense.shape.num_elements()
        assert exchange.last_entry.runtime.horovod
        assert exchange.counters.read()["sent_bytes"] == expected_sent


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf.function"])
def test_the_timeline_records_its_first_window_then_one_step_in_n(rng, traced):
    window, every = int(rng.integers(1, 8)), int(rng.integers(2, 6))
    steps = window + every * int(rng.integers(2, 5)) + int(rng.integers(0, every))
    timeline = ExchangeTimeline(gradients=2, buckets=1, window=window, sample_every=every)
    origin = float(rng.uniform(1e9, 2e9))

    def step(index):
        # The step's index as the second gradient's ready time: the rows tell which steps were recorded.
        ready = tf.stack([tf.constant(origin, tf.float64), origin + tf.cast(index, tf.float64)])
        tf.cond(timeline.sampled(), lambda: timeline.record(ready, tf.reshape(ready[1], [1])), tf.no_op)

    run = tf.function(step, autograph=False) if traced else step
    for index in range(steps):
        run(tf.constant(index, tf.int64))
    recorded = [s for s in range(steps) if s < window or s % every == 0]
    assert int(timeline.seen.numpy()) == steps and int(timeline.steps.numpy()) == len(recorded)
    # The ring holds the last `window` recorded steps, at their row (recorded count modulo window).
    expected_rows = {n % window: s for n, s in enumerate(recorded)}
    assert {row: int(round(timeline.ready.numpy()[row, 1])) for row in range(window)} == expected_rows
    kept = [expected_rows[row] for row in range(window)]
    assert timeline.read()["ready_seconds"][1] == pytest.approx(float(np.median(kept)))


def test_the_default_timeline_samples_one_step_in_ten_after_its_window():
    timeline = ExchangeTimeline(gradients=3, buckets=2)
    assert timeline.sample_every == TIMELINE_SAMPLE_EVERY == 10
    decisions = [bool(timeline.sampled().numpy()) for _ in range(timeline.window + 30)]
    assert decisions == [s < timeline.window or s % 10 == 0 for s in range(timeline.window + 30)]


@pytest.mark.parametrize("argument, value, message", [("window", 0, "window must be >= 1"),
                                                      ("sample_every", 0, "sample_every must be >= 1")])
def test_timeline_arguments_are_checked(argument, value, message):
    with pytest.raises(ValueError, match=message):
        ExchangeTimeline(gradients=2, buckets=1, **{argument: value})


def test_counters_time_only_what_they_are_given(rng):
    counters = tfcomp.counters.ExchangeCounters()
    sizes = rng.integers(100, 10_000, size=int(rng.integers(3, 9))).astype(float)
    elapsed = rng.uniform(0.001, 0.1, size=len(sizes))
    timed = rng.random(len(sizes)) < 0.5
    for size, seconds, is_timed in zip(sizes, elapsed, timed):
        counters.count_step(size, 2 * size)
        if is_timed:
            start = float(rng.uniform(1e9, 2e9))
            counters.add_time(tf.constant([start - 1.0, start], tf.float64), tf.constant([start + seconds], tf.float64))
    counted = counters.read()
    assert counted["steps"] == len(sizes) and counted["timed_steps"] == int(timed.sum())
    assert counted["sent_bytes"] == pytest.approx(sizes.sum())
    assert counted["dense_bytes"] == pytest.approx(2 * sizes.sum())
    assert counted["seconds"] == pytest.approx(elapsed[timed].sum(), abs=1e-6)


def test_the_monitor_gives_the_time_per_timed_step(rng, tmp_path):
    x = rng.standard_normal((96, 12)).astype(np.float32)
    y = rng.integers(0, 3, 96).astype(np.int32)
    model = tf.keras.Sequential([tf.keras.Input((12,)), tf.keras.layers.Dense(32, activation="relu"),
                                 tf.keras.layers.Dense(3)])
    optimizer = hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.01),
                                               compression=tfcomp.DRAGONN(0.05, strategy="dense"))
    model.compile(optimizer, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    seen = []

    class Counted(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(tfcomp.exchange_of(optimizer).counters.read())

    history = model.fit(x, y, batch_size=4, epochs=2, verbose=0,
                        callbacks=[tfcomp.keras.CompressionMonitor(), Counted()]).history
    exchange = tfcomp.exchange_of(optimizer)
    assert exchange.last_entry.runtime.horovod
    # 24 steps an epoch: the first epoch times steps 0..19 (the window) and 20, the second 30 and 40.
    assert [c["steps"] for c in seen] == [24, 24] and [c["timed_steps"] for c in seen] == [21, 2]
    for counted, ms in zip(seen, history["tfcomp_exchange_ms_per_step"]):
        assert ms == pytest.approx(1e3 * counted["seconds"] / counted["timed_steps"])
    assert history["tfcomp_sent_fraction"] == [1.0, 1.0]
