"""The exchange's timeline (tfcomp.timeline.ExchangeTimeline) and the clocks it uses
(tfcomp.counters.stamp and stamps, on the op tfcomp.ops.time_after): what a step records, the
medians read back (gradients not clocked interpolated), the window, argument errors; and the
Keras Replan callback's argument check."""

import time

import numpy as np
import pytest
import tensorflow as tf

import tfcomp
from tfcomp.counters import stamp, stamps
from tfcomp.timeline import MAX_READY_CLOCKS, ExchangeTimeline, clocked_positions


def _chain(x, rounds: int):
    """A tensor computed from x by `rounds` dependent matrix products (it is ready later)."""
    for _ in range(rounds):
        x = tf.tanh(tf.matmul(x, x) / 256.0)
    return x


def test_a_gradient_computed_later_is_ready_later_and_a_bucket_ends_after_its_gradients(rng):
    timeline = ExchangeTimeline(gradients=2, buckets=2, window=4)
    start = tf.constant(rng.standard_normal([256, 256]).astype(np.float32))

    @tf.function(autograph=False)
    def step(x):
        early = x * 2.0
        late = _chain(early, 30)
        reduced = [early + 1.0, _chain(late, 5)]
        timeline.record(stamps([early, late]), stamps(reduced))
        return reduced

    for _ in range(6):
        step(start)
    measured = timeline.read()
    assert measured["steps"] == 4  # the window
    assert int(timeline.steps.numpy()) == 6
    early, late = measured["ready_seconds"]
    assert early == 0.0 and late > 0.0
    assert measured["backward_seconds"] == late
    assert measured["bucket_end_seconds"][1] > late
    assert measured["bucket_end_seconds"][0] >= 0.0
    rows = timeline.ready.numpy()
    assert np.all(rows[:, 0] == 0.0) and np.all(rows[:, 1] > 0.0)


@pytest.mark.parametrize("gradients", [0, 1, 2, MAX_READY_CLOCKS, MAX_READY_CLOCKS + 1, 82, 1000])
def test_a_step_clocks_every_gradient_up_to_the_limit_and_then_the_first_last_and_evenly_between(gradients):
    clocked = clocked_positions(gradients)
    if gradients <= MAX_READY_CLOCKS:
        assert clocked == tuple(range(gradients))
        return
    assert len(clocked) == MAX_READY_CLOCKS and clocked[0] == 0 and clocked[-1] == gradients - 1
    gaps = np.diff(clocked)
    assert np.all(gaps >= 1) and gaps.max() - gaps.min() <= 1


def test_clocks_fewer_than_the_first_and_last_gradient_are_refused():
    with pytest.raises(ValueError, match="most must be >= 2 clocks"):
        clocked_positions(10, most=1)


def test_the_gradients_not_clocked_are_interpolated_by_position(rng):
    timeline = ExchangeTimeline(gradients=40, buckets=2, window=3)
    clocked = np.asarray(timeline.clocked)
    assert len(clocked) == MAX_READY_CLOCKS
    # A backward pass whose gradients come at uneven times, the first clocked one first; given as numbers.
    times = 1.7e9 + np.cumsum(rng.uniform(0.001, 0.01, size=40))
    for _ in range(2):
        timeline.record(tf.constant(times[clocked]), tf.constant([times[-1] + 0.5, times[-1] + 0.25]))
    measured = timeline.read()
    expected = np.interp(np.arange(40), clocked, times[clocked] - times[0])
    np.testing.assert_allclose(measured["ready_seconds"], expected, rtol=0, atol=1e-6)
    np.testing.assert_allclose(measured["ready_seconds"][clocked[5]], times[clocked[5]] - times[0], atol=1e-6)
    np.testing.assert_allclose(measured["bucket_end_seconds"], [times[-1] - times[0] + 0.5, times[-1] - times[0] + 0.25],
                               atol=1e-6)
    assert measured["backward_seconds"] == pytest.approx(times[-1] - times[0], abs=1e-6)


def test_stamps_are_one_clock_per_tensor():
    x = tf.ones([4])

    def step(x):
        return stamps([x, x * 2.0, x + 1.0]), stamps([])

    graph = tf.function(step, autograph=False).get_concrete_function(tf.TensorSpec([4])).graph
    clocks = [op for op in graph.get_operations() if op.type == "Tfcomp>TimeAfter"]
    assert [len(op.inputs) for op in clocks] == [1, 1, 1]
    each, none = tf.function(step, autograph=False)(x)
    assert each.dtype == tf.float64 and each.shape == [3] and none.shape == [0]
    assert abs(float(each[0]) - time.time()) < 60.0


