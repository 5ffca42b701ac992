"""momentum_accumulate and adam_accumulate against NumPy references: every element bit for bit
(non-finite values and denormals included), with and without a residual, the same results as the
TensorFlow ops they replace, inside a tf.function, and their argument checks."""

import numpy as np
import pytest
import tensorflow as tf

from tests import numpy_reference as ref
from tests.helpers import assert_same_bits, random_gradient
from tfcomp import ops

SHAPES = [(1,), (7,), (1000,), (37, 211), (3, 4, 5), (70_001,)]


def sprinkled(rng, shape, scale=1.0):
    """float32 values of `shape` with NaN, +-Inf, denormals and zeros sprinkled in."""
    x = (random_gradient(rng, shape, np.float32) * np.float32(scale)).astype(np.float32)
    flat = x.reshape(-1)
    if flat.size >= 8:
        spots = rng.choice(flat.size, 6, replace=False)
        flat[spots] = [np.nan, np.inf, -np.inf, 1e-40, -3e-39, 0.0]
    return x


@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_momentum_matches_reference(rng, shape, with_residual):
    g, u = sprinkled(rng, shape), sprinkled(rng, shape, 3.0)
    r = sprinkled(rng, shape, 0.5) if with_residual else None
    mu = float(rng.uniform(0.0, 0.999))
    new_u, accumulated = ops.momentum_accumulate(g, u, mu, residual=r)
    expected_u, expected_accumulated = ref.momentum_accumulate(g, u, mu, r)
    assert new_u.shape == accumulated.shape == shape
    assert_same_bits(new_u.numpy(), expected_u)
    assert_same_bits(accumulated.numpy(), expected_accumulated)


@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_adam_matches_reference(rng, shape, with_residual):
    g, m = sprinkled(rng, shape), sprinkled(rng, shape, 0.1)
    v = np.abs(sprinkled(rng, shape, 0.01))
    r = sprinkled(rng, shape, 0.5) if with_residual else None
    beta_1, beta_2 = float(rng.uniform(0.8, 0.95)), float(rng.uniform(0.99, 0.9999))
    epsilon, t = float(10.0 ** rng.uniform(-8, -3)), int(rng.integers(1, 5000))
    results = ops.adam_accumulate(g, m, v, t, beta_1, beta_2, epsilon, residual=r)
    for result, expected in zip(results, ref.adam_accumulate(g, m, v, t, beta_1, beta_2, epsilon, r)):
        assert result.shape == shape
        assert_same_bits(result.numpy(), expected)


def test_shared_bias_corrections_give_the_same_bits(rng):
    """adam_accumulate with adam_bias_corrections computed once (as the exchange shares them over
    a step's tensors) gives what it gives from the step, also in a tf.function with a tensor step."""
    g, m, r = sprinkled(rng, (3000,)), sprinkled(rng, (3000,), 0.1), sprinkled(rng, (3000,), 0.5)
    v = np.abs(sprinkled(rng, (3000,), 0.01))
    beta_1, beta_2, epsilon = float(rng.uniform(0.8, 0.95)), float(rng.uniform(0.99, 0.9999)), 1e-7
    step = tf.constant(int(rng.integers(1, 5000)), tf.int64)

    @tf.function
    def shared(step):
        return ops.adam_accumulate(g, m, v, None, beta_1, beta_2, epsilon, residual=r,
                                   bias_corrections=ops.adam_bias_corrections(step, beta_1, beta_2))

    for got, want in zip(shared(step), ref.adam_accumulate(g, m, v, int(step), beta_1, beta_2, epsilon, r)):
        assert_same_bits(got.numpy(), want)


@pytest.mark.parametrize("step, corrections", [(None, None), (3, (0.1, 0.01))], ids=["neither", "both"])
def test_adam_needs_exactly_one_of_step_and_corrections(rng, step, corrections):
    g = rng.standard_normal(10).astype(np.float32)
    with pytest.raises(ValueError, match="exactly one of step and bias_corrections"):
        ops.adam_accumulate(g, g, np.abs(g), step, 0.9, 0.999, 1e-7, bias_corrections=corrections)


def test_the_same_as_the_tensorflow_ops_they_replace(rng):
    """What the exchange computed with one TensorFlow op per operation, bit for bit."""
    g, u, r = (rng.standard_normal(50_000).astype(np.float32) for _ in range(3))
    m, v = rng.standard_normal(50_000).astype(np.float32) * 0.1, rng.random(50_000).astype(np.float32) * 0.01
    mu, beta_1, beta_2, epsilon, step = 0.9, 0.9, 0.999, 1e-7, tf.constant(41, tf.int64)

    new_u, accumulated = ops.momentum_accumulate(g, u, mu, residual=r)
    expected_u = mu * tf.constant(u) + g
    assert_same_bits(new_u.numpy(), expected_u.numpy())
    assert_same_bits(accumulated.numpy(), (r + expected_u).numpy())

    t = tf.cast(step + 1, tf.float32)
    expected_m = beta_1 * tf.constant(m) + (1.0 - beta_1) * g
    expected_v = beta_2 * tf.constant(v) + (1.0 - beta_2) * tf.square(g)
    direction = (expected_m / (1.0 - tf.pow(beta_1, t))) / (tf.sqrt(expected_v / (1.0 - tf.pow(beta_2, t))) + epsilon)
    new_m, new_v, accumulated = ops.adam_accumulate(g, m, v, step + 1, beta_1, beta_2, epsilon, residual=r)
    assert_same_bits(new_m.numpy(), expected_m.numpy())
    assert_same_bits(new_v.numpy(), expected_v.numpy())
    assert_same_bits(accumulated.numpy(), (r + direction).numpy())


