"""Compression costs measured on GPUs, per device, for the what-if (`python -m tfcomp.whatif --device h100`).

Each entry is one run of `benchmarks/gpu/run.sh` (the standalone harness of the op library's CUDA
kernels, float32, ratio 0.001, medians of CUDA-event timings), copied here with
`python3 benchmarks/gpu/report.py RAW --device-entry NAME`: milliseconds per op at d = 2^20 ... 2^27
elements, the decode for K = 1, 4, 16 and 64 payloads of ratio * d pairs each.

`bucket_cost(device, compressor, workers)` turns a device's table into the cost model's price of one
bucket, `cost_model.AffineCost` in seconds against the bucket's elements d: the encode fitted as
c0 + c1 d, the decode as a + b d + c P with P = workers * ratio * d the pairs it adds (one fit over
every d and K measured). Plain Python: importing this module loads neither TensorFlow nor Horovod.
"""

from __future__ import annotations

import dataclasses

from tfcomp import cost_model as cm

__all__ = ["DeviceCosts", "MEASURED", "bucket_cost", "device"]


@dataclasses.dataclass(frozen=True)
class DeviceCosts:
    """One device's measured kernel times: `ms[op]` lists milliseconds at `sizes` (elements)."""

    gpu: str
    driver: str
    cuda_runtime: str
    date: str
    ratio: float  # the fraction of d each encode sends and each decoded payload holds
    sizes: tuple
    ms: dict

    def describe(self) -> str:
        return f"{self.gpu} (driver {self.driver}, CUDA runtime {self.cuda_runtime}) on {self.date}"


MEASURED = {
    "h100": DeviceCosts(
        gpu="NVIDIA H100 80GB HBM3", driver="580.159.04", cuda_runtime="13000",
        date="2026-11-28", ratio=0.001,
        sizes=tuple(2 ** e for e in range(20, 28)),
        ms={
            "estimate_threshold": (0.0256, 0.0251, 0.0267, 0.0257, 0.0331, 0.0248, 0.0238, 0.0260),
            "dragonn_compress": (0.0107, 0.0104, 0.0109, 0.0183, 0.0301, 0.0497, 0.0922, 0.1767),
            "dgc_compress": (0.0279, 0.0309, 0.0300, 0.0332, 0.0629, 0.1004, 0.1738, 0.3603),
            "topk_compress": (0.1805, 0.2702, 0.4441, 0.7872, 1.3851, 2.6097, 5.0195, 9.8514),
            "decode_K1": (0.0226, 0.0243, 0.0275, 0.0629, 0.0713, 0.1290, 0.1586, 0.2274),
            "decode_K4": (0.0245, 0.0544, 0.0577, 0.0652, 0.0758, 0.1277, 0.1608, 0.2485),
            "decode_K16": (0.0546, 0.0567, 0.0631, 0.0710, 0.0814, 0.1316, 0.1765, 0.2919),
            "decode_K64": (0.0601, 0.0644, 0.0702, 0.0829, 0.1010, 0.1553, 0.2670, 0.4622),
        }),
}

# The ops each compressor's encode runs on a GPU (its threshold comes from estimate_threshold).
_ENCODE_OPS = {
    "DRAGONN": ("estimate_threshold", "dragonn_compress"),
    "DGC": ("estimate_threshold", "dgc_compress"),
    "TopK": ("topk_compress",),
}
_DECODED_PAYLOADS = (1, 4, 16, 64)


def device(name: str) -> DeviceCosts:
    """The table of `name` (any case); ValueError naming the devices measured otherwise."""
    try:
        return MEASURED[name.lower()]
    except KeyError:
        raise ValueError(f"--device must be one of {', '.join(MEASURED)} (the GPUs measured), got {name!r}") from None


def _solve3(rows, values):
    """Least squares for y = x0 + x1 u + x2 v over rows (u, v): the 3x3 normal equations, by elimination."""
    basis = [(1.0, u, v) for u, v in rows]
    a = [[sum(b[i] * b[j] for b in basis) for j in range(3)] for i in range(3)]
    y = [sum(b[i] * value for b, value in zip(basis, values)) for i in range(3)]
    for col in range(3):
        pivot = max(range(col, 3), key=lambda r: abs(a[r][col]))
        a[col], a[pivot], y[col], y[pivot] = a[pivot], a[col], y[pivot], y[col]
        for r in range(col + 1, 3):
            f = a[r][col] / a[col][col]
            a[r] = [x - f * p for x, p in zip(a[r], a[col])]
            y[r] -= f * y[col]
    x = [0.0, 0.0, 0.0]
    for r in (2, 1, 0):
        x[r] = (y[r] - sum(a[r][c] * x[c] for c in range(r + 1, 3))) / a[r][r]
    return x


def bucket_cost(costs: DeviceCosts, compressor, workers: int) -> tuple:
    """(AffineCost per bucket in seconds, a sentence saying what it assumes) for `compressor` (a
    DRAGONN, DGC or TopK instance; its `ratio`) exchanging among `workers`: encode once, decode the
    workers' payloads once. ValueError for a compressor this device has no figures for."""
    name = type(compressor).__name__
    if name not in _ENCODE_OPS:
        raise ValueError(f"no GPU figures for {name} (measured: {', '.join(_ENCODE_OPS)}); give --encode-ms instead")
    encode_s = [1e-3 * sum(costs.ms[op][i] for op in _ENCODE_OPS[name]) for i in range(len(costs.sizes))]
    encode = cm.AffineCost.fit(costs.sizes, encode_s)
    rows, decode_s = [], []
    for k in _DECODED_PAYLOADS:
        for d, ms in zip(costs.sizes, costs.ms[f"decode_K{k}"]):
            rows.append((d, k * costs.ratio * d))
            decode_s.append(1e-3 * ms)
    fixed, per_element, per_pair = (max(x, 0.0) for x in _solve3(rows, decode_s))
    pairs_per_element = workers * compressor.ratio
    cost = cm.AffineCost(encode.c0 + fixed, encode.c1 + per_element + per_pair * pairs_per_element)
    return cost, (f"compression: measured on {costs.describe()}: encode ({' + '.join(_ENCODE_OPS[name])}) "
                  f"{1e3 * encode.c0:.3f} ms + {1e9 * encode.c1:.4f} ns per element per bucket; decode of "
                  f"{workers} payloads {1e3 * fixed:.3f} ms + {1e9 * per_element:.4f} ns per element + "
                  f"{1e9 * per_pair:.3f} ns per pair ({pairs_per_element:g} pairs per element); nothing per "
                  "tensor or per step")
