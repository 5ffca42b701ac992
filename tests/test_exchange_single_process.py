"""tfcomp.GradientExchange in one process: Horovod initialised in-process as a world of size 1, the
exchange called directly as `exchange(grads, vars)`, its collectives running over that one rank.

With one worker the reduced gradient of a compressed tensor is exactly what this worker sent, so error
feedback must conserve every element's mass: reduced + new residual == gradient + old residual.
"""

import math
import sys

import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf

import tfcomp
from tests.helpers import assert_same_bits, random_gradient

MIN_ELEMENTS = 1000
# name -> shape; the first three are compressed (>= MIN_ELEMENTS elements), the last two go dense.
SHAPES = {"kernel": (40, 50), "long": (3001,), "cube": (7, 11, 13), "bias": (10,), "small": (5, 6)}
COMPRESSED = ("kernel", "long", "cube")
DENSE = ("bias", "small")
EMBEDDING_SHAPE = (20, 8)
RATIO = 0.05

COMPRESSORS = {
    "DRAGONN": lambda **kw: tfcomp.DRAGONN(RATIO, planning="off", min_elements=MIN_ELEMENTS, **kw),
    "DRAGONN-sampled": lambda **kw: tfcomp.DRAGONN(RATIO, num_samples=300, slots_per_element=2, planning="off", min_elements=MIN_ELEMENTS, **kw),
    "DGC": lambda **kw: tfcomp.DGC(RATIO, planning="off", min_elements=MIN_ELEMENTS, **kw),
    "TopK": lambda **kw: tfcomp.TopK(RATIO, planning="off", min_elements=MIN_ELEMENTS, **kw),
    "RandomK": lambda **kw: tfcomp.RandomK(RATIO, planning="off", min_elements=MIN_ELEMENTS, **kw),
    "EFSignSGD": lambda **kw: tfcomp.EFSignSGD(planning="off", min_elements=MIN_ELEMENTS, **kw),
    "QSGD": lambda **kw: tfcomp.QSGD(4, error_feedback=True, planning="off", min_elements=MIN_ELEMENTS, **kw),
    "IntQuant": lambda **kw: tfcomp.IntQuant(4, planning="off", min_elements=MIN_ELEMENTS, **kw),
    "DRAGONN-partitioned": lambda **kw: tfcomp.DRAGONN(RATIO, planning="off", min_elements=MIN_ELEMENTS,
                                                       strategy="partitioned", **kw),
}
SPARSIFIERS = ("DRAGONN", "DRAGONN-sampled", "DGC", "TopK", "RandomK")


@pytest.fixture(scope="module", autouse=True)
def horovod_world_of_one():
    hvd.init()
    assert hvd.size() == 1 and hvd.rank() == 0
    yield


class Problem:
    """Variables of several shapes (three compressed, two dense) and an embedding whose gradient is a
    tf.IndexedSlices; fresh random gradients for them on every `grads()`."""

    def __init__(self, rng, with_embedding=True):
        self.rng = rng
        self.vars = {name: tf.Variable(tf.zeros(shape), name=name) for name, shape in SHAPES.items()}
        self.embedding = tf.Variable(tf.zeros(EMBEDDING_SHAPE), name="embedding") if with_embedding else None

    def variables(self):
        return list(self.vars.values()) + ([self.embedding] if self.embedding is not None else [])

    def grads(self):
        """{name: float32 array} and, with an embedding, the IndexedSlices last."""
        grads = {name: random_gradient(self.rng, shape, np.float32) for name, shape in SHAPES.items()}
        slices = None
        if self.embedding is not None:
            rows = self.rng.integers(0, EMBEDDING_SHAPE[0], size=6)  # duplicates allowed
            slices = tf.IndexedSlices(tf.constant(random_gradient(self.rng, (6, EMBEDDING_SHAPE[1]), np.float32)),
                                      tf.constant(rows, tf.int64), tf.constant(EMBEDDING_SHAPE, tf.int64))
        return grads, slices

    def call(self, exchange, grads, slices):
        """Runs the exchange; returns ({name: reduced array}, reduced IndexedSlices or None)."""
        tensors = [tf.constant(grads[name]) for name in SHAPES] + ([slices] if slices is not None else [])
        out = exchange(tensors, self.variables())
        assert len(out) == len(tensors)
        reduced = {name: out[i] for i, name in enumerate(SHAPES)}
        for name, r in reduced.items():
            assert isinstance(r, tf.Tensor) and r.dtype == tf.float32 and tuple(r.shape) == SHAPES[name]
        return {name: r.numpy() for name, r in reduced.items()}, (out[-1] if slices is not None else None)


def size_of(name):
    return math.prod(SHAPES[name])


def residual(exchange, var):
    return exchange.memory.residual(var, var.shape.num_elements()).numpy().reshape(var.shape)


def momentum(exchange, var):
    return exchange.memory.momentum(var, var.shape.num_elements()).numpy().reshape(var.shape)


def second_moment(exchange, var):
    return exchange.memory.second_moment(var, var.shape.num_elements()).numpy().reshape(var.shape)


def assert_slices_pass_through(reduced, slices):
    assert isinstance(reduced, tf.IndexedSlices)
    np.testing.assert_array_equal(reduced.indices.numpy(), slices.indices.numpy())
    assert_same_bits(reduced.values.numpy(), slices.values.numpy())
    np.testing.assert_array_equal(reduced.dense_shape.numpy(), EMBEDDING_SHAPE)


def assert_looks_compressed(compressor, reduced, accumulated):
    """reduced is one worker's payload of `accumulated`, not the dense tensor."""
    flat, acc = reduced.reshape(-1), accumulated.reshape(-1).astype(np.float64)
    name = type(compressor).__name__
    if name in ("DRAGONN", "DGC", "TopK", "RandomK"):
        limit = compressor.payload_bytes(acc.size) // (4 if name == "RandomK" else 8)  # entries sent
        assert 1 <= np.count_nonzero(flat) <= limit
    elif name == "EFSignSGD":
        np.testing.assert_allclose(np.abs(flat), np.mean(np.abs(acc)), rtol=1e-5)
        assert np.all((flat >= 0) == (acc >= 0))
    elif name == "IntQuant":  # one worker: the scale is its own largest |x|
        step = np.max(np.abs(acc)) / compressor.levels(1)
        levels = flat / step
        np.testing.assert_allclose(levels, np.round(levels), atol=1e-3)
        assert np.all(np.abs(flat - acc) <= step * (1 + 1e-4))
    elif name == "QSGD":
        step = np.linalg.norm(acc) / (2**compressor.bits - 1)
        levels = flat / step
        np.testing.assert_allclose(levels, np.round(levels), atol=1e-3)
        assert np.all(np.abs(flat - acc) <= step * (1 + 1e-4))
    else:
        raise AssertionError(name)


