"""topk_compress against the NumPy reference and tf.math.top_k, and its argument checks."""

import sys

import numpy as np
import pytest
import tensorflow as tf

from tests import numpy_reference as ref
from tests.helpers import SHAPES, assert_same_bits, random_gradient
from tfcomp import ops


@pytest.mark.parametrize("dtype", ref.DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES + [(3_000_000,)], ids=str)
def test_matches_reference(rng, shape, dtype):
    g = random_gradient(rng, shape, dtype)
    size = g.size
    for k in {1, max(1, size // 1000), max(1, size // 7), size}:
        values, indices = ops.topk_compress(g, k)
        expected_values, expected_indices = ref.topk_compress(g, k)
        np.testing.assert_array_equal(indices.numpy(), expected_indices)
        assert_same_bits(values.numpy(), expected_values)


def test_same_magnitudes_as_tf_math_top_k(rng):
    g = rng.standard_normal((50, 401)).astype(np.float32)
    values, _ = ops.topk_compress(g, 321)
    expected = tf.math.top_k(tf.abs(tf.reshape(g, [-1])), 321).values.numpy()
    np.testing.assert_array_equal(np.sort(np.abs(values.numpy()))[::-1], expected)


def test_ties_go_to_the_larger_index():
    g = np.array([1, -1, 1, 1, -1, 0.5], np.float32)
    _, indices = ops.topk_compress(g, 3)
    assert indices.numpy().tolist() == [2, 3, 4]


def test_nan_ranks_above_inf_above_finite(rng):
    g = rng.standard_normal(1000).astype(np.float32)
    g[[10, 500, 900]] = [np.inf, np.nan, -np.inf]
    values, indices = ops.topk_compress(g, 3)
    assert indices.numpy().tolist() == [10, 500, 900]
    _, indices = ops.topk_compress(g, 1)
    assert indices.numpy().tolist() == [500]


@pytest.mark.parametrize(
    "grad, k, error, message",
    [
        (np.ones(10, np.float32), 0, ValueError, r"k must be in \[1, 2147483647\], got 0"),
        (np.ones(10, np.float32), 2**63 - 1, ValueError, r"k must be in \[1, 2147483647\], got 9223372036854775807"),
        (np.ones(10, np.float32), np.float32(3), TypeError, r"k must be an int, got 3.0 of type float32"),
        (np.ones((2, 5), np.float32), 11, tf.errors.InvalidArgumentError,
         r"k must be <= the number of elements of grad \(10 for shape \[2,5\]\), got 11"),
        (np.ones((0,), np.float32), 1, tf.errors.InvalidArgumentError,
         r"k must be <= the number of elements of grad \(0 for shape \[0\]\), got 1"),
    ],
)
def test_bad_arguments(grad, k, error, message):
    with pytest.raises(error, match=message):
        ops.topk_compress(grad, k)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
