"""zero_at against a NumPy reference: in place, indices of other tensors skipped, a shared buffer
copied rather than overwritten, and its argument checks."""

import numpy as np
import pytest
import tensorflow as tf

from tfcomp import ops


def reference(values: np.ndarray, indices: np.ndarray, offset: int) -> np.ndarray:
    out = values.reshape(-1).copy()
    local = indices.astype(np.int64) - offset
    out[local[(local >= 0) & (local < out.size)]] = 0.0
    return out.reshape(values.shape)


def random_indices(rng, n: int, low: int, high: int) -> np.ndarray:
    """int32 indices in [low, high), with -1 padding and duplicates."""
    indices = rng.integers(low, high, n).astype(np.int32)
    indices[rng.random(n) < 0.2] = -1
    indices[: n // 5] = indices[n // 5: 2 * (n // 5)]
    return indices


@pytest.mark.parametrize("shape", [(1,), (1000,), (37, 211), (4, 5, 6)])
@pytest.mark.parametrize("offset", [0, 17, 100_000])
def test_matches_reference(rng, shape, offset):
    values = rng.standard_normal(shape).astype(np.float32)
    size = values.size
    # Indices of this tensor (at offset) and of neighbours before and after it in a merged bucket.
    indices = random_indices(rng, max(4, size // 3), max(0, offset - size), offset + 2 * size)
    variable = tf.Variable(values)
    ops.zero_at(variable, indices, offset)
    np.testing.assert_array_equal(variable.numpy(), reference(values, indices, offset))


def test_inside_a_function_after_an_assign(rng):
    """As error feedback runs it: the residual becomes the accumulated gradient, then the sent
    elements are cleared; twice, so the second step reads what the first left."""
    size = 10_000
    residual = tf.Variable(tf.zeros([size]))

    @tf.function(autograph=False)
    def step(grad, sent):
        accumulated = grad + residual
        with tf.control_dependencies([residual.assign(accumulated, read_value=False)]):
            cleared = ops.zero_at(residual, sent)
        with tf.control_dependencies([cleared]):
            return tf.identity(accumulated)

    expected = np.zeros(size, np.float32)
    for _ in range(2):
        grad = rng.standard_normal(size).astype(np.float32)
        sent = random_indices(rng, 100, 0, size)
        accumulated = step(grad, sent).numpy()
        np.testing.assert_array_equal(accumulated, expected + grad)  # returned: not cleared under it
        expected = reference(expected + grad, sent, 0)
        np.testing.assert_array_equal(residual.numpy(), expected)


def test_a_value_read_before_is_not_changed(rng):
    """A tensor read from the variable before zero_at shares its buffer: zero_at writes a copy."""
    values = rng.standard_normal(5000).astype(np.float32)
    variable = tf.Variable(values)
    read = variable.read_value()
    indices = random_indices(rng, 500, 0, 5000)
    ops.zero_at(variable, indices)
    np.testing.assert_array_equal(read.numpy(), values)
    np.testing.assert_array_equal(variable.numpy(), reference(values, indices, 0))


def test_no_copy_on_read_afterwards(rng):
    """Unlike scatter_nd_update, zero_at leaves reads sharing the buffer: a later in-place
    change does not show in an earlier read (copy on write), and the values stay right."""
    values = rng.standard_normal(3000).astype(np.float32)
    variable = tf.Variable(values)
    first = random_indices(rng, 100, 0, 3000)
    ops.zero_at(variable, first)
    read = variable.read_value()
    second = random_indices(rng, 100, 0, 3000)
    ops.zero_at(variable, second)
    np.testing.assert_array_equal(read.numpy(), reference(values, first, 0))
    np.testing.assert_array_equal(variable.numpy(), reference(reference(values, first, 0), second, 0))


def test_empty_indices_change_nothing(rng):
    values = rng.standard_normal(10).astype(np.float32)
    variable = tf.Variable(values)
    ops.zero_at(variable, np.zeros(0, np.int32))
    np.testing.assert_array_equal(variable.numpy(), values)


@pytest.mark.parametrize("offset, error", [(-1, ValueError), (2**31, ValueError), (1.5, TypeError), (True, TypeError)])
def test_bad_offset_is_refused(offset, error):
    with pytest.raises(error, match="offset"):
        ops.zero_at(tf.Variable(tf.zeros([4])), [0], offset)


def test_bad_variable_is_refused():
    with pytest.raises(ValueError, match="variable must be float32, got float64"):
        ops.zero_at(tf.Variable(tf.zeros([4], tf.float64)), [0])
    with pytest.raises(TypeError, match="variable must be a tf.Variable"):
        ops.zero_at(tf.zeros([4]), [0])


def test_bad_indices_are_refused():
    with pytest.raises(ValueError, match="indices"):
        ops.zero_at(tf.Variable(tf.zeros([4])), [2**40])
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="indices must be a vector"):
        ops.zero_at(tf.Variable(tf.zeros([4])), tf.zeros([2, 2], tf.int32))