def assert_mass_conserved(name, reduced, new_residual, expected_total):
    """reduced + new_residual == expected_total; for sparsifiers exactly and on disjoint supports."""
    scale = float(np.max(np.abs(expected_total)))
    np.testing.assert_allclose(reduced + new_residual, expected_total, rtol=1e-6, atol=1e-6 * scale)
    if name in SPARSIFIERS:
        sent = reduced != 0
        np.testing.assert_array_equal(new_residual[sent], 0.0)
        np.testing.assert_array_equal(reduced[sent], expected_total[sent])
        np.testing.assert_array_equal(new_residual[~sent], expected_total[~sent])


# -- (a) error feedback conserves mass, (d) small tensors dense, IndexedSlices ------------------------


@pytest.mark.parametrize("name", list(COMPRESSORS))
def test_error_feedback_conserves_mass(rng, name):
    compressor = COMPRESSORS[name]()
    exchange = tfcomp.GradientExchange(compressor)
    problem = Problem(rng)
    old = {n: np.zeros(SHAPES[n], np.float32) for n in COMPRESSED}
    for step in range(4):
        grads, slices = problem.grads()
        reduced, reduced_slices = problem.call(exchange, grads, slices)
        assert int(exchange.step.numpy()) == step + 1
        for n in COMPRESSED:
            new = residual(exchange, problem.vars[n])
            accumulated = grads[n] + old[n]  # float32, as the exchange adds them
            assert_mass_conserved(name, reduced[n], new, accumulated)
            assert_looks_compressed(compressor, reduced[n], accumulated)
            old[n] = new
        for n in DENSE:  # (d): exactly what the dense allreduce of one worker returns
            assert_same_bits(reduced[n], grads[n])
        assert_slices_pass_through(reduced_slices, slices)
    # Memory exists for the compressed tensors only (no residual for dense tensors or slices).
    assert sorted(v.shape.num_elements() for v in exchange.memory.residuals) == sorted(size_of(n) for n in COMPRESSED)
    assert all(m.shape.num_elements() == 0 for m in exchange.memory.momenta)


def momentum_corrected_steps(name, exchange, problem, factor, steps=4):
    """Steps `exchange` (momentum correction `factor`) on fresh gradients and yields, for each
    step, (grads, slices, reduced, reduced_slices, {compressed tensor: (u_new, u_stored)}), with
    u_new = factor u_old + g (u_old the momentum stored the step before), once it has checked the
    mass of every compressed tensor: what was sent plus the new residual v is v_old + u_new."""
    u_old = {n: np.zeros(SHAPES[n], np.float32) for n in COMPRESSED}
    v_old = {n: np.zeros(SHAPES[n], np.float32) for n in COMPRESSED}
    for _ in range(steps):
        grads, slices = problem.grads()
        reduced, reduced_slices = problem.call(exchange, grads, slices)
        moments = {}
        for n in COMPRESSED:
            var = problem.vars[n]
            u_new = np.float32(factor) * u_old[n] + grads[n]
            v_new, u_stored = residual(exchange, var), momentum(exchange, var)
            assert_mass_conserved(name, reduced[n], v_new, v_old[n] + u_new)
            moments[n] = (u_new, u_stored)
            u_old[n], v_old[n] = u_stored, v_new
        yield grads, slices, reduced, reduced_slices, moments


@pytest.mark.parametrize("name", ["EFSignSGD", "QSGD", "IntQuant"])
def test_quantisers_keep_the_momentum(rng, name):
    """Momentum correction with a quantiser: u <- 0.9 u + g; v <- v + u; v less what was sent is
    kept, and u is kept whole (no factor masking, which for a quantiser sending nearly every
    element would clear it almost everywhere), so what the steps send adds up to momentum SGD's
    updates."""
    factor = 0.9
    exchange = tfcomp.GradientExchange(COMPRESSORS[name](momentum=factor))
    for *_, moments in momentum_corrected_steps(name, exchange, Problem(rng), factor):
        for u_new, u_stored in moments.values():
            np.testing.assert_allclose(u_stored, u_new, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["DGC", "DRAGONN", "TopK", "RandomK"])
def test_momentum_correction(rng, name):
    """DGC momentum correction: u <- 0.9 u + g; v <- v + u; send part of v; v and u are zeroed where
    something was sent: sent + v_new == v_old + u_new, u_stored == u_new where nothing was sent.
    Tensors the plan sends dense (too small to compress) get the momentum too: they send u_new and
    keep it (momentum SGD), so momentum correction never drops the momentum of what goes dense."""
    factor = 0.9
    exchange = tfcomp.GradientExchange(COMPRESSORS[name](momentum=factor))
    problem = Problem(rng)
    u_dense = {n: np.zeros(SHAPES[n], np.float32) for n in DENSE}
    for grads, slices, reduced, reduced_slices, moments in momentum_corrected_steps(name, exchange, problem, factor):
        for n, (u_new, u_stored) in moments.items():
            sent = reduced[n] != 0
            assert np.any(sent) and not np.all(sent)
            np.testing.assert_array_equal(u_stored[sent], 0.0)
            np.testing.assert_allclose(u_stored[~sent], u_new[~sent], rtol=1e-6, atol=1e-6)
        for n in DENSE:
            u_new = np.float32(factor) * u_dense[n] + grads[n]
            np.testing.assert_allclose(reduced[n], u_new, rtol=1e-6, atol=1e-6)
            np.testing.assert_array_equal(residual(exchange, problem.vars[n]), 0.0)
            np.testing.assert_allclose(momentum(exchange, problem.vars[n]), u_new, rtol=1e-6, atol=1e-6)
            u_dense[n] = u_new
        assert_slices_pass_through(reduced_slices, slices)  # IndexedSlices: no momentum