def test_an_empty_timeline_reads_as_nothing_measured():
    timeline = ExchangeTimeline(gradients=3, buckets=1)
    assert timeline.read() == {"steps": 0, "ready_seconds": [], "bucket_end_seconds": [], "backward_seconds": 0.0}


@pytest.mark.parametrize("kwargs, message", [
    ({"gradients": -1, "buckets": 1}, "gradients and buckets must be >= 0"),
    ({"gradients": 1, "buckets": 1, "window": 0}, "window must be >= 1 step"),
])
def test_timeline_arguments_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ExchangeTimeline(**kwargs)


def test_recording_other_counts_than_the_timeline_holds_is_a_value_error():
    timeline = ExchangeTimeline(gradients=2, buckets=1)
    with pytest.raises(ValueError, match="clocks 2 gradients and 1 buckets, got 1 and 1 times"):
        timeline.record(tf.zeros([1], tf.float64), tf.zeros([1], tf.float64))
    with pytest.raises(ValueError, match="got 2 and 0 times"):
        timeline.record(tf.zeros([2], tf.float64), tf.zeros([0], tf.float64))


def test_stamp_waits_only_for_its_tensors():
    """In a tf.function a stamp is taken once its tensors are computed (its data inputs), and no
    later: a plain timestamp created after one that waits for a late tensor would wait too
    (TensorFlow orders stateful ops that touch no resource), a stamp does not."""

    def step(x):
        early = x[:2, :2] * 2.0
        late = _chain(x, 30)
        return stamp([early]), stamp([late]), stamp([early + 1.0]), stamp()

    graph = tf.function(step, autograph=False).get_concrete_function(tf.TensorSpec([256, 256])).graph
    clocks = [op for op in graph.get_operations() if op.type in ("Tfcomp>TimeAfter", "Timestamp")]
    assert [op.type for op in clocks] == ["Tfcomp>TimeAfter"] * 3 + ["Timestamp"]
    assert all(op.control_inputs == [] and op.get_attr("_independent_side_effects") for op in clocks)
    x = tf.constant(np.random.default_rng(0).standard_normal([256, 256]).astype(np.float32))
    function = tf.function(step, autograph=False)
    for _ in range(3):
        early, late, after_early, _ = (float(t) for t in function(x))
    # The chain of 30 products of 256 x 256 matrices takes milliseconds; the early stamps do not wait for it.
    assert early <= after_early < late


@pytest.mark.parametrize("tensors", [
    [tf.constant(1.5)],
    [tf.zeros([0, 3]), tf.constant([1, 2], tf.int32), tf.constant(["a"])],
    [tf.ones([4], tf.float16), tf.ones([2, 2], tf.bfloat16), tf.constant(7, tf.int64)],
])
def test_time_after_gives_the_wall_clock_time_as_a_float64_scalar(tensors):
    before = time.time()
    seconds = tfcomp.ops.time_after(tensors)
    after = time.time()
    assert seconds.dtype == tf.float64 and seconds.shape == []
    assert before - 1e-3 <= float(seconds) <= after + 1e-3


def test_time_after_needs_a_tensor_to_wait_for():
    with pytest.raises(ValueError, match="tensors: give at least one tensor"):
        tfcomp.ops.time_after([])


@pytest.mark.parametrize("tensors, position, given", [
    ([tf.ones([2]), None], 1, "None"),
    ([None], 0, "None"),
    ([tf.ones([2]), [1.0, None]], 1, r"\[1.0, None\]"),
    ([object()], 0, "<object object at"),
])
def test_time_after_names_an_entry_that_is_no_tensor(tensors, position, given):
    with pytest.raises(TypeError, match=rf"^tensors\[{position}\] must be a tensor .*, got {given}"):
        tfcomp.ops.time_after(tensors)


@pytest.mark.parametrize("tensors, given", [
    (tf.ones([3]), r"a float32 tensor of shape \(3,\)"),
    (np.ones(3), r"a float64 array of shape \(3,\)"),
    (None, "None"),
])
def test_time_after_wants_a_list_of_tensors(tensors, given):
    with pytest.raises(TypeError, match=rf"^tensors must be a list of tensors, got {given}"):
        tfcomp.ops.time_after(tensors)


@pytest.mark.parametrize("after_steps", [0, -3, 2.5, True, "30"])
def test_replan_callback_checks_after_steps(after_steps):
    with pytest.raises(ValueError, match="after_steps must be an integer >= 1"):
        tfcomp.keras.Replan(after_steps=after_steps)


@pytest.mark.parametrize("threshold", [0, -0.5, float("inf"), float("nan"), True, "0.5"])
def test_replan_callback_checks_threshold(threshold):
    with pytest.raises(ValueError, match="threshold must be a finite fraction > 0"):
        tfcomp.keras.Replan(threshold=threshold)
