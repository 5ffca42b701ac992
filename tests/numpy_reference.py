"""NumPy reference implementations of the tfcomp ops, written from their specification.

They share only the specification with the kernels: selection is |g| >= t computed in float64,
sampling and hashing follow the documented formulas in uint64 arithmetic, and the collision rule
("largest magnitude wins, then largest index") is evaluated with an explicit per-slot maximum.
`argument_errors` is the specification of the arguments each op (through tfcomp.ops) accepts, and
`REFERENCES` maps each op's name to its reference.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

__all__ = [
    "DTYPES",
    "MAX_LENGTH",
    "REFERENCES",
    "adam_accumulate",
    "argument_errors",
    "dgc_compress",
    "dragonn_compress",
    "estimate_threshold",
    "magnitude_rank",
    "mix64",
    "momentum_accumulate",
    "sample_positions",
    "slot_hash",
    "sparse_batched_decode",
    "topk_compress",
]

DTYPES = (np.float32, np.float16, tf.bfloat16.as_numpy_dtype)
MAX_LENGTH = 2**31 - 1  # indices are int32
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_U64 = np.uint64


def _bits_view(g: np.ndarray) -> np.ndarray:
    return g.reshape(-1).view(np.uint32 if g.dtype.itemsize == 4 else np.uint16)


def magnitude_rank(g: np.ndarray) -> np.ndarray:
    """Integers that order the elements by |g| with NaN above Inf above every finite value."""
    bits = _bits_view(g).astype(np.int64)
    return bits & (0x7FFFFFFF if g.dtype.itemsize == 4 else 0x7FFF)


def selected(g: np.ndarray, threshold: float) -> np.ndarray:
    """Flat mask of |g| >= threshold, NaN always included."""
    return ~(np.abs(g.reshape(-1).astype(np.float64)) < np.float64(np.float32(threshold)))


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = np.asarray(x, dtype=_U64) + _U64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
        return x ^ (x >> _U64(31))


def _reduce(r32: np.ndarray, n) -> np.ndarray:
    return (r32.astype(_U64) * np.asarray(n, dtype=_U64)) >> _U64(32)


def sample_positions(n: int, size: int, seed: int) -> np.ndarray:
    """Stratified sample: one uniform position in each stratum [i*size//n, (i+1)*size//n)."""
    i = np.arange(n, dtype=np.int64)
    lo, hi = i * size // n, (i + 1) * size // n
    seed64 = _U64(np.int64(seed).view(np.uint64))
    r32 = mix64(seed64 ^ mix64(i.astype(_U64))) >> _U64(32)
    return lo + _reduce(r32, (hi - lo)).astype(np.int64)


def estimate_threshold(g: np.ndarray, ratio: float, num_samples: int, seed: int) -> np.float32:
    """k-th largest finite |g| over the sample, k = max(1, round-half-up(ratio * n))."""
    flat = g.reshape(-1)
    n = min(num_samples, flat.size)
    sample = flat if n == flat.size else flat[sample_positions(n, flat.size, seed)]
    k = max(1, math.floor(float(np.float32(ratio)) * n + 0.5))
    finite = np.sort(np.abs(sample[np.isfinite(sample)]).astype(np.float32))[::-1]
    if finite.size == 0:
        return np.float32(tf.as_dtype(g.dtype).max)
    return np.float32(finite[min(k, finite.size) - 1])


def slot_hash(indices: np.ndarray, seed: int, num_slots: int) -> np.ndarray:
    """Multiply-add-shift universal hash of flat indices into [0, num_slots)."""
    seed64 = _U64(np.int64(seed).view(np.uint64))
    a = mix64(seed64 ^ _U64(0xD1B54A32D192ED03)) | _U64(1)
    with np.errstate(over="ignore"):
        b = mix64(seed64 + _U64(0x632BE59BD9B4E019))
        h32 = (a * indices.astype(_U64) + b) >> _U64(32)
    return _reduce(h32, num_slots).astype(np.int64)


def dragonn_compress(g: np.ndarray, threshold: float, num_slots: int, seed: int):
    """004 Algorithm 1 with the documented collision rule."""
    flat = g.reshape(-1)
    chosen = np.flatnonzero(selected(g, threshold))
    best = np.full(num_slots, -1, dtype=np.int64)
    best_rank = np.full(num_slots, -1, dtype=np.int64)
    ranks = magnitude_rank(g)
    for index, slot in zip(chosen, slot_hash(chosen, seed, num_slots)):
        if (ranks[index], index) > (best_rank[slot], best[slot]):
            best[slot], best_rank[slot] = index, ranks[index]
    values = np.zeros(num_slots, dtype=g.dtype)
    values[best >= 0] = flat[best[best >= 0]]
    return values, best.astype(np.int32)


def dgc_compress(g: np.ndarray, threshold: float, max_out: int):
    """The first max_out selected elements in index order, padded with -1 / 0."""
    flat = g.reshape(-1)
    chosen = np.flatnonzero(selected(g, threshold))[:max_out]
    indices = np.full(max_out, -1, dtype=np.int32)
    indices[: chosen.size] = chosen
    values = np.zeros(max_out, dtype=g.dtype)
    values[: chosen.size] = flat[chosen]
    return values, indices


def topk_compress(g: np.ndarray, k: int):
    """The k largest |g| (ties: larger index first), reported in increasing index order."""
    flat = g.reshape(-1)
    order = np.lexsort((np.arange(flat.size), magnitude_rank(g)))  # ascending by (rank, index)
    chosen = np.sort(order[-k:])
    return flat[chosen], chosen.astype(np.int32)


def _flush_denormals(x: np.ndarray) -> np.ndarray:
    """x with float32-denormal magnitudes replaced by zeros of their sign."""
    tiny = (x != 0) & (np.abs(x.astype(np.float32)) < np.finfo(np.float32).tiny)
    return np.where(tiny, np.copysign(np.zeros_like(x), x), x)


def accumulate(g: np.ndarray, r: np.ndarray) -> np.ndarray:
    """float32 g + r as TensorFlow's CPU kernels compute it: denormal inputs and results flushed to
    zero (TensorFlow sets FTZ and DAZ on its threads)."""
    return _flush_denormals(_flush_denormals(g.astype(np.float32)) + _flush_denormals(r.astype(np.float32)))


def _rounded(operation, *operands) -> np.ndarray:
    """One float32 operation as TensorFlow's CPU threads run it: denormal operands read as zero,
    a denormal result flushed to zero."""
    with np.errstate(all="ignore"):
        result = operation(*[_flush_denormals(np.asarray(x, np.float32)) for x in operands])
    return _flush_denormals(np.asarray(result, np.float32))


def momentum_accumulate(g, u, mu: float, r=None):
    """(u' = mu * u + g, r + u' or u' without r), float32, each operation rounded as TensorFlow's."""
    new_u = _rounded(np.add, _rounded(np.multiply, np.float32(mu), u), g)
    return new_u, new_u if r is None else _rounded(np.add, r, new_u)


def adam_accumulate(g, m, v, t: float, beta_1: float, beta_2: float, epsilon: float, r=None):
    """(m', v', r + d or d without r) of the Adam correction, float32, each operation rounded as
    TensorFlow's; 1 - beta rounded to float32 from Python's difference, the bias corrections
    1 - beta^t in float32 with beta^t from tf.pow itself: float32 pow is not correctly rounded, and
    NumPy's differs from TensorFlow's in the last bit for about one (beta, t) in ten."""
    b1, b2, eps = np.float32(beta_1), np.float32(beta_2), np.float32(epsilon)
    new_m = _rounded(np.add, _rounded(np.multiply, b1, m), _rounded(np.multiply, np.float32(1.0 - beta_1), g))
    new_v = _rounded(np.add, _rounded(np.multiply, b2, v),
                     _rounded(np.multiply, np.float32(1.0 - beta_2), _rounded(np.multiply, g, g)))
    m_correction = np.float32(1.0) - np.float32(tf.pow(b1, np.float32(t)).numpy())
    v_correction = np.float32(1.0) - np.float32(tf.pow(b2, np.float32(t)).numpy())
    denominator = _rounded(np.add, _rounded(np.sqrt, _rounded(np.divide, new_v, v_correction)), eps)
    direction = _rounded(np.divide, _rounded(np.divide, new_m, m_correction), denominator)
    return new_m, new_v, direction if r is None else _rounded(np.add, r, direction)


def uniform24(seed: int, n: int) -> np.ndarray:
    """float32 [n]: int_quantize's rounding noise u_i = (mix64(mix64(seed) + i) >> 40) / 2^24."""
    with np.errstate(over="ignore"):
        r = mix64(mix64(_U64(seed % 2**64)) + np.arange(n, dtype=_U64))
    return ((r >> _U64(40)).astype(np.float32) * np.float32(1.0 / 16777216.0)).astype(np.float32)


def int_quantize(g: np.ndarray, scale: float, seed: int, bits: int, levels: int) -> np.ndarray:
    """int32 lanes: clamp(floor(g * (levels / scale) + u), -levels, levels) in float32 (denormals
    flushed, as on TensorFlow's threads), 0 for non-finite values or a scale that is not positive
    and finite, 32 / bits levels per int32, level j of a lane times 2^(bits j)."""
    flat = _flush_denormals(np.asarray(g, np.float32).reshape(-1))
    scale = np.float32(scale)
    with np.errstate(all="ignore"):
        per_level = _flush_denormals(np.float32(levels) / scale)
        x = _flush_denormals(flat * per_level)
        x = (x + uniform24(seed, flat.size)).astype(np.float32)
        level = np.clip(np.floor(x), -levels, levels)
    valid = bool(scale > 0 and np.isfinite(scale))
    level = np.where(np.isfinite(x) & valid, level, 0).astype(np.int64)
    fields = 32 // bits
    packed = np.pad(level, (0, -flat.size % fields)).reshape(-1, fields)
    lanes = np.sum(packed << (bits * np.arange(fields, dtype=np.int64)), axis=1)
    assert np.all(np.abs(lanes) < 2**31)
    return lanes.astype(np.int32)


def int_dequantize(lanes: np.ndarray, step: float, bits: int, size: int) -> np.ndarray:
    """float32 [size]: the signed bits-wide fields of each int32 lane, lowest first, times step."""
    x = np.asarray(lanes, np.int32).astype(np.int64)
    half, mask = 1 << (bits - 1), (1 << bits) - 1
    fields = []
    for _ in range(32 // bits):
        field = ((x + half) & mask) - half
        fields.append(field)
        x = (x - field) >> bits
    levels = np.stack(fields, axis=1).reshape(-1)[:size]
    return _flush_denormals(levels.astype(np.float32) * np.float32(step))


def sparse_batched_decode(values: np.ndarray, indices: np.ndarray, size: int) -> np.ndarray:
    """Dense sum of the pairs in pair order; index -1 skipped.

    TensorFlow runs CPU kernels with denormals flushed to zero (FTZ and DAZ): float32 and bfloat16
    add in float32, so a float32-denormal addend or sum counts as a zero of its sign (float16's
    denormals are normal float32 values and stay).
    """
    dense = np.zeros(size, dtype=values.dtype)
    keep = np.flatnonzero(indices >= 0)
    if values.dtype == np.float16:
        np.add.at(dense, indices[keep], values[keep])
        return dense
    # The additions to each element in pair order: round r adds every element's r-th pair.
    order = keep[np.argsort(indices[keep], kind="stable")]
    sorted_indices = indices[order]
    starts = np.flatnonzero(np.r_[True, sorted_indices[1:] != sorted_indices[:-1]]) if order.size else np.zeros(0, int)
    rank = np.arange(order.size) - np.repeat(starts, np.diff(np.r_[starts, order.size]))
    for r in range(int(rank.max(initial=-1)) + 1):
        pairs = order[rank == r]
        targets = indices[pairs]
        dense[targets] = _flush_denormals(dense[targets] + _flush_denormals(values[pairs]))
    return dense


def hash_owner(indices: np.ndarray, num_parts: int) -> np.ndarray:
    """The owner of each index >= 0: u = (i * 2654435761) mod 2^32, floor(u * num_parts / 2^32)."""
    mixed = (indices.astype(np.uint64) * np.uint64(2654435761)) & np.uint64(0xFFFFFFFF)
    return ((mixed * np.uint64(num_parts)) >> np.uint64(32)).astype(np.int64)


def hash_partition(values: np.ndarray, indices: np.ndarray, num_parts: int):
    """(rows int32 [n, 2], splits int32 [num_parts]): the pairs of index >= 0 sorted stably by owner,
    each row its index and its value's float32 bits."""
    keep = np.flatnonzero(indices >= 0)
    owners = hash_owner(indices[keep], num_parts)
    order = keep[np.argsort(owners, kind="stable")]
    rows = np.stack([indices[order].astype(np.int32), values[order].astype(np.float32).view(np.int32)], axis=1)
    return rows.reshape(-1, 2), np.bincount(owners, minlength=num_parts).astype(np.int32)


def sum_pairs(rows: np.ndarray, max_pairs: int = -1) -> np.ndarray:
    """int32 [m, 2]: each distinct index of rows (int32 [n, 2], index and float32 bits) with the
    bits of the sum of its values in row order, at most max_pairs (-1: all) kept, the largest
    |sum| first (NaN above Inf, by the bits of |sum|), ties to the lower index; ascending index order.
    Each sum starts at 0 and adds as TensorFlow's CPU threads do (denormals flushed)."""
    rows = rows.astype(np.int32).reshape(-1, 2)
    indices, segment = np.unique(rows[:, 0].astype(np.int64), return_inverse=True)
    values = rows[:, 1].view(np.float32)
    # The j-th value of every index's rows (in row order) is added in round j, all indices at once.
    order = np.argsort(segment, kind="stable")
    starts = np.searchsorted(segment[order], np.arange(indices.size))
    place = np.empty(rows.shape[0], np.int64)
    place[order] = np.arange(rows.shape[0]) - starts[segment[order]]
    by_place = np.argsort(place, kind="stable")
    bounds = np.searchsorted(place[by_place], np.arange(place.max() + 2 if place.size else 1))
    sums = np.zeros(indices.size, np.float32)
    for first, last in zip(bounds[:-1], bounds[1:]):
        chosen = by_place[first:last]
        sums[segment[chosen]] = _rounded(np.add, sums[segment[chosen]], values[chosen])
    bits = sums.view(np.int32)
    if 0 <= max_pairs < indices.size:
        magnitude = (bits.astype(np.int64) & 0x7FFFFFFF)
        kept = np.lexsort((indices, -magnitude))[:max_pairs]
        keep = np.zeros(indices.size, bool)
        keep[kept] = True
        indices, bits = indices[keep], bits[keep]
    return np.stack([indices.astype(np.int32), bits], axis=1).reshape(-1, 2)


REFERENCES = {
    "estimate_threshold": estimate_threshold,
    "dragonn_compress": dragonn_compress,
    "dgc_compress": dgc_compress,
    "topk_compress": topk_compress,
    "sparse_batched_decode": sparse_batched_decode,
    "sum_pairs": sum_pairs,
}


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _int_in(x, low: int, high: int) -> bool:
    """x is a Python or NumPy int (not bool) in [low, high]: an attribute, or a seed given as a number."""
    return _is_int(x) and low <= int(x) <= high


def _float32_scalar(x):
    """The float32 that a real scalar argument (Python or NumPy number, or 0-d int/float array)
    becomes, or None when x is not one."""
    if isinstance(x, (bool, np.bool_)):
        return None
    if isinstance(x, np.ndarray):
        if x.shape != () or not (x.dtype.kind in "iuf" or x.dtype == DTYPES[2]):
            return None
        x = x[()]
    if not isinstance(x, (int, float, np.integer, np.floating)) and not (isinstance(x, np.generic) and x.dtype == DTYPES[2]):
        return None
    if isinstance(x, int) and abs(x) >= 2**128:
        return np.float32(math.inf if x > 0 else -math.inf)
    with np.errstate(over="ignore"):
        return np.float32(x)


def _seed_ok(x) -> bool:
    """An int64 scalar: a Python or NumPy int, or a 0-d integer array, in int64's range."""
    if isinstance(x, np.ndarray):
        return x.shape == () and x.dtype.kind in "iu" and _INT64[0] <= int(x) <= _INT64[1]
    return _int_in(x, *_INT64)


def _gradient_ok(g, allow_empty: bool = True) -> bool:
    return isinstance(g, np.ndarray) and g.dtype in DTYPES and (allow_empty or g.size > 0) and g.size <= MAX_LENGTH


def argument_errors(op: str, args: dict) -> set:
    """The names of the arguments of `op(**args)` that its specification rejects; empty when the call
    is valid. An error must name at least one of them. Tensors are NumPy arrays here."""
    bad = set()
    if op in ("estimate_threshold", "dragonn_compress", "dgc_compress", "topk_compress"):
        if not _gradient_ok(args["grad"], allow_empty=op != "estimate_threshold"):
            bad.add("grad")
    if op == "estimate_threshold":
        ratio = _float32_scalar(args["ratio"])
        if ratio is None or not 0 < ratio <= 1:
            bad.add("ratio")
        if not _int_in(args["num_samples"], 1, _INT64[1]):
            bad.add("num_samples")
    if op in ("dragonn_compress", "dgc_compress"):
        threshold = _float32_scalar(args["threshold"])
        if threshold is None or not np.isfinite(threshold):
            bad.add("threshold")
    if op in ("estimate_threshold", "dragonn_compress") and not _seed_ok(args["seed"]):
        bad.add("seed")
    for length in ("num_slots", "max_out", "k"):
        if length in args and not _int_in(args[length], 1, MAX_LENGTH):
            bad.add(length)
    if op == "topk_compress" and "k" not in bad and "grad" not in bad and args["k"] > args["grad"].size:
        bad.add("k")
    if op == "sparse_batched_decode":
        values, indices, size = args["values"], args["indices"], args["size"]
        if not _int_in(size, 0, MAX_LENGTH):
            bad.add("size")
        if not (isinstance(values, np.ndarray) and values.dtype in DTYPES and values.ndim == 1):
            bad.add("values")
        if not (isinstance(indices, np.ndarray) and (indices.dtype.kind in "iu" or indices.size == 0) and indices.ndim == 1):
            bad.add("indices")
        elif indices.size and (indices.min() < _INT32[0] or indices.max() > _INT32[1]):
            bad.add("indices")
        if not bad & {"values", "indices"} and values.size != indices.size:
            bad.update(("values", "indices"))
        if not bad and indices.size and (indices.min() < -1 or indices.max() >= size):
            bad.add("indices")
    if op == "sum_pairs":
        rows, max_pairs = args["rows"], args["max_pairs"]
        if not (max_pairs is None or _int_in(max_pairs, 0, MAX_LENGTH)):
            bad.add("max_pairs")
        if not (isinstance(rows, np.ndarray) and (rows.dtype.kind in "iu" or rows.size == 0) and rows.ndim == 2
                and rows.shape[1] == 2):
            bad.add("rows")
        elif rows.size and (rows.min() < _INT32[0] or rows.max() > _INT32[1] or rows[:, 0].min() < 0):
            bad.add("rows")
    return bad