@pytest.mark.parametrize("name", ["DRAGONN", "DGC", "TopK", "RandomK", "EFSignSGD"])
def test_adam_correction(rng, name):
    """Adam correction: m <- b1 m + (1 - b1) g and v <- b2 v + (1 - b2) g^2 are kept whole (never
    masked); the residual accumulates d = m^ / (sqrt(v^) + eps) at step t (bias correction
    1 - b^t): sent + r_new == r_old + d, r_new zero where a sparsifier sent. Tensors the plan
    sends dense send d and keep no residual (an all-dense plan is Adam)."""
    beta_1, beta_2, epsilon = 0.8, 0.95, 1e-3
    exchange = tfcomp.GradientExchange(COMPRESSORS[name](adam=(beta_1, beta_2, epsilon)))
    problem = Problem(rng)
    m = {n: np.zeros(SHAPES[n], np.float64) for n in SHAPES}
    v = {n: np.zeros(SHAPES[n], np.float64) for n in SHAPES}
    r_old = {n: np.zeros(SHAPES[n], np.float32) for n in COMPRESSED}
    for t in range(1, 5):
        grads, slices = problem.grads()
        reduced, reduced_slices = problem.call(exchange, grads, slices)
        for n in SHAPES:
            g = grads[n].astype(np.float64)
            m[n] = beta_1 * m[n] + (1 - beta_1) * g
            v[n] = beta_2 * v[n] + (1 - beta_2) * g * g
            d = (m[n] / (1 - beta_1**t)) / (np.sqrt(v[n] / (1 - beta_2**t)) + epsilon)
            var = problem.vars[n]
            np.testing.assert_allclose(momentum(exchange, var), m[n], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(second_moment(exchange, var), v[n], rtol=1e-5, atol=1e-7)
            if n in DENSE:
                np.testing.assert_allclose(reduced[n], d, rtol=1e-4, atol=1e-5)
                np.testing.assert_array_equal(residual(exchange, var), 0.0)
                continue
            r_new = residual(exchange, var)
            np.testing.assert_allclose(reduced[n] + r_new, r_old[n] + d, rtol=1e-4, atol=1e-4)
            assert_looks_compressed(exchange.compressor, reduced[n], r_old[n] + d)
            if name in SPARSIFIERS:
                sent = reduced[n] != 0
                assert np.any(sent) and not np.all(sent)
                np.testing.assert_array_equal(r_new[sent], 0.0)
            r_old[n] = r_new
        assert_slices_pass_through(reduced_slices, slices)  # IndexedSlices: no correction
    # Memory for every planned tensor (the dense ones keep their moments), none for the IndexedSlices.
    assert len(exchange.memory.residuals) == len(exchange.memory.second_moments) == len(SHAPES)


@pytest.mark.parametrize("kwargs, message", [
    ({"adam": 0.9}, "adam must be None, True"), ({"adam": (0.9, 1.0, 1e-7)}, "adam must be"),
    ({"adam": (0.9, 0.999, 0.0)}, "adam must be"), ({"adam": (0.9, 0.999)}, "adam must be"),
    ({"adam": True, "momentum": 0.9}, "give one, got both"), ({"adam": True, "error_feedback": False}, "needs error_feedback"),
])
def test_adam_correction_arguments_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tfcomp.DRAGONN(0.01, **kwargs)
    assert tfcomp.DRAGONN(0.01, adam=True).adam == (0.9, 0.999, 1e-7)
    assert tfcomp.DRAGONN(0.01, adam=True).optimizer_state == 2
    assert tfcomp.DRAGONN(0.01, momentum=0.9).optimizer_state == 1


# -- (b) dense compressors -------------------------------------------------------------------------


@pytest.mark.parametrize("compressor", [tfcomp.NoCompression(), tfcomp.FP16()], ids=lambda c: type(c).__name__)
@pytest.mark.parametrize("op", [hvd.Average, hvd.Sum], ids=["Average", "Sum"])
def test_dense_compressors_give_the_gradient_back(rng, compressor, op):
    exchange = tfcomp.GradientExchange(compressor, op=op)
    problem = Problem(rng)
    for step in range(2):
        grads, slices = problem.grads()
        reduced, reduced_slices = problem.call(exchange, grads, slices)
        for n in SHAPES:
            # An all-dense plan runs Horovod's own reduction, which in a world of one gives every gradient back
            # as it is (no collective, so no fp16 round trip either), as stock Horovod with Compression.fp16 does.
            assert_same_bits(reduced[n], grads[n])
        assert_slices_pass_through(reduced_slices, slices)
        assert int(exchange.step.numpy()) == step + 1
    assert len(exchange.memory.residuals) == 0
    strategies = {r.strategy for r in exchange.records}
    assert strategies == {"sparse allgather", "fp16 allreduce" if isinstance(compressor, tfcomp.FP16) else "allreduce"}


@pytest.mark.parametrize("name", list(COMPRESSORS))
def test_sum_equals_average_for_one_worker(rng, name):
    problem = Problem(rng, with_embedding=False)
    grads, _ = problem.grads()
    average, _ = problem.call(tfcomp.GradientExchange(COMPRESSORS[name]()), grads, None)
    total, _ = problem.call(tfcomp.GradientExchange(COMPRESSORS[name](), op=hvd.Sum), grads, None)
    for n in SHAPES:
        assert_same_bits(total[n], average[n])


# -- (c) DRAGONN with room for everything ------------------------------------------------------------


def test_dragonn_with_ratio_one_and_many_slots_sends_everything(rng):
    # 4 elements into 4 * 2**18 slots: a collision has probability about 6 / 2**20.
    exchange = tfcomp.GradientExchange(tfcomp.DRAGONN(1.0, slots_per_element=2**18, planning="off", min_elements=1))
    var = tf.Variable(tf.zeros([2, 2]))
    for _ in range(2):
        g = random_gradient(rng, (2, 2), np.float32)
        (reduced,) = exchange([tf.constant(g)], [var])
        assert_same_bits(reduced.numpy(), g)
        np.testing.assert_array_equal(residual(exchange, var), 0.0)


def test_dragonn_with_ratio_one_loses_only_collisions(rng):
    size, slots_per_element = 1000, 64
    exchange = tfcomp.GradientExchange(tfcomp.DRAGONN(1.0, slots_per_element=slots_per_element, planning="off", min_elements=1))
    var = tf.Variable(tf.zeros([size]))
    old = np.zeros(size, np.float32)
    for _ in range(3):
        g = random_gradient(rng, (size,), np.float32)
        (reduced,) = exchange([tf.constant(g)], [var])
        reduced, new = reduced.numpy(), residual(exchange, var)
        assert_mass_conserved("DRAGONN", reduced, new, g + old)
        # Everything is selected; only elements that lost a slot collision stay behind. Expected losses
        # about size / (2 * slots_per_element) = 8; far more would mean elements are dropped.
        lost = np.count_nonzero(new)
        assert lost <= 60, lost
        old = new


# -- (d) tensors below min_elements ---------------------------------------------------------------


@pytest.mark.parametrize("name", list(COMPRESSORS))
def test_small_tensors_go_dense_and_have_no_residual(rng, name):
    exchange = tfcomp.GradientExchange(COMPRESSORS[name]())
    shapes = [(MIN_ELEMENTS - 1,), (3, 7), (1,)]
    variables = [tf.Variable(tf.zeros(s)) for s in shapes]
    for _ in range(2):
        grads = [random_gradient(rng, s, np.float32) for s in shapes]
        out = exchange([tf.constant(g) for g in grads], variables)
        for g, r in zip(grads, out):
            assert_same_bits(r.numpy(), g)
    assert len(exchange.memory.residuals) == 0
    assert [r.strategy for r in exchange.records] == ["allreduce"] * 3


def test_records_describe_each_tensor(rng):
    compressor = COMPRESSORS["DRAGONN"]()
    exchange = tfcomp.GradientExchange(compressor)
    problem = Problem(rng)
    assert "no gradients" in exchange.describe()
    problem.call(exchange, *problem.grads())
    records = {r.name.split(":")[0]: r for r in exchange.records}
    for n in COMPRESSED:
        assert records[n].strategy == "DRAGONN allgather" and records[n].elements == size_of(n)
        assert records[n].dense_bytes == 4 * size_of(n) and records[n].sent_bytes == compressor.payload_bytes(size_of(n))
    for n in DENSE:
        assert records[n].strategy == "allreduce" and records[n].sent_bytes == records[n].dense_bytes == 4 * size_of(n)
    assert records["embedding"].strategy == "sparse allgather"
    assert "total" in exchange.describe()


def test_argument_checks(rng):
    with pytest.raises(ValueError, match="op"):
        tfcomp.GradientExchange(tfcomp.DRAGONN(), op=hvd.Adasum)
    exchange = tfcomp.GradientExchange(tfcomp.DRAGONN())
    with pytest.raises(ValueError, match="variables"):
        exchange([tf.zeros([3])])


def test_calibration_has_nothing_to_run_on_one_worker(rng):
    exchange = tfcomp.GradientExchange(tfcomp.DRAGONN(0.01))
    with pytest.raises(RuntimeError, match="after that call"):
        exchange.calibrate()
    variable = tf.Variable(tf.zeros([5000]))
    g = random_gradient(rng, (5000,), np.float32)
    out = exchange([tf.constant(g)], [variable])
    assert not exchange.calibration_pending and exchange.calibrate_step() is False and exchange.calibrate() is False
    np.testing.assert_allclose(out[0].numpy() + residual(exchange, variable), g)


def test_none_gradients_pass_through(rng):
    exchange = tfcomp.GradientExchange(COMPRESSORS["TopK"]())
    big, small = tf.Variable(tf.zeros([2000])), tf.Variable(tf.zeros([5]))
    g = random_gradient(rng, (2000,), np.float32)
    out = exchange([None, tf.constant(g)], [small, big])
    assert out[0] is None
    np.testing.assert_allclose(out[1].numpy() + residual(exchange, big), g)


def test_a_variable_can_join_on_a_later_call(rng):
    exchange = tfcomp.GradientExchange(COMPRESSORS["TopK"]())
    first, late = tf.Variable(tf.zeros([2000])), tf.Variable(tf.zeros([3000]))
    exchange([tf.constant(random_gradient(rng, (2000,), np.float32))], [first])
    g = random_gradient(rng, (3000,), np.float32)
    out = exchange([tf.constant(random_gradient(rng, (2000,), np.float32)), tf.constant(g)], [first, late])
    np.testing.assert_allclose(out[1].numpy() + residual(exchange, late), g)


# -- (e) warm-up -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["DRAGONN", "TopK", "EFSignSGD", "DGC-momentum"])
def test_warmup_sends_dense_then_compresses(rng, name):
    compressor = (COMPRESSORS["DGC"](momentum=0.9, warmup_steps=2) if name == "DGC-momentum"
                  else COMPRESSORS[name](warmup_steps=2))
    with_momentum = compressor.momentum is not None
    exchange = tfcomp.GradientExchange(compressor)
    problem = Problem(rng)
    # A residual left from earlier (as after a restore): warm-up sends it along and clears it.
    leftover = {}
    for n in COMPRESSED:
        var = problem.vars[n]
        leftover[n] = random_gradient(rng, SHAPES[n], np.float32)
        exchange.memory.residual(var, size_of(n), compressor.optimizer_state).assign(leftover[n].reshape(-1))
        if with_momentum:
            exchange.memory.momentum(var, size_of(n)).assign(random_gradient(rng, (size_of(n),), np.float32))
    for step in range(2):
        grads, slices = problem.grads()
        momenta = {n: momentum(exchange, problem.vars[n]) for n in SHAPES} if with_momentum else None
        reduced, reduced_slices = problem.call(exchange, grads, slices)
        for n in COMPRESSED:
            expected = grads[n] + leftover[n]
            if with_momentum:
                expected = leftover[n] + (np.float32(0.9) * momenta[n] + grads[n])
            np.testing.assert_allclose(reduced[n], expected, rtol=1e-6, atol=1e-6)
            leftover[n] = np.zeros(SHAPES[n], np.float32)
            np.testing.assert_array_equal(residual(exchange, problem.vars[n]), 0.0)
            if with_momentum:  # sent dense: the momentum is kept (momentum SGD), not masked
                np.testing.assert_allclose(momentum(exchange, problem.vars[n]), np.float32(0.9) * momenta[n] + grads[n],
                                           rtol=1e-6, atol=1e-6)
        for n in DENSE:
            if with_momentum:
                np.testing.assert_allclose(reduced[n], np.float32(0.9) * momenta[n] + grads[n], rtol=1e-6, atol=1e-6)
            else:
                assert_same_bits(reduced[n], grads[n])
        assert_slices_pass_through(reduced_slices, slices)
        assert int(exchange.step.numpy()) == step + 1
    grads, slices = problem.grads()
    momenta = {n: momentum(exchange, problem.vars[n]) for n in COMPRESSED} if with_momentum else None
    reduced, _ = problem.call(exchange, grads, slices)
    for n in COMPRESSED:
        new = residual(exchange, problem.vars[n])
        # The residual is empty after warm-up; the momentum carries on.
        accumulated = np.float32(0.9) * momenta[n] + grads[n] if with_momentum else grads[n]
        assert_mass_conserved(name if name in SPARSIFIERS else "", reduced[n], new, accumulated)
        assert np.count_nonzero(new) > 0
        assert_looks_compressed(compressor, reduced[n], accumulated)


# -- (f) non-finite gradients ----------------------------------------------------------------------

NAN_CASES = {
    "DRAGONN": lambda: COMPRESSORS["DRAGONN"](),
    "DGC": lambda: COMPRESSORS["DGC"](),  # NaN at index 0: within the first k selected, so sent
    "DGC-momentum": lambda: COMPRESSORS["DGC"](momentum=0.9),
    "TopK": lambda: COMPRESSORS["TopK"](),
    "RandomK": lambda: COMPRESSORS["RandomK"](),  # NaN at an index drawn that step (see below)
    "EFSignSGD": lambda: COMPRESSORS["EFSignSGD"](),
    "QSGD": lambda: COMPRESSORS["QSGD"](),
    "DRAGONN-warmup": lambda: COMPRESSORS["DRAGONN"](warmup_steps=2),
    # The flag of a payload that need not show its NaN reaches the sum through the allgather's flag rows.
    "DGC-partitioned": lambda: COMPRESSORS["DGC"](strategy="partitioned", union_limit=0.5),
}


def drawn_indices(rng, compressor, target, step):
    """The flat indices of SHAPES[target] a RandomK exchange sends at `step`: they depend only on the
    step, the tensor's position among the compressed ones and its size, so a dry run shows them."""
    dry = tfcomp.GradientExchange(type(compressor)(**compressor.get_config()))
    problem = Problem(rng)
    for _ in range(step + 1):
        grads, slices = problem.grads()
        reduced, _ = problem.call(dry, grads, slices)
    return np.flatnonzero(reduced[target].reshape(-1))


def memory_snapshot(exchange):
    return [v.numpy().copy() for v in exchange.memory.residuals] + [m.numpy().copy() for m in exchange.memory.momenta]


def assert_memory_unchanged(exchange, before):
    after = memory_snapshot(exchange)
    assert len(after) == len(before)
    for a, b in zip(after, before):
        assert_same_bits(a, b)


@pytest.mark.parametrize("bad", [np.nan, np.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("case", list(NAN_CASES))
def test_non_finite_gradient_leaves_memory_unchanged(rng, case, bad):
    compressor = NAN_CASES[case]()
    exchange = tfcomp.GradientExchange(compressor)
    problem = Problem(rng)
    problem.call(exchange, *problem.grads())  # a step that leaves residuals
    if compressor.warmup_steps:
        problem.call(exchange, *problem.grads())
        problem.call(exchange, *problem.grads())
    before = memory_snapshot(exchange)
    assert any(np.any(b != 0) for b in before)
    grads, slices = problem.grads()
    target = "long"
    position = int(rng.integers(size_of(target)))
    if case.startswith("DGC"):
        position = 0  # within the first k selected elements in index order, so it is sent
    elif case == "RandomK":
        position = int(rng.choice(drawn_indices(rng, compressor, target, int(exchange.step.numpy()))))
    grads[target].reshape(-1)[position] = bad
    step = int(exchange.step.numpy())
    reduced, _ = problem.call(exchange, grads, slices)
    assert not np.all(np.isfinite(reduced[target]))
    assert_memory_unchanged(exchange, before)
    assert int(exchange.step.numpy()) == step + 1  # the step counter still advances
    if compressor.momentum is not None:
        return  # the momentum bookkeeping of the next step is test_momentum_correction's
    # The next finite step goes on from the kept residuals.
    old = {n: residual(exchange, problem.vars[n]) for n in COMPRESSED}
    grads, slices = problem.grads()
    reduced, _ = problem.call(exchange, grads, slices)
    for n in COMPRESSED:
        assert_mass_conserved(case.split("-")[0], reduced[n], residual(exchange, problem.vars[n]), grads[n] + old[n])


@pytest.mark.parametrize("where", ["dense", "slices"])
def test_non_finite_dense_or_sparse_gradient_leaves_memory_unchanged(rng, where):
    exchange = tfcomp.GradientExchange(COMPRESSORS["TopK"]())
    problem = Problem(rng)
    problem.call(exchange, *problem.grads())
    before = memory_snapshot(exchange)
    grads, slices = problem.grads()
    if where == "dense":
        grads["bias"][3] = np.nan
    else:
        values = slices.values.numpy()
        values[2, 1] = np.nan
        slices = tf.IndexedSlices(tf.constant(values), slices.indices, slices.dense_shape)
    reduced, reduced_slices = problem.call(exchange, grads, slices)
    if where == "dense":
        assert np.isnan(reduced["bias"][3])
    else:
        assert not np.all(np.isfinite(reduced_slices.values.numpy()))
    assert_memory_unchanged(exchange, before)


@pytest.mark.parametrize("case", ["RandomK", "DGC"])
def test_non_finite_element_that_is_not_sent_still_reaches_the_sum_and_spares_memory(rng, case):
    """A NaN the compressor does not send (RandomK: not drawn; DGC: beyond the first k selected) still
    makes the reduced tensor non-finite, as a dense allreduce would, and never enters the residual."""
    size = 3000
    first_grad = random_gradient(rng, (size,), np.float32)
    second_grad = random_gradient(rng, (size,), np.float32)

    def run(second):
        exchange = tfcomp.GradientExchange(COMPRESSORS[case]())
        var = tf.Variable(tf.zeros([size]))
        exchange([tf.constant(first_grad)], [var])
        before = residual(exchange, var)
        (reduced,) = exchange([tf.constant(second)], [var])
        return reduced.numpy(), before, residual(exchange, var)

    if case == "RandomK":
        # The indices depend only on the step, the tensor's position and its size: a dry run shows which
        # elements the second step sends; the NaN goes to one it does not.
        reduced, _, _ = run(second_grad)
        position = int(np.flatnonzero(reduced == 0)[0])
    else:
        # The threshold is exact (num_samples >= size): k finite elements reach it, plus the NaN; DGC
        # keeps the first k in index order, so a NaN in the last element is not sent.
        position = size - 1
    bad = second_grad.copy()
    bad[position] = np.nan
    reduced, before, after = run(bad)
    assert np.all(np.isnan(reduced))  # the NaN was not sent, yet the sum sees it ...
    assert_same_bits(after, before)  # ... and it does not reach the residual


# -- (g) step counter and per-step seeds ------------------------------------------------------------

NO_FEEDBACK = {
    "DRAGONN": lambda: tfcomp.DRAGONN(0.1, error_feedback=False, planning="off", min_elements=MIN_ELEMENTS),
    "QSGD": lambda: tfcomp.QSGD(2, planning="off", min_elements=MIN_ELEMENTS),
    "RandomK": lambda: tfcomp.RandomK(RATIO, error_feedback=False, planning="off", min_elements=MIN_ELEMENTS),
}


@pytest.mark.parametrize(
    "name", ["DRAGONN", "QSGD", "RandomK"],
)
def test_seeds_change_every_step(rng, name):
    """Identical gradients, no error feedback: the payload differs from step to step, and a fresh
    exchange replays the same sequence (the seeds derive from the step counter)."""
    shapes = [(3001,), (40, 50)]
    grads = [tf.constant(random_gradient(rng, s, np.float32)) for s in shapes]

    def run(steps):
        exchange = tfcomp.GradientExchange(NO_FEEDBACK[name]())
        variables = [tf.Variable(tf.zeros(s)) for s in shapes]
        outs = []
        for step in range(steps):
            outs.append([r.numpy() for r in exchange(grads, variables)])
            assert int(exchange.step.numpy()) == step + 1
        assert len(exchange.memory.residuals) == 0
        return outs

    first, again = run(3), run(3)
    for a, b in zip(first, again):
        for x, y in zip(a, b):
            assert_same_bits(x, y)
    for i in range(len(shapes)):
        for s in range(3):
            for t in range(s + 1, 3):
                assert not np.array_equal(first[s][i], first[t][i]), f"tensor {i}: steps {s} and {t} sent the same"


@pytest.mark.parametrize("name", list(NO_FEEDBACK))
def test_seeds_differ_between_tensors_of_one_step(rng, name):
    """Two tensors with identical gradients in one call get different randomness."""
    g = random_gradient(rng, (3001,), np.float32)
    exchange = tfcomp.GradientExchange(NO_FEEDBACK[name]())
    a, b = exchange([tf.constant(g), tf.constant(g)], [tf.Variable(tf.zeros([3001])), tf.Variable(tf.zeros([3001]))])
    assert not np.array_equal(a.numpy(), b.numpy())


def test_step_counter_counts_calls(rng):
    exchange = tfcomp.GradientExchange(COMPRESSORS["TopK"]())
    problem = Problem(rng)
    assert int(exchange.step.numpy()) == 0
    for step in range(5):
        problem.call(exchange, *problem.grads())
        assert int(exchange.step.numpy()) == step + 1
    assert not exchange.step.trainable and exchange.step.dtype == tf.int64


# -- (h) checkpoints -------------------------------------------------------------------------------


class Holder(tf.Module):
    def __init__(self, exchange):
        super().__init__()
        self.exchange = exchange


CHECKPOINT_CASES = {
    "DRAGONN": lambda: COMPRESSORS["DRAGONN"](),
    "DGC-momentum": lambda: COMPRESSORS["DGC"](momentum=0.9),
    "QSGD": lambda: COMPRESSORS["QSGD"](),
    "TopK-warmup": lambda: COMPRESSORS["TopK"](warmup_steps=5),  # saved in warm-up, which ends after restore
}


@pytest.mark.parametrize("restore_before_first_call", [True, False], ids=["fresh", "after-a-call"])
@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_checkpoint_saves_and_restores_memory_and_step(rng, tmp_path, case, restore_before_first_call):
    make = CHECKPOINT_CASES[case]
    problem = Problem(rng)
    exchange = tfcomp.GradientExchange(make())
    checkpoint = tf.train.Checkpoint(holder=Holder(exchange))
    for _ in range(3):
        problem.call(exchange, *problem.grads())
    path = checkpoint.write(str(tmp_path / "ckpt"))
    saved = memory_snapshot(exchange)
    assert any(np.any(s != 0) for s in saved) == (exchange.compressor.warmup_steps == 0)
    later = [problem.grads() for _ in range(3)]  # the steps after the save (warm-up ends in them)
    expected = [problem.call(exchange, *g)[0] for g in later]
    expected_memory = memory_snapshot(exchange)

    # A new process: fresh variables (same shapes, same order) and a fresh exchange made the same way.
    fresh = Problem(rng)
    restored = tfcomp.GradientExchange(make())
    if not restore_before_first_call:
        fresh.call(restored, *fresh.grads())  # creates the memory variables, then the restore overwrites them
    status = tf.train.Checkpoint(holder=Holder(restored)).read(path)
    assert int(restored.step.numpy()) == 3
    if not restore_before_first_call:
        status.assert_consumed()
        for a, b in zip(memory_snapshot(restored), saved):
            assert_same_bits(a, b)
    for g, want in zip(later, expected):
        got, _ = fresh.call(restored, *g)
        for n in SHAPES:
            assert_same_bits(got[n], want[n])
    status.assert_consumed()
    for a, b in zip(memory_snapshot(restored), expected_memory):
        assert_same_bits(a, b)
    assert int(restored.step.numpy()) == 6


def test_checkpoint_of_a_keras_optimizer_carries_the_exchange(rng, tmp_path):
    """hvd.DistributedOptimizer with a tfcomp compressor tracks the exchange: its step and residuals are
    in the optimizer's checkpoint."""
    import horovod.tensorflow.keras as hvd_keras

    opt = hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=COMPRESSORS["TopK"]())
    exchange = tfcomp.exchange_of(opt)
    var = tf.Variable(tf.zeros([2000]))
    exchange([tf.constant(random_gradient(rng, (2000,), np.float32))], [var])
    path = tf.train.Checkpoint(optimizer=opt).write(str(tmp_path / "opt"))
    names = [name for name, _ in tf.train.list_variables(path)]
    assert any(n.startswith("optimizer/") and "/step/" in n for n in names), names
    assert any(n.startswith("optimizer/") and "/memory/residuals/0/" in n for n in names), names


@pytest.mark.parametrize("warmup_steps", [0, 3])
def test_momentum_correction_with_everything_dense_trains_as_momentum_sgd(rng, warmup_steps):
    """A plan that sends everything dense (here every tensor is below min_elements; the cost model
    does the same on a fast network) under DGC momentum correction with plain SGD inside trains
    exactly as Keras's SGD with that momentum: the momentum moved into the exchange must not be lost."""
    import horovod.tensorflow.keras as hvd_keras

    x = rng.standard_normal((64, 12)).astype(np.float32)
    y = rng.standard_normal((64, 3)).astype(np.float32)

    def trained(optimizer):
        tf.keras.utils.set_random_seed(5)
        model = tf.keras.Sequential([tf.keras.Input((12,)), tf.keras.layers.Dense(16, activation="tanh"),
                                     tf.keras.layers.Dense(3)])
        model.compile(optimizer, "mse")
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        return model.get_weights()

    compressor = tfcomp.DGC(0.01, momentum=0.9, warmup_steps=warmup_steps, planning="off", min_elements=10**6)
    with_exchange = trained(hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.05), compression=compressor))
    plain = trained(tf.keras.optimizers.SGD(0.05, momentum=0.9))
    without_momentum = trained(tf.keras.optimizers.SGD(0.05))
    for a, b in zip(with_exchange, plain):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(with_exchange, without_momentum)) > 1e-3


