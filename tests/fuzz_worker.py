"""Seeded fuzz cases for the tfcomp ops, run in a child process by tests/test_fuzz_ops.py.

A case is drawn from a NumPy generator seeded by (seed, op, case number) alone, so any case can be
drawn and run again on its own:

    python -m tests.fuzz_worker --op dgc_compress --seed 123 --first 456 --count 1 --show

Each case calls one op with random arguments, valid or not (sizes 0, 1, odd and several blocks
long; float32, float16 and bfloat16 with NaN, Inf, ties and denormals; huge, negative, NaN and Inf
numbers; -1, duplicate and out-of-range indices; wrong shapes and dtypes): mostly through
tfcomp.ops, sometimes through the raw generated op (so only the kernel checks) or inside a
tf.function. `numpy_reference.argument_errors` says which arguments are invalid; a valid call must
match the NumPy reference bit for bit, an invalid one must raise a ValueError, TypeError or
InvalidArgumentError that names one of them.

Before a case the worker prints "start <case>", after it one JSON line {"case", "outcome", "detail"}
with outcome "valid", "rejected" or "fail". A crash (abort, segfault, an AddressSanitizer report)
ends the process between the two, and the parent reports the case.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

import numpy as np
import tensorflow as tf

from tests import numpy_reference as ref
from tfcomp import ops

__all__ = ["OPS", "describe", "draw_case", "main", "run_case"]

OPS = tuple(ref.REFERENCES)  # an op's position here is part of its cases' seeds
ARGUMENTS = {
    "estimate_threshold": ("grad", "ratio", "num_samples", "seed"),
    "dragonn_compress": ("grad", "threshold", "num_slots", "seed"),
    "dgc_compress": ("grad", "threshold", "max_out"),
    "topk_compress": ("grad", "k"),
    "sparse_batched_decode": ("values", "indices", "size"),
    "sum_pairs": ("rows", "max_pairs"),
}
LENGTH_ARGUMENT = {"dragonn_compress": "num_slots", "dgc_compress": "max_out", "topk_compress": "k"}
BFLOAT16 = ref.DTYPES[2]

_SIZES = (0, 1, 2, 3, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 1000, 1023, 1024, 1025)
# Bad values: any call path, then only through tfcomp.ops (the raw op converts these its own way).
_BAD_LENGTHS = (0, -1, -(2**63), 2**31, 2**32 + 1, 2**63 - 1)
_BAD_LENGTHS_WRAPPER = (2**63, 2**64, 10**30, 3.0, True, "7", None, np.int64(-5), np.uint64(2**64 - 1))
_BAD_REALS = (np.nan, np.inf, -np.inf, 1e39, -1e39, np.array(np.nan, np.float32), np.array([0.1, 0.2], np.float32))
_BAD_REALS_WRAPPER = (10**400, True, "0.5", None, 1j, np.array(True), np.array(np.inf))
_BAD_RATIOS = (0.0, -0.5, 1.5, 2, 1e-50, float(np.nextafter(np.float32(1), np.float32(2))), np.array(0.0, np.float32))
_BAD_SEEDS = (np.array([1, 2], np.int64), np.array([[3]], np.int64))
_BAD_SEEDS_WRAPPER = (2**63, -(2**63) - 1, 2**64, np.uint64(2**63 + 5), 1.5, None, "3", True, np.array(1.5))
_BAD_INDICES = (-2, -(2**31), 2**31 - 1)
_BAD_INDICES_WRAPPER = (2**31, -(2**31) - 1, 2**40)


def _pick(rng: np.random.Generator, items):
    return items[int(rng.integers(len(items)))]


def _size(rng: np.random.Generator) -> int:
    r = rng.random()
    if r < 0.5:
        return _pick(rng, _SIZES)
    if r < 0.98:
        return int(rng.integers(0, 4000))
    return int(rng.integers(65_536, 140_000))  # several blocks of the CPU kernels, several threads


def _shape(rng: np.random.Generator, size: int) -> tuple:
    if size == 1 and rng.random() < 0.2:
        return ()
    if size == 0 and rng.random() < 0.3:
        return (3, 0)
    divisors = [d for d in (2, 3, 5, 7) if size % d == 0 and size > d]
    if divisors and rng.random() < 0.3:
        d = _pick(rng, divisors)
        return (d, size // d) if rng.random() < 0.5 else (1, d, size // d)
    return (size,)


def _dtype(rng: np.random.Generator, bad_dtype: bool):
    return _pick(rng, (np.float64, np.int32)) if bad_dtype else _pick(rng, ref.DTYPES)


def _values(rng: np.random.Generator, shape: tuple, dtype) -> np.ndarray:
    """Random gradient values of one of several styles, with NaN, Inf and signed zeros sometimes."""
    n = int(np.prod(shape))
    style = int(rng.integers(5))
    if style == 0:
        g = rng.standard_normal(n) * np.where(rng.random(n) < 0.01, 30.0, 1.0)
    elif style == 1:
        g = rng.integers(-3, 4, n) * 0.5  # many equal magnitudes
    elif style == 2:
        g = rng.standard_normal(n) * 10.0 ** rng.integers(-45, 40, n)  # denormals to overflow
    elif style == 3:
        g = np.full(n, rng.standard_normal())
    else:
        g = rng.uniform(-1, 1, n)
    if n and rng.random() < 0.3:
        where = rng.integers(0, n, int(rng.integers(1, max(2, n // 10) + 1)))
        g[where] = rng.choice(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0]), where.size)
    with np.errstate(over="ignore", invalid="ignore"):
        return g.astype(dtype).reshape(shape)


def _as_scalar(rng: np.random.Generator, value: float):
    """A good float as a Python float, a NumPy scalar or a 0-d array."""
    return _pick(rng, (value, value, value, np.float32(value), np.array(value, np.float32), np.array(value), BFLOAT16(value)))


def _bad(rng: np.random.Generator, raw: bool, common: tuple, wrapper_only: tuple):
    return _pick(rng, common if raw else common + wrapper_only)


def _gradient_case(rng: np.random.Generator, op: str, raw: bool, p_bad: float) -> dict:
    size = _size(rng)
    if op == "estimate_threshold" and size == 0 and rng.random() < 0.8:
        size = 1
    grad = _values(rng, _shape(rng, size), _dtype(rng, rng.random() < p_bad / 3))
    args = {"grad": grad}
    finite = np.abs(grad[np.isfinite(grad)].astype(np.float64)).reshape(-1) if grad.dtype in ref.DTYPES else np.zeros(0)
    if op in ("dragonn_compress", "dgc_compress"):
        fraction = rng.uniform(0.001, 0.3 if size < 5000 else 0.02)
        threshold = float(np.quantile(finite, 1 - fraction)) if finite.size else 1.0
        if size < 5000 and rng.random() < 0.2:
            threshold = _pick(rng, (0.0, -1.0, 3.4e38, 1e-45, float(rng.standard_normal())))
        args["threshold"] = _as_scalar(rng, threshold)
        if rng.random() < p_bad:
            args["threshold"] = _bad(rng, raw, _BAD_REALS, _BAD_REALS_WRAPPER)
    if op == "estimate_threshold":
        args["ratio"] = _as_scalar(rng, _pick(rng, (float(rng.uniform(1e-4, 1)), 1.0, 1e-30, 1e-40, float(rng.uniform(0, 0.05)) or 0.01)))
        if rng.random() < 0.05:
            args["ratio"] = 1  # an int is a real number too
        if rng.random() < p_bad:
            args["ratio"] = _bad(rng, raw, _BAD_RATIOS + _BAD_REALS, _BAD_REALS_WRAPPER)
        args["num_samples"] = _pick(rng, (int(rng.integers(1, 2 * size + 5)), int(rng.integers(1, 64)), 2**62, 2**63 - 1))
        if rng.random() < p_bad:
            args["num_samples"] = _bad(rng, raw, _BAD_LENGTHS[:3], _BAD_LENGTHS_WRAPPER)
    if op in ("estimate_threshold", "dragonn_compress"):
        seed = int(rng.integers(-(2**63), 2**63 - 1, endpoint=True, dtype=np.int64)) if rng.random() < 0.7 else int(rng.integers(0, 100))
        args["seed"] = _pick(rng, (seed, seed, np.int64(seed), np.array(seed, np.int64)))
        if rng.random() < p_bad:
            args["seed"] = _bad(rng, raw, _BAD_SEEDS, _BAD_SEEDS_WRAPPER)
    if op in LENGTH_ARGUMENT:
        name = LENGTH_ARGUMENT[op]
        if op == "topk_compress":
            length = int(rng.integers(1, size + 1)) if size else 1
        else:
            length = int(rng.integers(1, min(3 * size + 50, 20_000)))
        args[name] = _pick(rng, (length, length, np.int64(length)))
        if rng.random() < p_bad:
            args[name] = _bad(rng, raw, _BAD_LENGTHS, _BAD_LENGTHS_WRAPPER)
        elif op == "topk_compress" and rng.random() < p_bad:
            args[name] = size + int(rng.integers(1, 5))
    return args


def _decode_case(rng: np.random.Generator, raw: bool, p_bad: float) -> dict:
    size = _size(rng)
    workers = _pick(rng, (1, 2, 4, 16))
    n = workers * int(rng.integers(0, 400)) if rng.random() < 0.95 else int(rng.integers(8192, 20_000))
    indices = rng.integers(-1, size, n) if size else np.full(n, -1)
    if size and n >= 4:
        indices[: n // 4] = rng.integers(0, max(1, size // 50), n // 4)  # duplicates
    values = _values(rng, (n,), _dtype(rng, rng.random() < p_bad / 3))
    if n and rng.random() < 2 * p_bad:
        position = int(rng.integers(n))
        bad = _bad(rng, raw, _BAD_INDICES + (size, size + int(rng.integers(1, 100))), _BAD_INDICES_WRAPPER)
        indices = indices.astype(np.int64)
        indices[position] = bad
    int32_fit = indices.size == 0 or (indices.min() >= -(2**31) and indices.max() < 2**31)
    indices = indices.astype(np.int32 if int32_fit and (raw or rng.random() < 0.85) else np.int64)
    if rng.random() < p_bad / 2:
        values = values[:-1] if n and rng.random() < 0.5 else np.append(values, values[:1])
    if rng.random() < p_bad / 2:
        if rng.random() < 0.5:
            values = values.reshape(1, -1)
        else:
            indices = indices.reshape(1, -1)
    if not raw and rng.random() < p_bad / 3:
        indices = indices.astype(np.float64)
    args = {"values": values, "indices": indices, "size": _pick(rng, (size, size, np.int64(size)))}
    if rng.random() < p_bad:
        args["size"] = _bad(rng, raw, _BAD_LENGTHS[1:], _BAD_LENGTHS_WRAPPER)
    return args


def _pairs_case(rng: np.random.Generator, raw: bool, p_bad: float) -> dict:
    """sum_pairs: rows an owner could receive (indices repeating, any int32 value bits), at times
    a negative index, a bad shape or dtype; max_pairs None, small, about the distinct count, or huge."""
    n = _size(rng)
    top = _pick(rng, (1, 50, n + 1, 2**31 - 1))
    indices = rng.integers(0, top, n, dtype=np.int64)
    if n >= 4:
        indices[: n // 4] = indices[n // 4: 2 * (n // 4)]  # duplicates
    rows = np.stack([indices, _values(rng, (n,), np.float32).view(np.int32)], axis=1)
    if n and rng.random() < 2 * p_bad:
        rows[int(rng.integers(n)), 0] = _pick(rng, (-1, -2, -(2**31)) if raw else (-1, -(2**31), 2**31, -(2**40)))
    int32_fit = rows.size == 0 or (rows.min() >= -(2**31) and rows.max() < 2**31)
    rows = rows.astype(np.int32 if int32_fit and (raw or rng.random() < 0.85) else np.int64)
    if rng.random() < p_bad / 2:
        rows = _pick(rng, (rows.reshape(-1), rows.reshape(1, -1, 2), np.concatenate([rows, rows[:, :1]], axis=1)))
    if not raw and rng.random() < p_bad / 3:
        rows = rows.astype(np.float32)
    max_pairs = _pick(rng, (None, 0, 1, int(rng.integers(0, n + 2)), n, 2**31 - 1, np.int64(max(n // 3, 0))))
    if rng.random() < p_bad:
        max_pairs = _bad(rng, raw, (-2, -(2**63), 2**31, 2**32 + 1), (-1, 2**63, 3.0, True, "7", np.int64(-5)))
    return {"rows": rows, "max_pairs": max_pairs}


def draw_case(seed: int, op: str, case: int) -> tuple:
    """(call path, arguments) of case `case` of `op` under `seed`: the path is "ops" (tfcomp.ops),
    "raw" (the generated op, no Python checks) or "graph" (tfcomp.ops in a tf.function)."""
    rng = np.random.default_rng([seed, OPS.index(op), case])
    path = _pick(rng, ("ops",) * 17 + ("raw", "raw", "graph"))
    p_bad = _pick(rng, (0.0, 0.0, 0.05, 0.1, 0.3))
    if op == "sparse_batched_decode":
        return path, _decode_case(rng, path == "raw", p_bad)
    if op == "sum_pairs":
        return path, _pairs_case(rng, path == "raw", p_bad)
    return path, _gradient_case(rng, op, path == "raw", p_bad)


def describe(path: str, args: dict) -> str:
    """A short readable form of a case: arrays by dtype and shape (and values when tiny)."""

    def show(value) -> str:
        if isinstance(value, np.ndarray):
            head = f"{value.dtype.name}{list(value.shape)}"
            return f"{head}={value.tolist()}" if value.size <= 8 else head
        return f"{type(value).__name__}({value!r})"

    return f"path={path} " + ", ".join(f"{name}={show(value)}" for name, value in args.items())


def _raw_call(raw_ops, op: str, args: dict):
    """The generated op, with the scalars converted as the wrappers convert them (no checks)."""
    if op == "sparse_batched_decode":
        return raw_ops.tfcomp_sparse_batched_decode(args["values"], args["indices"], size=args["size"])
    if op == "sum_pairs":
        return raw_ops.tfcomp_sum_pairs(args["rows"], max_pairs=-1 if args["max_pairs"] is None else args["max_pairs"])
    with np.errstate(over="ignore"):
        real = {name: np.asarray(args[name], np.float32) for name in ("ratio", "threshold") if name in args}
    seed = {"seed": np.asarray(args["seed"], np.int64)} if "seed" in args else {}
    if op == "estimate_threshold":
        return raw_ops.tfcomp_estimate_threshold([args["grad"]], real["ratio"], seed["seed"], [],
                                                 num_samples=args["num_samples"])
    if op == "dragonn_compress":
        return raw_ops.tfcomp_dragonn_compress([args["grad"]], real["threshold"], seed["seed"], [],
                                               num_slots=args["num_slots"])[:2]
    if op == "dgc_compress":
        return raw_ops.tfcomp_dgc_compress(args["grad"], real["threshold"], max_out=args["max_out"])
    return raw_ops.tfcomp_topk_compress(args["grad"], k=args["k"])


def _expected(op: str, args: dict) -> list:
    """The NumPy reference's outputs for valid arguments."""
    canonical = {name: args[name] for name in ARGUMENTS[op]}
    for name in ("ratio", "threshold"):
        if name in canonical:
            canonical[name] = float(np.float32(canonical[name]))
    for name in ("seed", "num_samples", "num_slots", "max_out", "k", "size"):
        if name in canonical:
            canonical[name] = int(canonical[name])
    if op == "sparse_batched_decode":
        canonical["indices"] = canonical["indices"].astype(np.int32)
    if op == "sum_pairs":
        canonical = {"rows": canonical["rows"].astype(np.int32).reshape(-1, 2),
                     "max_pairs": -1 if canonical["max_pairs"] is None else int(canonical["max_pairs"])}
    outputs = ref.REFERENCES[op](*canonical.values())
    return [np.asarray(output) for output in (outputs if isinstance(outputs, tuple) else (outputs,))]


