"""Turns the RESULT lines of gpu_harness --bench and framework_baselines.py into a markdown table,
with the GPU model, driver and date, and the acceptance ratios of issue 15 at the largest d.

  python3 benchmarks/gpu/report.py RAW_FILE [--out FILE.md] [--append BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys

COLUMNS = [
    ("read_floor", "read floor"),
    ("estimate_threshold", "estimate_threshold"),
    ("dragonn_compress", "dragonn_compress"),
    ("dgc_compress", "dgc_compress (CUB scan + compaction)"),
    ("framework_compaction", "framework compaction (nonzero)"),
    ("topk_compress", "exact top-k (CUB radix sort)"),
    ("torch.topk", "torch.topk"),
    ("decode_K1", "decode K=1"),
    ("decode_K4", "decode K=4"),
    ("decode_K16", "decode K=16"),
    ("decode_K64", "decode K=64"),
]

# (description, numerator op, denominator op, bound, "<=" or ">=") at the largest d, from issue 15.
TARGETS = [
    ("dragonn_compress / read floor <= 1.5", "dragonn_compress", "read_floor", 1.5, "<="),
    ("framework compaction / dragonn_compress >= 3", "framework_compaction", "dragonn_compress", 3.0, ">="),
    ("dgc_compress (CUB) / dragonn_compress >= 2", "dgc_compress", "dragonn_compress", 2.0, ">="),
    ("decode K=16 / decode K=1 <= 1.3", "decode_K16", "decode_K1", 1.3, "<="),
]


def parse(path: str):
    results, info = {}, {}
    with open(path) as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if fields[0] == "RESULT" and len(fields) == 4:
                results[(fields[1], int(fields[2]))] = float(fields[3])
            elif len(fields) == 2 and fields[0].isupper():
                info[fields[0]] = fields[1]
    return results, info


def gpu_and_driver(info):
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True).stdout.splitlines()[0]
        name, driver = [s.strip() for s in out.split(",")]
        return name, driver
    except (OSError, subprocess.CalledProcessError, IndexError, ValueError):
        return info.get("GPU", "unknown GPU"), "CUDA driver API " + info.get("CUDA_DRIVER_API", "?")


def render(results, info) -> str:
    name, driver = gpu_and_driver(info)
    sizes = sorted({d for _, d in results})
    present = [(op, title) for op, title in COLUMNS if any((op, d) in results for d in sizes)]
    lines = [
        f"### GPU kernels: {name}, driver {driver}, CUDA runtime {info.get('CUDA_RUNTIME', '?')}, "
        f"{datetime.date.today().isoformat()}",
        "",
        f"float32, ratio {info.get('RATIO', '0.001')} (k = slots = max_out = round(ratio * d), decode payloads of k "
        f"pairs each), milliseconds, median of {info.get('RUNS', '?')} runs after 3 warm-ups (CUDA events). "
        f"Framework: {info.get('FRAMEWORK', 'none')}. Produced by `benchmarks/gpu/run.sh`.",
        "",
        "| d | " + " | ".join(title for _, title in present) + " |",
        "|---" * (len(present) + 1) + "|",
    ]
    for d in sizes:
        cells = [f"{results[(op, d)]:.3f}" if (op, d) in results else "" for op, _ in present]
        lines.append(f"| 2^{d.bit_length() - 1} | " + " | ".join(cells) + " |")
    if sizes:
        d = sizes[-1]
        lines += ["", f"Issue 15 targets at d = 2^{d.bit_length() - 1}:", ""]
        for text, num, den, bound, sense in TARGETS:
            if (num, d) in results and (den, d) in results and results[(den, d)] > 0:
                ratio = results[(num, d)] / results[(den, d)]
                met = ratio <= bound if sense == "<=" else ratio >= bound
                lines.append(f"- {text}: {ratio:.2f} ({'met' if met else 'NOT met'})")
            else:
                lines.append(f"- {text}: not measured")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw")
    parser.add_argument("--out")
    parser.add_argument("--append")
    args = parser.parse_args()
    table = render(*parse(args.raw))
    sys.stdout.write(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table)
    if args.append:
        with open(args.append, "a") as f:
            f.write("\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