@pytest.mark.parametrize("dtype", [tf.float64, tf.int32, tf.int64])
def test_gradients_of_other_dtypes_are_reduced_as_horovod_reduces_them(rng, dtype):
    values = (rng.standard_normal(3000) * 1e3).astype(dtype.as_numpy_dtype)
    if dtype == tf.float64:
        values[7] = 1e300  # beyond float32's range: a compressed bucket would turn it into inf or NaN
    exchange = tfcomp.GradientExchange(tfcomp.DRAGONN(0.01, planning="off", min_elements=1))
    reduced, = exchange([tf.constant(values)], [tf.Variable(tf.zeros([3000], dtype))])
    assert reduced.dtype == dtype
    np.testing.assert_array_equal(reduced.numpy(), hvd.allreduce(tf.constant(values)).numpy())
    assert exchange.records[0].strategy == "allreduce" and not exchange.memory.residuals


def test_more_gradients_than_sources_is_a_value_error():
    exchange = tfcomp.GradientExchange(tfcomp.TopK(0.1))
    with pytest.raises(ValueError, match="got 2 gradients for 1 sources"):
        exchange([tf.ones([3]), tf.ones([3])], [tf.Variable(tf.zeros([3]))])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


class _AddsFirst(tfcomp.DRAGONN):
    """DRAGONN whose exchange adds gradient and residual before the encode (the path of the other
    compressors), to compare with the fused one."""

    fuses_residual = False