def run_case(op: str, path: str, args: dict) -> tuple:
    """Runs one case; returns (outcome, detail) with outcome "valid", "rejected" or "fail"."""
    invalid = ref.argument_errors(op, args)
    try:
        if path == "raw":
            result = _raw_call(ops.load_library(), op, args)
        elif path == "graph":
            result = tf.function(lambda: getattr(ops, op)(**args), autograph=False)()
        else:
            result = getattr(ops, op)(**args)
    except (ValueError, TypeError, tf.errors.InvalidArgumentError) as error:
        message = f"{type(error).__name__}: {error}".replace("\n", " ")[:400]
        if not invalid:
            return "fail", f"valid arguments rejected: {message}"
        if not any(re.search(rf"\b{name}\b", message) for name in invalid):
            return "fail", f"the error names none of the invalid arguments {sorted(invalid)}: {message}"
        return "rejected", message
    except Exception as error:  # noqa: BLE001 - any other error is a failure of the case
        return "fail", f"unexpected {type(error).__name__}: {str(error)[:400]}"
    if invalid:
        return "fail", f"invalid arguments {sorted(invalid)} accepted"
    actual = [np.asarray(output) for output in (result if isinstance(result, (tuple, list)) else (result,))]
    expected = _expected(op, args)
    if op == "sum_pairs":  # (index, float32 bits) rows: the bits compared as floats, so NaN equals NaN
        actual, expected = ([rows[:, 0], rows[:, 1].view(np.float32)] if rows.shape == (rows.shape[0], 2) else [rows]
                            for rows in (actual[0], expected[0]))
    for position, (got, want) in enumerate(zip(actual, expected)):
        if got.dtype != want.dtype or got.shape != want.shape:
            return "fail", f"output {position} is {got.dtype}{list(got.shape)}, the reference {want.dtype}{list(want.shape)}"
        differ = np.flatnonzero(_differ(got.reshape(-1), want.reshape(-1)))
        if differ.size:
            return "fail", f"output {position} differs from the reference at {differ[:3].tolist()}: {got.reshape(-1)[differ[:3]]} vs {want.reshape(-1)[differ[:3]]}"
    return "valid", ""


def _differ(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Where two arrays of one dtype differ in their bits, except that any NaN equals any NaN: which
    NaN a sum of NaNs and opposite infinities gives depends on the order of a CPU's operands."""
    view = {4: np.uint32, 2: np.uint16}[want.dtype.itemsize]
    nan = np.isnan(got) & np.isnan(want) if want.dtype.kind != "i" else False
    return (got.view(view) != want.view(view)) & ~nan


def main(argv=None) -> int:
    """Runs cases [first, first + count) of one op and prints their outcomes (see the module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--op", choices=OPS, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--show", action="store_true", help="print each case's arguments")
    args = parser.parse_args(argv)
    tf.get_logger().setLevel("ERROR")  # tf.function's retracing warnings
    tf.config.threading.set_intra_op_parallelism_threads(4)  # the kernels' multi-threaded paths, on any machine
    for case in range(args.first, args.first + args.count):
        path, op_args = draw_case(args.seed, args.op, case)
        print(f"start {case}" + (f" {describe(path, op_args)}" if args.show else ""), flush=True)
        outcome, detail = run_case(args.op, path, op_args)
        print(json.dumps({"case": case, "outcome": outcome, "detail": detail}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
