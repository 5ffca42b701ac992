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


# Pairs of one index, in order, and what the CPU kernel returns for them: float32 and bfloat16 add
# in float32 under TensorFlow's FTZ and DAZ, so a subnormal addend counts as a zero of its sign and
# a sum that lands in the subnormal range (|sum| < 2^-126 = 1.18e-38) is a zero of its sign.
FLUSHED_SUMS = [
    ([1.5e-38, -1.4e-38], 0.0),  # exact sum 1e-39
    ([-1.5e-38, 1.4e-38], -0.0),  # exact sum -1e-39
    ([1e-40], 0.0),  # a subnormal value alone
    ([-1e-40], 0.0),  # 0 + (-0) is +0
    ([1e-40, 2e-38], 2e-38),  # the subnormal addend is lost: not 2.01e-38
    ([2e-38, -1.5e-38, 2e-38], 2e-38),  # the partial sum 5e-39 is flushed: not 2.5e-38
]


@pytest.mark.parametrize("dtype", [np.float32, ref.DTYPES[2]], ids=["float32", "bfloat16"])
def test_subnormal_values_and_sums_are_flushed_to_zero(dtype):
    values = np.array([v for pairs, _ in FLUSHED_SUMS for v in pairs], np.float32).astype(dtype)
    indices = np.array([i for i, (pairs, _) in enumerate(FLUSHED_SUMS) for _ in pairs], np.int32)
    dense = ops.sparse_batched_decode(values, indices, len(FLUSHED_SUMS)).numpy()
    expected = np.array([np.float32(total) for _, total in FLUSHED_SUMS]).astype(dtype)
    assert_same_bits(dense, expected)  # the signs of the zeros included
    exact = np.zeros(len(FLUSHED_SUMS))
    np.add.at(exact, indices, values.astype(np.float64))
    assert np.all(exact != expected.astype(np.float64))  # each case loses something to the flush


def test_the_docs_say_what_the_subnormal_tests_check():
    """The wrapper's docstring and the op's registered doc state the flush the tests above check."""
    for doc in (ops.sparse_batched_decode.__doc__, ops.load_library().tfcomp_sparse_batched_decode.__doc__):
        flat = " ".join(doc.split())
        assert "flush" in flat and "2^-126" in flat and "float16 keeps its subnormals" in flat, flat


def test_float16_keeps_its_subnormals():
    """float16's subnormals (down to 2^-24 = 6e-8) are normal float32 values: sums there stay."""
    values = np.array([1e-5, -5e-6, 6e-8, 3e-5, -3e-5 + 1e-7], np.float16)
    indices = np.array([0, 0, 1, 2, 2], np.int32)
    dense = ops.sparse_batched_decode(values, indices, 3).numpy()
    expected = np.array([values[0] + values[1], values[2], values[3] + values[4]], np.float16)
    assert np.all(np.abs(expected) < np.finfo(np.float16).tiny) and np.all(expected != 0)
    assert_same_bits(dense, expected)


def test_random_subnormal_sums_match_the_reference(rng):
    """Many pairs of magnitudes about float32's smallest normal on few indices: partial sums keep
    entering the subnormal range; the reference flushes each operand and sum."""
    values = (rng.uniform(-3, 3, 4000) * np.finfo(np.float32).tiny).astype(np.float32)
    indices = rng.integers(-1, 50, 4000).astype(np.int32)
    dense = ops.sparse_batched_decode(values, indices, 50).numpy()
    assert_same_bits(dense, ref.sparse_batched_decode(values, indices, 50))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