class _CountsFusedEncodes(tfcomp.DRAGONN):
    fused_encodes = 0

    def encode_sum(self, flat, residual, seed, worker):
        type(self).fused_encodes += 1
        return super().encode_sum(flat, residual, seed, worker)


def test_fused_accumulation_equals_adding_first(rng):
    """DRAGONN adds a one-tensor bucket's residual inside its kernels' pass: the reduced gradients
    and the residuals are those of adding first, bit for bit, over steps with NaN and Inf (which
    leave the memory as it was) and steps without."""
    shapes = [(3001,), (40, 50)]
    exchanges, variables = [], []
    for compressor_class in (_CountsFusedEncodes, _AddsFirst):
        compressor = compressor_class(RATIO, min_elements=MIN_ELEMENTS, planning="off", strategy="allgather")
        exchanges.append(tfcomp.GradientExchange(compressor))
        variables.append([tf.Variable(tf.zeros(s)) for s in shapes])
    for step in range(5):
        grads = [random_gradient(rng, s, np.float32) for s in shapes]
        if step == 2:
            grads[0][7] = np.nan
        if step == 3:
            grads[1][3, 4] = np.inf
        outs = [[o.numpy() for o in exchange([tf.constant(g) for g in grads], vs)]
                for exchange, vs in zip(exchanges, variables)]
        for fused, added in zip(*outs):
            assert_same_bits(fused, added)
        for fused_var, added_var in zip(*variables):
            assert_same_bits(residual(exchanges[0], fused_var), residual(exchanges[1], added_var))
        assert np.any(residual(exchanges[0], variables[0][0]) != 0)
    assert _CountsFusedEncodes.fused_encodes > 0


