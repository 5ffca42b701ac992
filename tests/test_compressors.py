"""tfcomp.compressors: what every compressor's payload means (against NumPy), decode_sum on simulated
K-worker collectives, payload sizes, hyper-parameter validation, as_compressor, equality and repr.

No Horovod collective runs here: the K workers' allgather concatenation (or allreduce sum) is built by
hand from K encodes with different `worker` values.
"""

import math
import re
import sys

import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf

import tfcomp
from tests import numpy_reference as ref
from tests.helpers import random_gradient
from tfcomp import compressors

# Sizes not multiple of 8 (the sign packing), around and above the default min_elements (1024), and
# one above DRAGONN's / DGC's default num_samples (65536) so that the threshold is sampled.
SIZES = [1, 7, 13, 1000, 1029, 4099, 70_001]
LARGE_SIZES = [s for s in SIZES if s >= 1000]

SPARSE_AND_QUANTISED = {
    "DRAGONN": lambda: tfcomp.DRAGONN(0.05),
    "DRAGONN-slots3": lambda: tfcomp.DRAGONN(0.02, slots_per_element=3.0, num_samples=5000),
    "DGC": lambda: tfcomp.DGC(0.05),
    "DGC-sampled": lambda: tfcomp.DGC(0.03, num_samples=3000),
    "TopK": lambda: tfcomp.TopK(0.05),
    "RandomK": lambda: tfcomp.RandomK(0.05),
    "EFSignSGD": lambda: tfcomp.EFSignSGD(),
    "QSGD": lambda: tfcomp.QSGD(4),
    "QSGD-1bit": lambda: tfcomp.QSGD(1),
    "QSGD-7bit": lambda: tfcomp.QSGD(7),
}


def seed_tensor(seed: int) -> tf.Tensor:
    return tf.constant(seed, tf.int64)


def encode(compressor, g: np.ndarray, seed: int, worker: int = 0):
    return compressor.encode(tf.constant(g), seed_tensor(seed), worker)


def numpy_wire(encoded):
    return [t.numpy() for t in encoded.wire]


def hash_seed(seed: int, worker: int) -> int:
    """The per-worker seed DRAGONN and DGC sample (and DRAGONN hashes) with: seed * 1_000_003 + worker
    (int64, wrapping)."""
    return int(np.int64(seed) * np.int64(1_000_003) + np.int64(worker))


def k_of(ratio: float, size: int) -> int:
    return max(1, math.floor(ratio * size + 0.5))


def draw_seed(rng) -> int:
    return int(rng.integers(0, 2**40))


def threshold_of(compressor, g, seed, worker):
    """The threshold the sparsifier's estimate returns (NumPy reference)."""
    return ref.estimate_threshold(g, compressor.ratio, compressor.num_samples, hash_seed(seed, worker))


def assert_sparse_payload_consistent(compressor, g, encoded, length):
    """(values, indices) of `length`: empty slots (-1, 0), distinct indices, values == g[indices],
    decode_local == the dense scatter."""
    values, indices = numpy_wire(encoded)
    assert values.dtype == np.float32 and indices.dtype == np.int32
    assert values.shape == (length,) and indices.shape == (length,)
    kept = indices >= 0
    assert np.all(indices[kept] < g.size)
    assert np.unique(indices[kept]).size == np.count_nonzero(kept), "an index was sent twice"
    np.testing.assert_array_equal(values[kept], g[indices[kept]])
    np.testing.assert_array_equal(values[~kept], 0)
    expected = np.zeros(g.size, np.float32)
    expected[indices[kept]] = values[kept]
    np.testing.assert_array_equal(compressor.decode_local(encoded, g.size).numpy(), expected)
    return values, indices


# -- what each payload means -----------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("slots_per_element", [1.0, 2.5])
def test_dragonn_payload(rng, size, slots_per_element):
    compressor = tfcomp.DRAGONN(0.05, slots_per_element=slots_per_element)
    g = random_gradient(rng, (size,), np.float32)
    seed, worker = draw_seed(rng), int(rng.integers(0, 64))
    encoded = encode(compressor, g, seed, worker)
    num_slots = max(1, math.floor(slots_per_element * 0.05 * size + 0.5))
    assert compressor.payload_length(size) == num_slots
    values, indices = assert_sparse_payload_consistent(compressor, g, encoded, num_slots)
    kept = indices[indices >= 0]
    threshold = threshold_of(compressor, g, seed, worker)
    assert np.all(np.abs(g[kept]) >= threshold), "an element below the threshold was sent"
    assert kept.size >= 1
    # The full payload, collision rule included, is the reference's for that threshold and seed.
    expected_values, expected_indices = ref.dragonn_compress(g, threshold, num_slots, hash_seed(seed, worker))
    np.testing.assert_array_equal(indices, expected_indices)
    np.testing.assert_array_equal(values, expected_values)


