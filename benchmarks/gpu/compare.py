"""Builds of the GPU harness side by side: `gpu_harness --bench` at one size, the builds interleaved
round by round (A B C, A B C, ...), so that a change is measured against its parent on the same warm
card in the same minutes.

  python3 benchmarks/gpu/compare.py --harness NAME=PATH [--harness NAME=PATH ...]
      [--log2 27] [--rounds 7] [--runs 21] [--ops read_floor,dragonn_compress,dgc_compress]

Prints every round's medians ("ROUND<TAB>name<TAB>round<TAB>op<TAB>ms"), then per build the median
over rounds of each op and of dgc_compress / dragonn_compress (issue 15's ratio), with its range.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

from report import parse_lines  # beside this file

RATIO = ("dgc_compress", "dragonn_compress")


def bench(path: str, log2: int, runs: int) -> dict[str, float]:
    """One `--bench` run of the harness at d = 2^log2: {op: median ms}."""
    out = subprocess.run(
        [path, "--bench", "--min-log2", str(log2), "--max-log2", str(log2), "--runs", str(runs)],
        check=True, capture_output=True, text=True).stdout
    return {op: ms for (op, _), ms in parse_lines(out.splitlines())[0].items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--harness", action="append", required=True, help="NAME=PATH of a gpu_harness build")
    parser.add_argument("--log2", type=int, default=27)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--ops", default="read_floor,dragonn_compress,dgc_compress")
    args = parser.parse_args(argv)
    builds = []
    for spec in args.harness:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            parser.error(f"--harness must be NAME=PATH, got {spec!r}")
        builds.append((name, path))
    ops = args.ops.split(",")
    per_build: dict[str, list[dict[str, float]]] = {name: [] for name, _ in builds}
    for round_index in range(args.rounds):
        for name, path in builds:
            results = bench(path, args.log2, args.runs)
            per_build[name].append(results)
            for op in dict.fromkeys(ops + list(RATIO)):
                if op in results:
                    print(f"ROUND\t{name}\t{round_index}\t{op}\t{results[op]:.4f}", flush=True)
    print(f"\nd = 2^{args.log2}, {args.rounds} interleaved rounds, each a median of {args.runs} runs (ms)")
    for name, rounds in per_build.items():
        cells = []
        for op in ops:
            values = [r[op] for r in rounds if op in r]
            if values:
                cells.append(f"{op} {statistics.median(values):.4f}")
        ratios = sorted(r[RATIO[0]] / r[RATIO[1]] for r in rounds if RATIO[0] in r and RATIO[1] in r)
        if ratios:
            cells.append(f"dgc/dragonn median {statistics.median(ratios):.3f} ({ratios[0]:.3f} to {ratios[-1]:.3f})")
        print(f"{name}: " + ", ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