def _one_bucket_step(compressor, shapes, workers: int = 2):
    """(step function of the flat gradients, the variables, the exchange state): one allgather bucket
    holding every tensor of `shapes`, run by `tfcomp.step.StepGraph` with LocalCollectives."""
    from tfcomp.collectives import LocalCollectives
    from tfcomp.cost_model import ClusterModel, StrategyTime
    from tfcomp.memory import ExchangeState
    from tfcomp.planning import Bucket, Plan
    from tfcomp.step import StepGraph

    sizes = [int(np.prod(s)) for s in shapes]
    plan = Plan((Bucket(tuple(range(len(shapes))), sum(sizes), "allgather", StrategyTime(0.0, 0.0), 0.0),),
                {i: f"gradient_{i}" for i in range(len(shapes))}, compressor, ClusterModel.unpriced(workers),
                sizes=dict(enumerate(sizes)))
    state = ExchangeState()
    step = StepGraph(compressor, state, LocalCollectives(workers))
    variables = [tf.Variable(tf.zeros([n])) for n in sizes]
    specimen = [tf.zeros([n]) for n in sizes]
    runtime = step.create_state(plan, specimen, variables)
    return tf.function(lambda grads: step(plan, list(grads), variables, runtime), autograph=False), variables, state


@pytest.mark.parametrize("error_feedback", [True, False], ids=["feedback", "no_feedback"])
def test_bucket_of_several_tensors_read_in_place_equals_concatenating(rng, monkeypatch, error_feedback):
    """A bucket of three tensors: DRAGONN's kernels read the parts in place (with or without the
    residuals), the other path concatenates them first; the reduced buckets and the residuals agree
    bit for bit over steps, one with a NaN."""
    shapes = [(3001,), (2000,), (517,)]
    part_counts = []
    compress = tfcomp.ops.dragonn_compress

    def counting_compress(grad, *args, **kwargs):
        part_counts.append(len(grad) if isinstance(grad, list) else 1)
        return compress(grad, *args, **kwargs)

    monkeypatch.setattr(tfcomp.ops, "dragonn_compress", counting_compress)
    runs = [_one_bucket_step(compressor_class(RATIO, error_feedback=error_feedback), shapes)
            for compressor_class in (tfcomp.DRAGONN, _AddsFirst)]
    for step in range(4):
        grads = [random_gradient(rng, (int(np.prod(s)),), np.float32) for s in shapes]
        if step == 2:
            grads[1][5] = np.nan
        outs = [[o.numpy() for o in tf.nest.flatten(run([tf.constant(g) for g in grads]))] for run, _, _ in runs]
        for in_place, concatenated in zip(*outs):
            assert_same_bits(in_place, concatenated)
        memories = [[v.numpy() for v in state.memory.residuals] for _, _, state in runs]
        assert len(memories[0]) == (len(shapes) if error_feedback else 0)
        for in_place, concatenated in zip(*memories):
            assert_same_bits(in_place, concatenated)
    assert sorted(set(part_counts)) == [1, len(shapes)]  # traced once by each path