def test_dragonn_workers_and_seeds_hash_differently(rng):
    compressor = tfcomp.DRAGONN(0.05)
    g = random_gradient(rng, (20_000,), np.float32)
    seed = draw_seed(rng)
    payloads = {
        (s, w): tuple(numpy_wire(encode(compressor, g, s, w))[1]) for s in (seed, seed + 1) for w in (0, 1)
    }
    assert payloads[(seed, 0)] == tuple(numpy_wire(encode(compressor, g, seed, 0))[1])  # deterministic
    assert len(set(payloads.values())) == 4, "two (seed, worker) pairs gave the same DRAGONN payload"


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("num_samples", [65536, 500])
def test_dgc_payload(rng, size, num_samples):
    compressor = tfcomp.DGC(0.05, num_samples=num_samples)
    g = random_gradient(rng, (size,), np.float32)
    seed, worker = draw_seed(rng), int(rng.integers(0, 64))
    encoded = encode(compressor, g, seed, worker)
    k = k_of(0.05, size)
    values, indices = assert_sparse_payload_consistent(compressor, g, encoded, k)
    threshold = threshold_of(compressor, g, seed, worker)
    chosen = np.flatnonzero(np.abs(g) >= threshold)[:k]  # the first k selected, in index order
    np.testing.assert_array_equal(indices[: chosen.size], chosen)
    np.testing.assert_array_equal(indices[chosen.size:], -1)
    if num_samples >= size:  # exact threshold: exactly the k largest magnitudes (ties have measure 0)
        assert chosen.size == k


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("ratio", [0.001, 0.05, 0.5, 1.0])
def test_topk_payload_is_the_k_largest_magnitudes(rng, size, ratio):
    compressor = tfcomp.TopK(ratio)
    g = random_gradient(rng, (size,), np.float32)
    encoded = encode(compressor, g, draw_seed(rng), int(rng.integers(0, 64)))
    k = k_of(ratio, size)
    values, indices = assert_sparse_payload_consistent(compressor, g, encoded, k)
    # Ties in magnitude go to the larger index (the op's rank word), not to the first one.
    expected = np.sort(np.lexsort((-np.arange(size), -np.abs(g)))[:k])
    np.testing.assert_array_equal(np.sort(indices), expected)
    assert np.all(indices >= 0)


@pytest.mark.parametrize("size", SIZES)
def test_randomk_payload(rng, size):
    compressor = tfcomp.RandomK(0.05)
    g = random_gradient(rng, (size,), np.float32)
    seed = draw_seed(rng)
    encoded = encode(compressor, g, seed, worker=0)
    k = k_of(0.05, size)
    (values,) = numpy_wire(encoded)
    indices = encoded.context.numpy()
    assert values.dtype == np.float32 and values.shape == (k,)
    assert indices.dtype == np.int32 and indices.shape == (k,)
    assert np.all((indices >= 0) & (indices < size))
    assert np.unique(indices).size == k, "RandomK drew an index twice"
    np.testing.assert_array_equal(values, g[indices])
    expected = np.zeros(size, np.float32)
    expected[indices] = values
    np.testing.assert_array_equal(compressor.decode_local(encoded, size).numpy(), expected)
    # Same seed: the same indices on every worker (they are summed by allreduce), whatever g is.
    other_g = random_gradient(rng, (size,), np.float32)
    for worker in (1, 5, 1000):
        other = encode(compressor, other_g, seed, worker)
        np.testing.assert_array_equal(other.context.numpy(), indices)
        np.testing.assert_array_equal(other.wire[0].numpy(), other_g[indices])
    if size >= 1000:  # enough combinations that two seeds agreeing would be a bug
        for other_seed in (seed + 1, seed ^ 0x5A):
            assert not np.array_equal(encode(compressor, g, other_seed).context.numpy(), indices)


# The exchange's per-step seeds are step * 65536 + position: consecutive steps differ only in bits >= 16.
HIGH_BIT_SEED_CHANGES = [65536, 2**32, 1 << 20]


@pytest.mark.parametrize("size", LARGE_SIZES)
def test_randomk_indices_depend_on_the_whole_seed(rng, size):
    compressor = tfcomp.RandomK(0.05)
    g = random_gradient(rng, (size,), np.float32)
    seed = draw_seed(rng)
    indices = encode(compressor, g, seed).context.numpy()
    same = [change for change in HIGH_BIT_SEED_CHANGES
            if np.array_equal(encode(compressor, g, seed + change).context.numpy(), indices)]
    assert not same, f"seeds {seed} and {seed} + {same} drew the same indices"


def chi_square_of_index_counts(compressor, size, seeds, rng):
    g = tf.constant(random_gradient(rng, (size,), np.float32))
    counts = np.zeros(size)
    for seed in seeds:
        np.add.at(counts, compressor.encode(g, seed_tensor(seed), 0).context.numpy(), 1)
    expected = len(seeds) * k_of(compressor.ratio, size) / size
    return float(np.sum((counts - expected) ** 2 / expected)), expected


def assert_chi_square_uniform(chi2, expected, size):
    # For uniform draws chi2 ~ (size - 1) +- sqrt(2 (size - 1) + size / expected) (Poisson approximation,
    # a little less spread for k draws without replacement); 7 of those standard deviations.
    assert abs(chi2 - (size - 1)) < 7 * math.sqrt(2 * (size - 1) + size / expected), chi2


def test_randomk_indices_are_uniform_over_consecutive_seeds(rng):
    """Over many seeds every index is drawn about k/size of the time (chi-square on the counts)."""
    size, trials = 500, 200
    first = draw_seed(rng)
    chi2, expected = chi_square_of_index_counts(tfcomp.RandomK(0.02), size, [first + t for t in range(trials)], rng)
    assert_chi_square_uniform(chi2, expected, size)


def test_randomk_indices_are_uniform_over_exchange_steps(rng):
    """The same with the exchange's seeds, step * 65536 + position, over consecutive steps."""
    size, trials = 500, 200
    seeds = [step * 65536 + 3 for step in range(trials)]
    chi2, expected = chi_square_of_index_counts(tfcomp.RandomK(0.02), size, seeds, rng)
    assert_chi_square_uniform(chi2, expected, size)


