"""sparse_batched_decode against the NumPy reference, round trips, and its argument checks."""

import sys

import numpy as np
import pytest
import tensorflow as tf

from tests import numpy_reference as ref
from tests.helpers import assert_same_bits, quantile_threshold, random_gradient
from tfcomp import ops


def random_payloads(rng, num_workers, length, size, dtype):
    """K concatenated payloads: random values, indices with duplicates across and within workers,
    and -1 padding."""
    indices = rng.integers(-1, size, (num_workers, length)).astype(np.int32)
    indices[:, : length // 4] = rng.integers(0, max(1, size // 50), (num_workers, length // 4))  # duplicates
    values = rng.standard_normal((num_workers, length)).astype(dtype)
    return values.reshape(-1), indices.reshape(-1)


@pytest.mark.parametrize("dtype", ref.DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("num_workers", [1, 4, 16, 64])
@pytest.mark.parametrize("size", [1, 1000, 100_003])
def test_matches_reference(rng, dtype, num_workers, size):
    values, indices = random_payloads(rng, num_workers, max(1, size // 100), size, dtype)
    dense = ops.sparse_batched_decode(values, indices, size).numpy()
    assert_same_bits(dense, ref.sparse_batched_decode(values, indices, size))


def test_equals_k_dense_decodes_summed(rng):
    size, num_workers, length = 50_000, 8, 700
    values, indices = random_payloads(rng, num_workers, length, size, np.float32)
    batched = ops.sparse_batched_decode(values, indices, size).numpy()
    separate = sum(
        ops.sparse_batched_decode(values[w * length : (w + 1) * length], indices[w * length : (w + 1) * length], size)
        for w in range(num_workers)
    ).numpy()
    np.testing.assert_allclose(batched, separate, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", ref.DTYPES, ids=lambda d: np.dtype(d).name)
def test_round_trip_of_a_dragonn_payload(rng, dtype):
    g = random_gradient(rng, (20_000,), dtype)
    values, indices = ops.dragonn_compress(g, quantile_threshold(g, 0.01), 300, int(rng.integers(1 << 40)))
    dense = ops.sparse_batched_decode(values, indices, g.size).numpy()
    kept = indices.numpy()[indices.numpy() >= 0]
    assert_same_bits(dense[kept], g[kept])
    assert np.count_nonzero(dense) == np.count_nonzero(g[kept])


def test_nan_reaches_the_sum():
    dense = ops.sparse_batched_decode(np.array([1.0, np.nan, 2.0], np.float32), np.array([3, 3, 0], np.int32), 5)
    assert np.isnan(dense.numpy()[3]) and dense.numpy()[0] == 2.0


def test_empty_payload_and_empty_output():
    assert ops.sparse_batched_decode(np.zeros(0, np.float32), np.zeros(0, np.int32), 4).numpy().tolist() == [0] * 4
    assert ops.sparse_batched_decode(np.zeros(0, np.float32), np.zeros(0, np.int32), 0).numpy().size == 0
    only_padding = ops.sparse_batched_decode(np.ones(3, np.float32), np.full(3, -1, np.int32), 0)
    assert only_padding.numpy().size == 0


@pytest.mark.parametrize(
    "values, indices, size, message",
    [
        ([1.0, 2.0], [0, 10], 10, r"indices\[1\] = 10 is out of range for size 10 \(valid: -1 to 9\)"),
        ([1.0, 2.0, 3.0], [0, -2, 1], 10, r"indices\[1\] = -2 is out of range for size 10"),
        ([1.0], [2**31 - 1], 5, r"indices\[0\] = 2147483647 is out of range for size 5"),
        ([1.0], [0], 0, r"indices\[0\] = 0 is out of range for size 0"),
        ([1.0, 2.0], [0], 10, r"values and indices must have the same length, got values of shape \[2\] and indices of shape \[1\]"),
        ([[1.0]], [0], 10, r"values must be a vector, got shape \[1,1\]"),
        ([1.0], [[0]], 10, r"indices must be a vector, got shape \[1,1\]"),
    ],
)
def test_bad_arguments(values, indices, size, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        ops.sparse_batched_decode(np.array(values, np.float32), np.array(indices, np.int32), size)


@pytest.mark.parametrize(
    "size, error, message",
    [
        (-1, ValueError, r"size must be in \[0, 2147483647\], got -1"),
        (2**63 - 1, ValueError, r"size must be in \[0, 2147483647\], got 9223372036854775807"),
        ("10", TypeError, r"size must be an int, got '10' of type str"),
    ],
)
def test_bad_size_is_caught_before_the_op(size, error, message):
    with pytest.raises(error, match=message):
        ops.sparse_batched_decode(np.ones(1, np.float32), np.zeros(1, np.int32), size)


@pytest.mark.parametrize(
    "indices, error, message",
    [
        (np.array([0, 2**32], np.int64), ValueError, r"indices must be in \[-2147483648, 2147483647\], got 4294967296 at flat position 1"),
        ([1, -(2**40)], ValueError, r"indices must be in \[-2147483648, 2147483647\], got -1099511627776 at flat position 1"),
        (np.array([0.0, 1.0]), TypeError, r"indices must be integers \(int32\), got a float64 array of shape \(2,\)"),
    ],
)
def test_indices_that_tensorflow_would_wrap_are_caught_before_the_op(indices, error, message):
    with pytest.raises(error, match=message):
        ops.sparse_batched_decode(np.ones(2, np.float32), indices, 4)


def test_indices_as_a_list_or_int64_array_that_fit_int32():
    for indices in ([3, -1, 0], np.array([3, -1, 0], np.int64), np.array([3, -1, 0], np.int8)):
        dense = ops.sparse_batched_decode(np.array([1.0, 2.0, 3.0], np.float32), indices, 4).numpy()
        assert dense.tolist() == [3.0, 0.0, 0.0, 1.0]


def test_graph_mode_names_the_bad_argument():
    decode = tf.function(lambda v, i: ops.sparse_batched_decode(v, i, 8))
    with pytest.raises(ValueError, match=r"values and indices must have the same length"):
        decode(tf.ones([3]), tf.zeros([2], tf.int32))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