@pytest.mark.parametrize("setting, tensor_elements, bucket_elements, strategy, advised", [
    (None, 9_000_000, 9_000_000, "allgather", True),  # one 34 MiB tensor
    (None, 3_000_000, 9_000_000, "allgather", True),  # a 34 MiB compressed bucket of smaller tensors
    (None, 3_000_000, 9_000_000, "dense", False),  # dense buckets come back tensor by tensor
    (None, 8_388_608, 8_388_608, "allgather", False),  # exactly 32 MiB: within malloc's heap
    ("true", 9_000_000, 9_000_000, "allgather", False),
    ("1", 9_000_000, 9_000_000, "allgather", False),
    ("false", 9_000_000, 9_000_000, "allgather", True),
])
def test_cpu_allocator_advice(monkeypatch, setting, tensor_elements, bucket_elements, strategy, advised):
    """The exchange advises TensorFlow's BFC allocator where a CPU tensor or compressed bucket of the
    plan exceeds 32 MiB and the default allocator (malloc) is in use."""
    from types import SimpleNamespace

    from tfcomp.exchange import _cpu_allocator_advice
    from tfcomp.strategies import STRATEGIES

    if setting is None:
        monkeypatch.delenv("TF_CPU_ALLOCATOR_USE_BFC", raising=False)
    else:
        monkeypatch.setenv("TF_CPU_ALLOCATOR_USE_BFC", setting)
    plan = SimpleNamespace(buckets=(SimpleNamespace(elements=bucket_elements, strategy=STRATEGIES[strategy]),))
    tensors = [(i, f"tensor_{i}", tensor_elements) for i in range(bucket_elements // tensor_elements)]
    advice = _cpu_allocator_advice(plan, tensors)
    if advised:
        assert "TF_CPU_ALLOCATOR_USE_BFC=true" in advice and f"{4 * bucket_elements / 2**20:.0f} MiB" in advice
    else:
        assert advice is None


def test_replan_names_a_bad_min_gain():
    exchange = tfcomp.GradientExchange(tfcomp.DRAGONN(0.01))
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(ValueError, match=r"min_gain must be a fraction in \[0, 1\)"):
            exchange.replan(min_gain=bad)


def _op_types(graph) -> dict:
    """{op type: count} over a traced graph and every function in its library (cond branches)."""
    import collections

    graph_def = graph.as_graph_def()
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    return collections.Counter(n.op for n in nodes)


@pytest.mark.parametrize("adam", [None, True], ids=["plain", "adam"])
def test_a_flushing_step_builds_its_reduction_once(rng, adam):
    """Where a dense bucket's tensor has a residual that may be pending (the flush flag, set at
    first), the flag picks that tensor's residual read and clearing: the step graph holds one
    encode per compressed bucket and one allreduce per dense tensor, not two of each; the
    dense tensor is accumulated once with and once without its residual (under Adam correction,
    which keeps every dense tensor's moments; plain, it is a sum with its residual or the gradient
    as it is)."""
    from tfcomp.collectives import LocalCollectives
    from tfcomp.cost_model import ClusterModel, StrategyTime
    from tfcomp.memory import ExchangeState
    from tfcomp.planning import Bucket, Plan
    from tfcomp.step import StepGraph

    compressor = tfcomp.DRAGONN(0.05, adam=adam)
    sizes = [2000, 300]
    plan = Plan((Bucket((0,), sizes[0], "allgather", StrategyTime(0.0, 0.0), 0.0),
                 Bucket((1,), sizes[1], "dense", StrategyTime(0.0, 0.0), 0.0)),
                {0: "compressed", 1: "dense"}, compressor, ClusterModel.unpriced(2), sizes=dict(enumerate(sizes)))
    state = ExchangeState(0, 2)
    step = StepGraph(compressor, state, LocalCollectives(2))
    variables = [tf.Variable(tf.zeros([n])) for n in sizes]
    grads = [tf.constant(random_gradient(rng, (n,), np.float32)) for n in sizes]
    state.memory.residual(variables[1], sizes[1], compressor.optimizer_state)  # a residual, as a restore leaves
    runtime = step.create_state(plan, grads, variables)
    function = tf.function(lambda gs: step(plan, gs, variables, runtime), autograph=False)
    types = _op_types(function.get_concrete_function(grads).graph)
    assert types["Tfcomp>DragonnCompress"] == 1, types
    assert types["HorovodAllreduce"] == 1, types
    assert types["Tfcomp>AdamAccumulate"] == (3 if adam else 0), types


@pytest.mark.parametrize("optimizer", ["SGD", "Adam"])
def test_keras_traces_the_train_function_once(rng, optimizer):
    """The exchange's state and the optimizer's slots are created at the exchange's first call, kept
    out of the train function's record of variables created in it: Keras traces the train step
    once (it traced twice: the second trace after the first created variables), and it trains as
    the same model built without the exchange's help."""
    import horovod.tensorflow.keras as hvd_keras

    x = random_gradient(rng, (16, 32), np.float32)
    y = rng.integers(0, 10, 16)
    weights = []
    for wrapped in (True, False):
        tf.keras.utils.set_random_seed(7)
        model = tf.keras.Sequential([tf.keras.layers.Dense(64, input_shape=(32,)), tf.keras.layers.Dense(10)])
        inner = getattr(tf.keras.optimizers, optimizer)(0.01)
        opt = hvd_keras.DistributedOptimizer(inner, compression=tfcomp.DRAGONN(0.1, min_elements=256, planning="off")) \
            if wrapped else inner
        model.compile(opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        for _ in range(3):
            model.train_on_batch(x, y)
        if wrapped:
            assert model.train_function.experimental_get_tracing_count() == 1
            assert len(tfcomp.exchange_of(opt).memory.residuals) == 2  # the two kernels: compressed
        weights.append([w.numpy() for w in model.trainable_weights])
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(*weights))
    assert moved > 0  # DRAGONN's sparsified steps differ from the plain optimizer's
    assert all(np.all(np.isfinite(w)) for w in weights[0])


@pytest.mark.jobs
def test_making_a_barrier_leaves_tensorflow_unconfigured():
    # The benchmarks' workers make their barrier at import and configure TensorFlow's threads in
    # main(): a barrier that touched TensorFlow when made broke them ("Intra op parallelism cannot
    # be modified after initialization").
    from tests.helpers import run_python

    script = ("import horovod.tensorflow as hvd, tensorflow as tf\n"
              "from tfcomp.collectives import barrier\n"
              "wait = barrier(hvd.global_process_set, 'unconfigured')\n"
              "tf.config.threading.set_intra_op_parallelism_threads(1)\n"
              "hvd.init()\n"
              "wait()\n"
              "print('waited')\n")
    result = run_python(script)
    assert result.returncode == 0 and result.stdout.strip().endswith("waited"), result.stderr[-3000:]


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("name", ["DRAGONN", "TopK", "IntQuant"])
def test_a_gradient_of_another_shape_than_its_variable_is_refused(rng, name, traced):
    """A [2000] gradient for a [3000] variable (and a [40, 50] one for a [50, 40] variable, whose
    elements agree) is refused with an error that names the variable and both shapes, before any
    plan is made, eagerly and while a tf.function traces."""
    for grad_shape, variable_shape in (((2000,), (3000,)), ((40, 50), (50, 40))):
        exchange = tfcomp.GradientExchange(COMPRESSORS[name]())
        fitting = tf.Variable(tf.zeros([1500]), name="fitting")
        variable = tf.Variable(tf.zeros(variable_shape), name="misfit")
        grads = [tf.constant(random_gradient(rng, (1500,), np.float32)),
                 tf.constant(random_gradient(rng, grad_shape, np.float32))]
        call = tf.function(lambda gs: exchange(gs, [fitting, variable])) if traced else (
            lambda gs: exchange(gs, [fitting, variable]))
        pattern = (rf"gradient 1 .*misfit.*shape {list(grad_shape)}.*"
                   rf"{list(variable_shape)}").replace("[", r"\[").replace("]", r"\]")
        with pytest.raises(ValueError, match=pattern):
            call(grads)
        assert exchange.plan is None