@pytest.mark.parametrize("size", SIZES)
def test_efsignsgd_payload(rng, size):
    compressor = tfcomp.EFSignSGD()
    g = random_gradient(rng, (size,), np.float32)
    if size > 3:
        g[rng.choice(size, 2, replace=False)] = [0.0, -0.0]  # zero counts as positive
    encoded = encode(compressor, g, draw_seed(rng), int(rng.integers(0, 64)))
    packed, scale = numpy_wire(encoded)
    assert packed.dtype == np.uint8 and packed.shape == (-(-size // 8),)
    assert scale.dtype == np.float32 and scale.shape == (1,)
    np.testing.assert_allclose(scale[0], np.mean(np.abs(g.astype(np.float64))), rtol=1e-5)
    signs = np.unpackbits(packed, bitorder="little")[:size]
    np.testing.assert_array_equal(signs, (g >= 0).astype(np.uint8))
    expected = np.where(g >= 0, scale[0], -scale[0]).astype(np.float32)
    np.testing.assert_array_equal(compressor.decode_local(encoded, size).numpy(), expected)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("bits", [1, 2, 4, 7])
def test_qsgd_payload(rng, size, bits):
    compressor = tfcomp.QSGD(bits)
    s = 2**bits - 1
    g = random_gradient(rng, (size,), np.float32)
    if size > 3:
        g[rng.integers(size)] = 0.0
    encoded = encode(compressor, g, draw_seed(rng), int(rng.integers(0, 64)))
    levels, norm = numpy_wire(encoded)
    assert levels.dtype == np.int8 and levels.shape == (size,)
    assert norm.dtype == np.float32 and norm.shape == (1,)
    np.testing.assert_allclose(norm[0], np.linalg.norm(g.astype(np.float64)), rtol=1e-5)
    assert np.all(np.abs(levels.astype(int)) <= s)
    assert np.all((np.sign(levels) == np.sign(g)) | (levels == 0))
    scaled = np.abs(g.astype(np.float64)) / norm[0] * s
    # Each magnitude is rounded to one of its two neighbouring levels.
    assert np.all(np.abs(np.abs(levels) - scaled) < 1 + 1e-5)
    decoded = compressor.decode_local(encoded, size).numpy()
    np.testing.assert_allclose(decoded, levels * (norm[0] / s), rtol=1e-6, atol=0)
    step = norm[0] / s
    assert np.all(np.abs(decoded - g) <= step * (1 + 1e-5)), "more than one quantisation step away"


@pytest.mark.parametrize("bits", [1, 3])
def test_qsgd_is_unbiased(rng, bits):
    """The mean of decode_local over many seeds approaches g within a few standard errors."""
    size, trials = 1000, 600
    compressor = tfcomp.QSGD(bits)
    s = 2**bits - 1
    g = random_gradient(rng, (size,), np.float32, heavy_tail=False)
    flat = tf.constant(g)
    first = draw_seed(rng)
    total = np.zeros(size)
    for t in range(trials):
        total += compressor.decode_local(compressor.encode(flat, seed_tensor(first + t), 3), size).numpy()
    mean = total / trials
    step = np.linalg.norm(g.astype(np.float64)) / s
    p = np.abs(g) / step % 1.0  # probability of rounding up
    std_error = step * np.sqrt(p * (1 - p) / trials)
    # Per element: the number of trials rounded up is Binomial(trials, p); allow 6 standard deviations
    # plus 6 counts (which covers the Poisson-like tail when trials * p is small) plus float32 rounding.
    assert np.all(np.abs(mean - g) <= 6 * std_error + 6 * step / trials + 1e-5 * step)
    # In aggregate: the standardised errors have mean 0 (a systematic bias would shift them all).
    informative = (p > 0.02) & (p < 0.98)
    z = (mean - g)[informative] / std_error[informative]
    assert abs(z.mean()) * math.sqrt(z.size) < 5, z.mean()
    assert abs((np.sign(g[informative]) * z).mean()) * math.sqrt(z.size) < 5  # no shrinkage / inflation


def test_qsgd_noise_depends_on_seed_and_worker(rng):
    compressor = tfcomp.QSGD(2)
    g = random_gradient(rng, (5000,), np.float32)
    seed = draw_seed(rng)
    levels = {(s, w): numpy_wire(encode(compressor, g, s, w))[0] for s in (seed, seed + 1) for w in (0, 1)}
    np.testing.assert_array_equal(numpy_wire(encode(compressor, g, seed, 0))[0], levels[(seed, 0)])
    keys = list(levels)
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            assert not np.array_equal(levels[a], levels[b]), f"{a} and {b} drew the same noise"


def test_quantisers_of_a_zero_gradient_send_zeros():
    zeros = np.zeros(1029, np.float32)
    for compressor in (tfcomp.QSGD(4), tfcomp.EFSignSGD()):
        decoded = compressor.decode_local(encode(compressor, zeros, 1), zeros.size).numpy()
        assert np.all(decoded == 0) and np.all(np.isfinite(decoded)), type(compressor).__name__


# -- decode_sum on simulated collectives and payload sizes -----------------------------------------


def simulated_collective(compressor, encodeds):
    """What Horovod hands back for each wire tensor: the K workers' tensors concatenated on dim 0
    (allgather) or summed (allreduce)."""
    per_tensor = zip(*[numpy_wire(e) for e in encodeds])
    if compressor.collective == "allgather":
        return tuple(tf.constant(np.concatenate(ts, axis=0)) for ts in per_tensor)
    assert compressor.collective == "allreduce"
    return tuple(tf.constant(np.sum(np.stack(ts), axis=0)) for ts in per_tensor)


@pytest.mark.parametrize("name", list(SPARSE_AND_QUANTISED))
@pytest.mark.parametrize("size", [7, 1029, 70_001])
@pytest.mark.parametrize("num_workers", [1, 2, 5])
def test_decode_sum_is_the_sum_of_local_decodes(rng, name, size, num_workers):
    compressor = SPARSE_AND_QUANTISED[name]()
    seed = draw_seed(rng)
    encodeds = [encode(compressor, random_gradient(rng, (size,), np.float32), seed, worker)
                for worker in range(num_workers)]
    expected = np.sum([compressor.decode_local(e, size).numpy().astype(np.float64) for e in encodeds], axis=0)
    wire = simulated_collective(compressor, encodeds)
    total = compressor.decode_sum(wire, encodeds[0].context, size, num_workers).numpy()
    assert total.shape == (size,) and total.dtype == np.float32
    np.testing.assert_allclose(total, expected, rtol=1e-5, atol=1e-5 * np.max(np.abs(expected), initial=1.0))


@pytest.mark.parametrize("name", list(SPARSE_AND_QUANTISED))
@pytest.mark.parametrize("size", SIZES)
def test_payload_bytes_are_the_wire_tensors_bytes(rng, name, size):
    compressor = SPARSE_AND_QUANTISED[name]()
    encoded = encode(compressor, random_gradient(rng, (size,), np.float32), draw_seed(rng), 1)
    assert isinstance(encoded, compressors.Encoded)
    sent = sum(t.numpy().nbytes for t in encoded.wire)
    assert compressor.payload_bytes(size) == sent


@pytest.mark.parametrize("size", SIZES)
def test_documented_payload_sizes(size):
    assert tfcomp.EFSignSGD().payload_bytes(size) == -(-size // 8) + 4
    assert tfcomp.QSGD(3).payload_bytes(size) == size + 4
    assert tfcomp.TopK(0.05).payload_bytes(size) == 8 * k_of(0.05, size)
    assert tfcomp.DGC(0.05).payload_bytes(size) == 8 * k_of(0.05, size)
    assert tfcomp.RandomK(0.05).payload_bytes(size) == 4 * k_of(0.05, size)
    assert tfcomp.DRAGONN(0.05, slots_per_element=2.0).payload_bytes(size) == 8 * max(1, math.floor(0.1 * size + 0.5))
    assert tfcomp.FP16().payload_bytes(size) == 2 * size
    assert tfcomp.NoCompression().payload_bytes(size) == 4 * size


@pytest.mark.parametrize("compressor", [tfcomp.FP16(), tfcomp.NoCompression()], ids=repr)
def test_dense_compressors(compressor):
    assert compressor.collective == "dense" and not compressor.collective.compresses
    assert compressor.error_feedback is False and compressor.momentum is None
    assert tuple(compressor.strategies) == ("dense",)
    with pytest.raises(NotImplementedError):
        compressor.encode(tf.zeros([2048]), seed_tensor(1), 0)


def test_planning_and_strategy_arguments():
    assert tfcomp.DRAGONN().planning == "auto" and tfcomp.DRAGONN().strategy is None
    assert tfcomp.DRAGONN(strategy="artopk", artopk_owner="var").strategy == "artopk"
    assert tfcomp.RandomK(strategy="allreduce").strategy == "allreduce"
    with pytest.raises(ValueError, match="planning must be 'auto' or 'off', got 'on'"):
        tfcomp.TopK(planning="on")
    with pytest.raises(ValueError, match=r"strategy must be None or one of \('dense', 'allreduce'\) for RandomK, got 'artopk'"):
        tfcomp.RandomK(strategy="artopk")
    with pytest.raises(ValueError, match="strategy must be None or one of .* for QSGD, got 'allreduce'"):
        tfcomp.QSGD(strategy="allreduce")
    with pytest.raises(ValueError, match="artopk_owner must be 'star' .* or 'var' .*, got 'max'"):
        tfcomp.DGC(artopk_owner="max")


def test_union_limit_sets_the_owners_budget():
    assert tfcomp.DRAGONN().union_limit == 1.0 and tfcomp.TopK(union_limit=None).union_limit is None
    assert tfcomp.DGC(strategy="partitioned", union_limit=2).union_limit == 2.0
    assert tfcomp.DRAGONN(union_limit=2.5).owner_budget(1000, 8) == 313  # ceil(2.5 * 1000 / 8)
    assert tfcomp.TopK(union_limit=1e-9).owner_budget(10, 4) == 1
    assert tfcomp.TopK(union_limit=None).owner_budget(10, 4) is None
    for bad in (0, -1.0, float("nan"), float("inf"), "1", True, 2.0**31):
        with pytest.raises(ValueError, match=r"union_limit must be None or a number in \(0, 2\^31 - 1\], got"):
            tfcomp.DRAGONN(union_limit=bad)
    with pytest.raises(ValueError, match="strategy must be None or one of .* for RandomK, got 'partitioned'"):
        tfcomp.RandomK(strategy="partitioned")


def test_defaults():
    assert tfcomp.DRAGONN().ratio == 0.001 and tfcomp.DGC().ratio == 0.001 and tfcomp.TopK().ratio == 0.001
    assert tfcomp.RandomK().ratio == 0.01 and tfcomp.QSGD().bits == 4
    for c in (tfcomp.DRAGONN(), tfcomp.DGC(), tfcomp.TopK(), tfcomp.RandomK(), tfcomp.EFSignSGD()):
        assert c.error_feedback is True and c.momentum is None and c.warmup_steps == 0 and c.min_elements == 8192
    assert tfcomp.QSGD().error_feedback is False


# -- validation ------------------------------------------------------------------------------------

RATIO_COMPRESSORS = [tfcomp.DRAGONN, tfcomp.DGC, tfcomp.TopK, tfcomp.RandomK]
NON_DENSE = RATIO_COMPRESSORS + [tfcomp.EFSignSGD, tfcomp.QSGD]

BAD_ARGUMENTS = (
    [(cls, "ratio", {"ratio": bad}, bad) for cls in RATIO_COMPRESSORS for bad in (0, 0.0, 1.5, -1, "x", True, None)]
    + [(cls, "num_samples", {"num_samples": bad}, bad) for cls in (tfcomp.DRAGONN, tfcomp.DGC) for bad in (0, -3, 2.5)]
    + [(tfcomp.QSGD, "bits", {"bits": bad}, bad) for bad in (0, 8, -1, 4.0, True)]
    + [(cls, "momentum", {"momentum": bad}, bad) for cls in NON_DENSE for bad in (1.0, -0.1, 2, "0.9", True)]
    + [(cls, "warmup_steps", {"warmup_steps": bad}, bad) for cls in NON_DENSE for bad in (-1, 1.5)]
    + [(cls, "min_elements", {"min_elements": bad}, bad) for cls in NON_DENSE for bad in (0, -5)]
    + [(cls, "error_feedback", {"error_feedback": bad}, bad) for cls in NON_DENSE for bad in (1, "yes", None)]
    + [(tfcomp.DRAGONN, "slots_per_element", {"slots_per_element": bad}, bad) for bad in (0, -1.0, "x", True)]
    # absurd values: not finite, bools (NumPy's too), floats for integers, out of the ops' and counters' ranges
    + [(cls, "ratio", {"ratio": bad}, bad) for cls in RATIO_COMPRESSORS
       for bad in (math.nan, math.inf, -math.inf, 10**400, np.float64(math.nan), np.bool_(True))]
    + [(cls, "num_samples", {"num_samples": bad}, bad) for cls in (tfcomp.DRAGONN, tfcomp.DGC)
       for bad in (2**31, 2**63, 1e5, math.nan, math.inf, True, np.bool_(True), "65536")]
    + [(tfcomp.DRAGONN, "slots_per_element", {"slots_per_element": bad}, bad)
       for bad in (math.inf, math.nan, -math.inf, 1e308, 2.0**31, 2**31, 10**400, np.float32(math.inf))]
    + [(tfcomp.QSGD, "bits", {"bits": bad}, bad) for bad in (math.nan, math.inf, np.int64(8), 10**30)]
    + [(cls, "momentum", {"momentum": bad}, bad) for cls in NON_DENSE for bad in (math.nan, math.inf, -math.inf)]
    + [(cls, "warmup_steps", {"warmup_steps": bad}, bad) for cls in NON_DENSE
       for bad in (2**63, 2**64, math.inf, math.nan, True, 3.0, np.float64(2.0))]
    + [(cls, "min_elements", {"min_elements": bad}, bad) for cls in NON_DENSE for bad in (2**63, math.inf, True, 1e3)]
)


@pytest.mark.parametrize(
    "cls, argument, kwargs, bad", BAD_ARGUMENTS, ids=[f"{c.__name__}-{k}" for c, _, k, _ in BAD_ARGUMENTS]
)
def test_bad_hyper_parameter_names_argument_and_value(cls, argument, kwargs, bad):
    with pytest.raises(ValueError) as caught:
        cls(**kwargs)
    message = str(caught.value)
    assert argument in message, message
    assert repr(bad) in message, message


@pytest.mark.parametrize("cls", NON_DENSE, ids=lambda c: c.__name__)
def test_random_values_past_the_integer_ranges_are_refused(rng, cls):
    """num_samples past int32 (the op's attribute), warmup_steps and min_elements past int64 (the
    step counter, element counts): fresh values each run, Python and NumPy integers."""
    cases = [("warmup_steps", 2**63 + int(rng.integers(0, 2**62))), ("min_elements", 2**63 + int(rng.integers(0, 2**40)))]
    if cls in (tfcomp.DRAGONN, tfcomp.DGC):
        cases.append(("num_samples", int(rng.integers(2**31, 2**63, dtype=np.uint64))))
        cases.append(("num_samples", np.int64(rng.integers(2**31, 2**62))))
    for argument, bad in cases:
        with pytest.raises(ValueError) as caught:
            cls(**{argument: bad})
        assert argument in str(caught.value) and repr(bad) in str(caught.value), str(caught.value)


def test_largest_values_are_accepted_and_stored_as_python_numbers(rng):
    biggest = tfcomp.DRAGONN(np.float32(0.5), slots_per_element=2**31 - 1, num_samples=np.int64(2**31 - 1),
                             warmup_steps=2**63 - 1, min_elements=np.int32(7))
    assert (biggest.slots_per_element, biggest.num_samples, biggest.warmup_steps) == (2.0**31 - 1, 2**31 - 1, 2**63 - 1)
    assert type(biggest.num_samples) is int and type(biggest.min_elements) is int and type(biggest.ratio) is float
    assert eval(repr(biggest), {"tfcomp": tfcomp}) == biggest  # noqa: S307
    assert tfcomp.QSGD(np.int8(3)).bits == 3 and type(tfcomp.QSGD(np.int8(3)).bits) is int
    # The exchange compares its int64 step counter with warmup_steps: the largest one fits.
    steps = int(rng.integers(0, 2**62))
    assert bool(tf.constant(steps, tf.int64) < biggest.warmup_steps)


def test_dragonn_refuses_more_slots_than_the_op_can_index(rng):
    size = 2**21 + int(rng.integers(1, 1000))  # 1024 slots per element of a full-ratio tensor: > 2^31 - 1 slots
    compressor = tfcomp.DRAGONN(1.0, slots_per_element=1024)
    with pytest.raises(ValueError, match=rf"slots_per_element=1024.0 .* {size} elements {1024 * size} slots"):
        encode(compressor, np.zeros(size, np.float32), 1)


@pytest.mark.parametrize("cls", NON_DENSE, ids=lambda c: c.__name__)
def test_momentum_needs_error_feedback(cls):
    with pytest.raises(ValueError, match=r"momentum.*error_feedback|error_feedback.*momentum"):
        cls(momentum=0.9, error_feedback=False)
    assert cls(momentum=0.9, error_feedback=True).momentum == 0.9
    assert cls(momentum=0, error_feedback=True).momentum == 0.0


def test_qsgd_momentum_without_error_feedback_by_default():
    with pytest.raises(ValueError, match="error_feedback"):
        tfcomp.QSGD(momentum=0.5)  # QSGD's error feedback is off by default


def test_good_hyper_parameters_are_accepted():
    assert tfcomp.DRAGONN(1).ratio == 1.0 and isinstance(tfcomp.DRAGONN(1).ratio, float)
    assert tfcomp.TopK(1e-9).ratio == 1e-9
    assert tfcomp.QSGD(1).bits == 1 and tfcomp.QSGD(7).bits == 7
    assert tfcomp.DRAGONN(slots_per_element=2).slots_per_element == 2.0
    assert tfcomp.DGC(num_samples=1, warmup_steps=3, min_elements=1).warmup_steps == 3


# -- as_compressor ---------------------------------------------------------------------------------


def test_as_compressor_maps_horovod_compression():
    assert isinstance(compressors.as_compressor(hvd.Compression.none), tfcomp.NoCompression)
    assert isinstance(compressors.as_compressor(hvd.Compression.fp16), tfcomp.FP16)
    assert compressors.as_compressor(hvd.Compression.fp16) == tfcomp.FP16()
    assert compressors.as_compressor(hvd.Compression.fp16()) == tfcomp.FP16()  # an instance of Horovod's class
    assert compressors.as_compressor(hvd.Compression.none()) == tfcomp.NoCompression()
    assert isinstance(compressors.as_compressor(None), tfcomp.NoCompression)


@pytest.mark.parametrize("compressor", [tfcomp.DRAGONN(0.01), tfcomp.QSGD(2), tfcomp.FP16(), tfcomp.NoCompression()],
                         ids=repr)
def test_as_compressor_passes_compressors_through(compressor):
    assert compressors.as_compressor(compressor) is compressor
    assert compressors.check_compression(compressor) is compressor


class _NotACompressor:
    def __repr__(self):
        return "<the thing given>"


class _OwnHorovodCompressor(hvd.compression.Compressor):
    """A user's own Horovod compressor: Horovod runs it, tfcomp's exchange does not."""


PUBLIC_COMPRESSORS = [tfcomp.DRAGONN, tfcomp.DGC, tfcomp.TopK, tfcomp.RandomK, tfcomp.EFSignSGD, tfcomp.QSGD, tfcomp.IntQuant,
                      tfcomp.FP16, tfcomp.NoCompression]


@pytest.mark.parametrize("horovods", [hvd.Compression.none, hvd.Compression.fp16, hvd.Compression.fp16(),
                                      _OwnHorovodCompressor, _OwnHorovodCompressor()], ids=repr)
def test_check_compression_passes_horovods_own_compressors_through(horovods):
    assert compressors.check_compression(horovods) is horovods


def test_as_compressor_refuses_a_horovod_compressor_tfcomp_does_not_run():
    for own in (_OwnHorovodCompressor, _OwnHorovodCompressor()):
        with pytest.raises(TypeError, match=r"got the Horovod compressor .*_OwnHorovodCompressor, which tfcomp does "
                                            r"not run: pass it to hvd.DistributedOptimizer"):
            compressors.as_compressor(own)


@pytest.mark.parametrize("cls", PUBLIC_COMPRESSORS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("check", [compressors.as_compressor, compressors.check_compression],
                         ids=["as_compressor", "check_compression"])
def test_a_compressor_class_without_parentheses_says_add_them(cls, check):
    with pytest.raises(TypeError) as caught:
        check(cls)
    message = str(caught.value)
    assert message.startswith("compression must be a tfcomp compressor instance such as tfcomp.DRAGONN()"), message
    assert f"got the class tfcomp.{cls.__name__}: add () to make one, compression=tfcomp.{cls.__name__}()" in message


@pytest.mark.parametrize("check", [compressors.as_compressor, compressors.check_compression],
                         ids=["as_compressor", "check_compression"])
def test_a_private_compressor_class_lists_the_compressors(check):
    for cls in (compressors.Compressor, compressors._Sparsifier):
        with pytest.raises(TypeError, match=rf"got the class tfcomp.compressors.{cls.__name__}: write one of "
                                            r"tfcomp.DRAGONN\(\), tfcomp.DGC\(\), .*tfcomp.NoCompression\(\)"):
            check(cls)


@pytest.mark.parametrize("text, name", [("dragonn", "DRAGONN"), ("DRAGONN", "DRAGONN"), ("dgc", "DGC"),
                                        ("top-k", "TopK"), ("TopK", "TopK"), ("random_k", "RandomK"),
                                        ("efsignsgd", "EFSignSGD"), ("qsgd", "QSGD"), ("fp16", "FP16"),
                                        ("none", "NoCompression"), ("NoCompression", "NoCompression")])
def test_a_compressor_name_as_a_string_says_what_to_write(text, name):
    for check in (compressors.as_compressor, compressors.check_compression):
        with pytest.raises(TypeError) as caught:
            check(text)
        assert f"got {text!r} (a string): write compression=tfcomp.{name}()" in str(caught.value)


def test_an_unknown_string_lists_the_compressors(rng):
    text = "".join(rng.choice(list("xyzw_-"), int(rng.integers(1, 12))))
    with pytest.raises(TypeError, match=rf"got {re.escape(repr(text))} \(a string\): write one of tfcomp.DRAGONN"):
        compressors.check_compression(text)


def test_horovods_compression_namespace_says_pick_one():
    for check in (compressors.as_compressor, compressors.check_compression):
        with pytest.raises(TypeError, match=r"got hvd.Compression itself .*: write hvd.Compression.none or "
                                            r"hvd.Compression.fp16"):
            check(hvd.Compression)


def test_check_compression_refuses_none():
    with pytest.raises(TypeError, match=r"got None: leave compression out or write hvd.Compression.none"):
        compressors.check_compression(None)


@pytest.mark.parametrize("thing", [3, 0.01, _NotACompressor(), object, b"dragonn", [tfcomp.DRAGONN()]], ids=repr)
def test_as_compressor_rejects_other_things(thing):
    for check in (compressors.as_compressor, compressors.check_compression):
        with pytest.raises(TypeError) as caught:
            check(thing)
        assert str(caught.value).startswith("compression must be a tfcomp compressor instance")
        assert repr(thing) in str(caught.value)


# -- equality, hash, repr --------------------------------------------------------------------------


def test_equality_and_hash():
    assert tfcomp.DRAGONN(0.01) == tfcomp.DRAGONN(ratio=0.01)
    assert hash(tfcomp.DRAGONN(0.01)) == hash(tfcomp.DRAGONN(ratio=0.01))
    assert tfcomp.DRAGONN(1) == tfcomp.DRAGONN(1.0) and hash(tfcomp.DRAGONN(1)) == hash(tfcomp.DRAGONN(1.0))
    assert tfcomp.DRAGONN(0.01) != tfcomp.DRAGONN(0.02)
    assert tfcomp.DRAGONN(0.01) != tfcomp.DRAGONN(0.01, slots_per_element=2)
    assert tfcomp.DRAGONN(0.01) != tfcomp.DRAGONN(0.01, warmup_steps=1)
    assert tfcomp.DRAGONN(0.01) != tfcomp.DGC(0.01)  # same hyper-parameters, another compressor
    assert tfcomp.TopK(0.01) != tfcomp.RandomK(0.01)
    assert tfcomp.QSGD(4) != tfcomp.QSGD(4, error_feedback=True)
    assert tfcomp.FP16() == tfcomp.FP16() and tfcomp.FP16() != tfcomp.NoCompression()
    assert tfcomp.DGC(0.01, momentum=0.9) != tfcomp.DGC(0.01)
    assert tfcomp.DRAGONN() != "DRAGONN" and tfcomp.DRAGONN() != None  # noqa: E711
    assert len({tfcomp.DRAGONN(0.01), tfcomp.DRAGONN(0.01), tfcomp.DGC(0.01), tfcomp.FP16(), tfcomp.FP16()}) == 3


@pytest.mark.parametrize(
    "compressor",
    [tfcomp.DRAGONN(0.01, slots_per_element=2, num_samples=100, momentum=0.9, warmup_steps=2, min_elements=10),
     tfcomp.DGC(0.02, num_samples=7), tfcomp.TopK(0.5, error_feedback=False), tfcomp.RandomK(0.1, min_elements=3),
     tfcomp.EFSignSGD(warmup_steps=1), tfcomp.QSGD(3, error_feedback=True, momentum=0.5)],
    ids=lambda c: type(c).__name__,
)
def test_repr_shows_every_hyper_parameter_and_round_trips(compressor):
    text = repr(compressor)
    assert text.startswith(f"tfcomp.{type(compressor).__name__}(")
    for key, value in compressor.get_config().items():
        assert f"{key}={value!r}" in text
    assert eval(text, {"tfcomp": tfcomp}) == compressor  # noqa: S307


@pytest.mark.parametrize("compressor", [tfcomp.FP16(), tfcomp.NoCompression()], ids=lambda c: type(c).__name__)
def test_repr_of_dense_compressors_round_trips(compressor):
    assert eval(repr(compressor), {"tfcomp": tfcomp}) == compressor  # noqa: S307


def test_get_config_holds_no_private_state(rng):
    compressor = tfcomp.DRAGONN(0.05)
    before = compressor.get_config()
    encode(compressor, random_gradient(rng, (2000,), np.float32), 1)
    assert compressor.get_config() == before
    assert not any(re.match(r"_", key) for key in before)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


@pytest.mark.parametrize("name", list(SPARSE_AND_QUANTISED))
@pytest.mark.parametrize("num_workers", [2, 3, 4])
def test_decode_sum_scale_is_applied_to_the_sum(rng, name, num_workers):
    """decode_sum(..., scale) is scale times the sum (exactly for a power of two, as 1/K for K = 2, 4)."""
    compressor, size = SPARSE_AND_QUANTISED[name](), 4099
    seed = draw_seed(rng)
    encodeds = [encode(compressor, random_gradient(rng, (size,), np.float32), seed, worker)
                for worker in range(num_workers)]
    wire = simulated_collective(compressor, encodeds)
    total = compressor.decode_sum(wire, encodeds[0].context, size, num_workers).numpy()
    scaled = compressor.decode_sum(wire, encodeds[0].context, size, num_workers, 1.0 / num_workers).numpy()
    if num_workers in (2, 4):
        np.testing.assert_array_equal(scaled, total / num_workers)
    else:
        np.testing.assert_allclose(scaled, total / num_workers, rtol=1e-6, atol=1e-6 * np.max(np.abs(total)))


@pytest.mark.parametrize("name", [n for n, make in SPARSE_AND_QUANTISED.items() if make().payload_shows_non_finite])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_payload_shows_non_finite_holds_where_claimed(rng, name, bad):
    """Where a compressor claims it, one non-finite element anywhere leaves a non-finite value in
    the payload's floating-point tensors (the exchange then skips its pass over the tensor; DGC
    and RandomK do not claim it: the exchange checks their tensors)."""
    compressor = SPARSE_AND_QUANTISED[name]()
    for size in (7, 1029, 70_001):
        g = random_gradient(rng, (size,), np.float32)
        g[rng.integers(size)] = bad
        encoded = encode(compressor, g, draw_seed(rng), int(rng.integers(4)))
        floats = [w for w in numpy_wire(encoded) if np.issubdtype(w.dtype, np.floating)]
        assert not all(np.all(np.isfinite(w)) for w in floats), f"{name}, size {size}: a {bad} left no trace"


# -- IntQuant: levels an integer allreduce sums ---------------------------------------------------------


def intquant_reference(x: np.ndarray, scale: float, seed: int, worker: int, bits: int, num_workers: int):
    """(int32 lanes, levels of each element, L) by NumPy: int_quantize's reference with the noise
    seed of `worker`."""
    levels = (2 ** (bits - 1) - 1) // num_workers
    lanes = ref.int_quantize(x, scale, hash_seed(seed, worker), bits, levels)
    return lanes, ref.int_dequantize(lanes, 1.0, bits, x.size).astype(np.int64), levels


@pytest.mark.parametrize("bits", [4, 8, 16])
@pytest.mark.parametrize("size", [1, 7, 1029, 70_001])
def test_intquant_payload_matches_the_reference(rng, bits, size):
    compressor = tfcomp.IntQuant(bits)
    num_workers = int(rng.integers(1, 2 ** (bits - 1) // 2 + 1)) if bits < 16 else 9
    x = random_gradient(rng, (size,), np.float32)
    scale = np.float32(np.max(np.abs(x)) * rng.uniform(1.0, 3.0))
    seed, worker = draw_seed(rng), int(rng.integers(num_workers))
    encoded = compressor.encode_scaled(tf.constant(x), tf.constant(scale), seed_tensor(seed), worker, num_workers)
    lanes, _, levels = intquant_reference(x, scale, seed, worker, bits, num_workers)
    np.testing.assert_array_equal(encoded.wire[0].numpy(), lanes)
    assert encoded.context[1] == levels and compressor.payload_bytes(size) == encoded.wire[0].numpy().nbytes


@pytest.mark.parametrize("bits, num_workers", [(4, 1), (4, 7), (8, 2), (8, 5), (16, 3)])
def test_intquant_sum_of_all_workers_decodes_exactly(rng, bits, num_workers):
    """K workers' lanes summed as int32 (the allreduce) unpack to the sum of their levels, also
    where every level is at +-L (the largest sums a field can hold)."""
    compressor = tfcomp.IntQuant(bits)
    size = 1031
    grads = [random_gradient(rng, (size,), np.float32) for _ in range(num_workers)]
    grads[0][:40] = np.max([np.max(np.abs(g)) for g in grads]) * np.where(np.arange(40) % 2, 1, -1)
    for g in grads[1:]:
        g[:40] = grads[0][:40]
    scale = np.float32(max(np.max(np.abs(g)) for g in grads))
    seed = draw_seed(rng)
    encodeds = [compressor.encode_scaled(tf.constant(g), tf.constant(scale), seed_tensor(seed), w, num_workers)
                for w, g in enumerate(grads)]
    summed = np.sum([e.wire[0].numpy().astype(np.int64) for e in encodeds], axis=0)
    assert np.all(np.abs(summed) < 2**31)
    levels_sum = np.sum([intquant_reference(g, scale, seed, w, bits, num_workers)[1] for w, g in enumerate(grads)], axis=0)
    levels = compressor.levels(num_workers)
    # The extremes reached: g * (L / scale) at |g| = scale lands a float32 rounding under L at times
    # (16 bits: L = 10922), and then the noise u may round it to L - 1 (2188104487 drew one of 120).
    extreme = np.abs(levels_sum[:40])
    assert np.all(extreme >= levels * num_workers - num_workers) and np.mean(extreme == levels * num_workers) >= 0.9
    for factor in (1.0, 1.0 / num_workers):
        total = compressor.decode_sum((tf.constant(summed.astype(np.int32)),), encodeds[0].context, size,
                                      num_workers, factor).numpy()
        np.testing.assert_allclose(total, levels_sum * (scale * (factor / levels)), rtol=1e-6, atol=0)


@pytest.mark.parametrize("bits", [4, 8])
def test_intquant_is_unbiased(rng, bits):
    compressor = tfcomp.IntQuant(bits, error_feedback=False)
    x = random_gradient(rng, (300,), np.float32)
    scale = np.float32(np.max(np.abs(x)))
    trials = 400
    decoded = np.stack([compressor.decode_local(
        compressor.encode_scaled(tf.constant(x), tf.constant(scale), seed_tensor(seed), 0, 3), 300).numpy()
        for seed in range(trials)])
    step = scale / compressor.levels(3)
    assert np.all(np.abs(decoded - x) <= step * (1 + 1e-5))
    # Each level is x / step rounded up or down at random: the mean's error has sd <= step / (2 sqrt(n)).
    assert np.max(np.abs(decoded.mean(axis=0) - x)) <= 5 * step / (2 * math.sqrt(trials))


def test_intquant_arguments():
    assert tfcomp.IntQuant().bits == 8 and tfcomp.IntQuant().error_feedback is True
    assert tfcomp.IntQuant().collective == "allreduce" and tfcomp.IntQuant().agrees_scale
    for bad in (5, 32, 0, True, 8.0, "8"):
        with pytest.raises(ValueError, match=r"bits must be 4, 8 or 16, got"):
            tfcomp.IntQuant(bad)
    with pytest.raises(ValueError, match=r"IntQuant\(bits=4\) sums at most 7 workers without overflow, got 8"):
        tfcomp.IntQuant(4).levels(8)
    assert tfcomp.IntQuant(8).payload_bytes(1001) == 1004  # a quarter of float32's 4004
    assert tfcomp.IntQuant(4).payload_bytes(1001) == 4 * 126
