"""Turns the RESULT lines of gpu_harness --bench and framework_baselines.py into a markdown table,
with the GPU model, driver and date, and the acceptance ratios of issue 15 at the largest d.

  python3 benchmarks/gpu/report.py RAW_FILE [--out FILE.md] [--append research/notebook.md]
  python3 benchmarks/gpu/report.py RAW_FILE --device-entry h100   (an entry of tfcomp.device_costs)
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

# The second table: the exchange's fused passes and a diagnostic of DRAGONN's, each beside its floor.
PASS_COLUMNS = [
    ("read_floor", "read floor"),
    ("dragonn_compress", "dragonn_compress"),
    ("dragonn_compress_zeroing", "dragonn_compress, slots zeroed first"),
    ("dragonn_nothing_selected", "dragonn_compress, nothing selected"),
    ("add_floor", "a + b floor (2 reads, 1 write)"),
    ("dragonn_compress_addend", "dragonn_compress with addend (writes g + r)"),
    ("momentum_accumulate", "momentum_accumulate (3 reads, 2 writes)"),
    ("int_quantize_8", "int_quantize 8 bits"),
    ("int_dequantize_8", "int_dequantize 8 bits"),
]

# (description, numerator op, denominator op, bound, "<=" or ">=") at the largest d, from issue 15.
TARGETS = [
    ("dragonn_compress / read floor <= 1.5", "dragonn_compress", "read_floor", 1.5, "<="),
    ("framework compaction / dragonn_compress >= 3", "framework_compaction", "dragonn_compress", 3.0, ">="),
    ("dgc_compress (CUB) / dragonn_compress >= 2", "dgc_compress", "dragonn_compress", 2.0, ">="),
    ("decode K=16 / decode K=1 <= 1.3", "decode_K16", "decode_K1", 1.3, "<="),
]


def parse_lines(lines):
    """({(op, d): median ms}, {KEY: value}) from the harness's and framework_baselines.py's output lines."""
    results, info = {}, {}
    for line in lines:
        fields = line.rstrip("\n").split("\t")
        if fields[0] == "RESULT" and len(fields) == 4:
            results[(fields[1], int(fields[2]))] = float(fields[3])
        elif len(fields) == 2 and fields[0].isupper():
            info[fields[0]] = fields[1]
    return results, info


def parse(path: str):
    with open(path) as f:
        return parse_lines(f)


def gpu_and_driver(info):
    if "DRIVER" in info:  # recorded by run.sh on the GPU's machine
        return info.get("GPU", "unknown GPU"), info["DRIVER"]
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True).stdout.splitlines()[0]
        name, driver = [s.strip() for s in out.split(",")]
        return name, driver
    except (OSError, subprocess.CalledProcessError, IndexError, ValueError):
        return info.get("GPU", "unknown GPU"), "CUDA driver API " + info.get("CUDA_DRIVER_API", "?")


def table(results, sizes, columns) -> list[str]:
    """Markdown rows of the columns measured at any size, one row per size."""
    present = [(op, title) for op, title in columns if any((op, d) in results for d in sizes)]
    lines = ["| d | " + " | ".join(title for _, title in present) + " |", "|---" * (len(present) + 1) + "|"]
    for d in sizes:
        cells = [f"{results[(op, d)]:.3f}" if (op, d) in results else "" for op, _ in present]
        lines.append(f"| 2^{d.bit_length() - 1} | " + " | ".join(cells) + " |")
    return lines


def render(results, info) -> str:
    name, driver = gpu_and_driver(info)
    sizes = sorted({d for _, d in results})
    lines = [
        f"### GPU kernels: {name}, driver {driver}, CUDA runtime {info.get('CUDA_RUNTIME', '?')}, "
        f"{datetime.date.today().isoformat()}",
        "",
        f"float32, ratio {info.get('RATIO', '0.001')} (k = slots = max_out = round(ratio * d), decode payloads of k "
        f"pairs each), milliseconds, median of {info.get('RUNS', '?')} runs after 3 warm-ups (CUDA events). "
        f"Framework: {info.get('FRAMEWORK', 'none')}. Produced by `benchmarks/gpu/run.sh`.",
        "",
    ]
    lines += table(results, sizes, COLUMNS)
    if any((op, d) in results for op, _ in PASS_COLUMNS[2:] for d in sizes):  # beyond the first table's
        lines += ["", "The exchange's fused passes beside their floors (same runs):", ""]
        lines += table(results, sizes, PASS_COLUMNS)
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


# The ops tfcomp.device_costs keeps, in its order.
DEVICE_OPS = ["estimate_threshold", "dragonn_compress", "dgc_compress", "topk_compress", "decode_K1", "decode_K4",
              "decode_K16", "decode_K64"]


def device_entry(name, results, info) -> str:
    """The entry of tfcomp.device_costs.MEASURED for these results, as Python source."""
    gpu, driver = gpu_and_driver(info)
    sizes = sorted({d for _, d in results})
    log2 = [d.bit_length() - 1 for d in sizes]
    if sizes != [2**e for e in range(log2[0], log2[-1] + 1)]:
        raise SystemExit(f"report.py: --device-entry needs consecutive powers of two, got {sizes}")
    lines = [f'    "{name}": DeviceCosts(',
             f'        gpu="{gpu}", driver="{driver}", cuda_runtime="{info.get("CUDA_RUNTIME", "?")}",',
             f'        date="{datetime.date.today().isoformat()}", ratio={float(info.get("RATIO", "0.001"))},',
             f"        sizes=tuple(2 ** e for e in range({log2[0]}, {log2[-1] + 1})),",
             "        ms={"]
    for op in DEVICE_OPS:
        lines.append(f'            "{op}": ({", ".join(f"{results[(op, d)]:.4f}" for d in sizes)}),')
    lines += ["        }),"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw")
    parser.add_argument("--out")
    parser.add_argument("--append")
    parser.add_argument("--device-entry", metavar="NAME",
                        help="print the results as an entry NAME of tfcomp.device_costs.MEASURED instead")
    args = parser.parse_args()
    if args.device_entry:
        sys.stdout.write(device_entry(args.device_entry, *parse(args.raw)))
        return 0
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