def test_inside_a_function_with_variables(rng):
    g = rng.standard_normal((64, 33)).astype(np.float32)
    u, r = tf.Variable(rng.standard_normal((64, 33)).astype(np.float32)), tf.Variable(tf.zeros((64, 33)))
    step = tf.Variable(0, dtype=tf.int64)
    m, v = tf.Variable(tf.zeros((64, 33))), tf.Variable(tf.zeros((64, 33)))

    @tf.function
    def accumulate(grad):
        new_u, acc = ops.momentum_accumulate(grad, u, 0.9, residual=r)
        new_m, new_v, direction = ops.adam_accumulate(grad, m, v, step + 1, 0.9, 0.999, 1e-7)
        return new_u, acc, new_m, new_v, direction

    expected = ref.momentum_accumulate(g, u.numpy(), 0.9, r.numpy()) + ref.adam_accumulate(
        g, m.numpy(), v.numpy(), 1, 0.9, 0.999, 1e-7)
    for result, want in zip(accumulate(tf.constant(g)), expected):
        assert_same_bits(result.numpy(), want)


def test_empty_tensors_give_empty_results():
    empty = np.zeros((0, 3), np.float32)
    assert all(t.shape == (0, 3) for t in ops.momentum_accumulate(empty, empty, 0.5, residual=empty))
    assert all(t.shape == (0, 3) for t in ops.adam_accumulate(empty, empty, empty, 1, 0.9, 0.99, 1e-8, residual=empty))


@pytest.mark.parametrize("which", ["momentum", "residual"])
def test_momentum_shape_mismatch_names_the_argument(rng, which):
    g = rng.standard_normal(10).astype(np.float32)
    u = rng.standard_normal(11 if which == "momentum" else 10).astype(np.float32)
    r = rng.standard_normal(9 if which == "residual" else 10).astype(np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"{which} must have the shape of grad"):
        ops.momentum_accumulate(g, u, 0.9, residual=r)


@pytest.mark.parametrize("which", ["m", "v", "residual"])
def test_adam_shape_mismatch_names_the_argument(rng, which):
    g = rng.standard_normal((4, 5)).astype(np.float32)
    shapes = {name: (4, 6) if name == which else (4, 5) for name in ("m", "v", "residual")}
    m, v, r = (rng.standard_normal(shapes[n]).astype(np.float32) for n in ("m", "v", "residual"))
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"{which} must have the shape of grad, \[4,5\], got \[4,6\]"):
        ops.adam_accumulate(g, m, v, 1, 0.9, 0.999, 1e-7, residual=r)


def test_momentum_kernel_names_a_mismatched_momentum(rng):
    g, u = rng.standard_normal(10).astype(np.float32), rng.standard_normal(11).astype(np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"momentum must have the shape of grad, \[10\], got \[11\]"):
        ops.momentum_accumulate(g, u, 0.9)


@pytest.mark.parametrize("name, value, error", [
    ("mu", np.nan, ValueError), ("mu", "0.9", TypeError), ("mu", 1e39, ValueError),
    ("beta_1", np.inf, ValueError), ("beta_2", None, TypeError), ("epsilon", [1e-7], TypeError),
])
def test_bad_coefficients_name_the_argument(rng, name, value, error):
    g = rng.standard_normal(10).astype(np.float32)
    with pytest.raises(error, match=name):
        if name == "mu":
            ops.momentum_accumulate(g, g, value)
        else:
            kwargs = {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7, name: value}
            ops.adam_accumulate(g, g, g, 1, **kwargs)


def test_non_float32_gradient_is_refused(rng):
    g = tf.constant(rng.standard_normal(10))  # float64
    with pytest.raises((TypeError, tf.errors.InvalidArgumentError), match="grad"):
        ops.momentum_accumulate(g, tf.cast(g, tf.float32), 0.9)


def test_shape_function_names_a_mismatch_when_traced(rng):
    @tf.function(input_signature=[tf.TensorSpec([5]), tf.TensorSpec([6])])
    def traced(grad, momentum):
        return ops.momentum_accumulate(grad, momentum, 0.9)

    with pytest.raises(ValueError, match=r"momentum must have the shape of grad, \[5\], got \[6\]"):
        traced.get_concrete_function()


@pytest.mark.parametrize("which", ["m", "v", "residual"])
def test_adam_shape_function_names_a_mismatch_when_traced(which):
    specs = {name: tf.TensorSpec([3, 7] if name == which else [3, 4]) for name in ("m", "v", "residual")}

    @tf.function(input_signature=[tf.TensorSpec([3, 4]), specs["m"], specs["v"], specs["residual"]])
    def traced(grad, m, v, residual):
        return ops.adam_accumulate(grad, m, v, 1, 0.9, 0.999, 1e-7, residual=residual)

    with pytest.raises(ValueError, match=rf"{which} must have the shape of grad, \[3,4\], got \[3,7\]"):
        traced.get_concrete_function()
