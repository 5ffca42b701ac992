"""int_quantize and int_dequantize (IntQuant's kernels) against the NumPy reference, the exact sums
of packed lanes, unbiasedness and the argument checks."""

import numpy as np
import pytest
import tensorflow as tf

from tests import numpy_reference as ref
from tests.helpers import random_gradient
from tfcomp import ops

BITS_AND_LEVELS = [(4, 1), (4, 7), (8, 3), (8, 127), (16, 1000), (16, 32767)]
SIZES = [0, 1, 7, 9, 1029, 70_001]


def gradient_with_specials(rng, size):
    g = random_gradient(rng, (size,), np.float32)
    if size >= 6:
        g[rng.choice(size, 6, replace=False)] = [np.nan, np.inf, -np.inf, 1e-40, -1e-40, 0.0]
    return g


@pytest.mark.parametrize("bits, levels", BITS_AND_LEVELS)
@pytest.mark.parametrize("size", SIZES)
def test_quantize_matches_reference(rng, bits, levels, size):
    g = gradient_with_specials(rng, size)
    finite = g[np.isfinite(g)]
    scale = np.float32((np.max(np.abs(finite)) if finite.size else 1.0) * rng.uniform(0.5, 2.0))  # some clamp
    seed = int(rng.integers(-(2**63), 2**63 - 1))
    lanes = ops.int_quantize(g, scale, seed, bits, levels).numpy()
    assert lanes.dtype == np.int32 and lanes.shape == (-(-size // (32 // bits)),)
    np.testing.assert_array_equal(lanes, ref.int_quantize(g, scale, seed, bits, levels))


@pytest.mark.parametrize("scale", [0.0, -1.0, np.inf, np.nan])
def test_a_scale_that_is_not_positive_and_finite_gives_zeros(rng, scale):
    lanes = ops.int_quantize(random_gradient(rng, (100,), np.float32), scale, 5, 8, 10).numpy()
    assert np.all(lanes == 0)


@pytest.mark.parametrize("bits, levels", BITS_AND_LEVELS)
@pytest.mark.parametrize("size", SIZES)
def test_dequantize_matches_reference_on_any_lanes(rng, bits, levels, size):
    lanes = rng.integers(-(2**31), 2**31, size=-(-size // (32 // bits))).astype(np.int32)
    step = np.float32(rng.uniform(1e-4, 1.0))
    dense = ops.int_dequantize(lanes, step, bits, size).numpy()
    assert dense.dtype == np.float32 and dense.shape == (size,)
    np.testing.assert_array_equal(dense, ref.int_dequantize(lanes, step, bits, size))


@pytest.mark.parametrize("bits, workers", [(4, 7), (8, 2), (8, 127), (16, 3)])
def test_summed_lanes_dequantize_to_the_summed_levels(rng, bits, workers):
    """Lanes of K workers summed in int32 (the allreduce) unpack to the sum of their levels exactly,
    also where every worker sits at +-levels (the largest sums the fields hold).

    The negative extremes lie 1/256 beyond -scale and are clamped: at exactly -scale, -levels + u
    rounds in float32 to -levels + 1 when the noise u is within half a spacing of 1 (at 16 bits a
    spacing is 2^-10), which is the op's float32 stochastic rounding, not an overflow."""
    levels = (2 ** (bits - 1) - 1) // workers
    size = 1003
    grads = [random_gradient(rng, (size,), np.float32) for _ in range(workers)]
    scale = np.float32(max(np.max(np.abs(g)) for g in grads))
    for g in grads:
        g[:50] = np.where(np.arange(50) % 2, scale, -scale * np.float32(1 + 2**-8))
    seed = int(rng.integers(2**40))
    lanes = [ops.int_quantize(g, scale, seed + w, bits, levels).numpy().astype(np.int64) for w, g in enumerate(grads)]
    total = np.sum(lanes, axis=0)
    assert np.all(np.abs(total) < 2**31)
    single = [ref.int_dequantize(lane.astype(np.int32), 1.0, bits, size) for lane in lanes]
    levels_sum = np.sum(single, axis=0)
    assert np.all(np.abs(levels_sum[:50]) == workers * levels)
    step = np.float32(scale / levels)
    dense = ops.int_dequantize(total.astype(np.int32), step, bits, size).numpy()
    np.testing.assert_array_equal(dense, (levels_sum.astype(np.float32) * step).astype(np.float32))


def test_levels_are_unbiased(rng):
    g = random_gradient(rng, (200,), np.float32)
    scale, levels, trials = np.float32(np.max(np.abs(g))), 5, 500
    decoded = np.stack([ops.int_dequantize(ops.int_quantize(g, scale, seed, 8, levels), scale / levels, 8, 200).numpy()
                        for seed in range(trials)])
    step = scale / levels
    assert np.all(np.abs(decoded - g) <= step * (1 + 1e-5))
    assert np.max(np.abs(decoded.mean(axis=0) - g)) <= 5 * step / (2 * np.sqrt(trials))


def test_seed_draws_the_noise(rng):
    g = random_gradient(rng, (5000,), np.float32)
    scale = np.float32(np.max(np.abs(g)))
    first, again, other = (ops.int_quantize(g, scale, s, 8, 20).numpy() for s in (1, 1, 2))
    np.testing.assert_array_equal(first, again)
    assert np.mean(first != other) > 0.3


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda g: ops.int_quantize(g, 1.0, 1, 5, 1), ValueError, r"bits must be 4, 8 or 16, got 5"),
        (lambda g: ops.int_quantize(g, 1.0, 1, 8, 0), ValueError, r"levels must be in \[1, 127\], got 0"),
        (lambda g: ops.int_quantize(g, 1.0, 1, 4, 8), ValueError, r"levels must be in \[1, 7\], got 8"),
        (lambda g: ops.int_quantize(g, [1.0, 2.0], 1, 8, 3), tf.errors.InvalidArgumentError,
         r"scale must be a scalar, got shape \[2\]"),
        (lambda g: ops.int_quantize(g, 1.0, [1, 2], 8, 3), tf.errors.InvalidArgumentError,
         r"seed must be a scalar, got shape \[2\]"),
        (lambda g: ops.int_dequantize(np.zeros(3, np.int32), 1.0, 8, 100), tf.errors.InvalidArgumentError,
         r"lanes must be a vector of 25 \(size 100 at bits=8\), got shape \[3\]"),
        (lambda g: ops.int_dequantize(np.zeros(25, np.int32), 1.0, True, 100), ValueError, r"bits must be 4, 8 or 16"),
        (lambda g: ops.int_dequantize(np.zeros(25, np.int32), 1.0, 8, -1), ValueError,
         r"size must be in \[0, 2147483647\], got -1"),
    ],
)
def test_bad_arguments_name_the_argument(rng, call, error, message):
    with pytest.raises(error, match=message):
        call(random_gradient(rng, (100,), np.float32))


def test_kernels_check_bits_and_levels_without_the_wrapper():
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"levels must be in \[1, 7\] for bits=4, got 9"):
        ops.load_library().tfcomp_int_quantize([1.0], 1.0, tf.constant(1, tf.int64), bits=4, levels=9)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"bits must be 4, 8 or 16, got 3"):
        ops.load_library().tfcomp_int_dequantize([1], 1.0, bits=3, size=1)


def test_runs_inside_tf_function(rng):
    g = random_gradient(rng, (3001,), np.float32)
    scale = np.float32(np.max(np.abs(g)))
    graph = tf.function(lambda g, seed: ops.int_dequantize(ops.int_quantize(g, scale, seed, 4, 3), scale / 3, 4, 3001))
    expected = ref.int_dequantize(ref.int_quantize(g, scale, 9, 4, 3), np.float32(scale / 3), 4, 3001)
    np.testing.assert_array_equal(graph(g, tf.constant(9, tf.int64)).numpy(), expected)
