"""Framework baselines of the GPU benchmark, float32, what most DGC code does on a GPU:

  framework_compaction  idx = nonzero(|g| >= t); values = g[idx]   (torch.nonzero, else cupy.nonzero)
  torch.topk            torch.topk(|g|, k, sorted=False)            (PyTorch only)

with k = round(ratio * d) and t the k-th largest |g|. Timed with CUDA events after 3 warm-up runs,
median of --runs; prints "RESULT<TAB>op<TAB>d<TAB>median_ms" lines like gpu_harness --bench.
Needs a GPU and PyTorch or CuPy; no TensorFlow.
"""

from __future__ import annotations

import argparse
import statistics
import sys


def _timer(backend):
    """Returns time_ms(fn, runs): the median of CUDA-event timings of fn() after 3 warm-ups."""

    def time_ms(fn, runs):
        for _ in range(3):
            fn()
        times = []
        for _ in range(runs):
            if backend.__name__ == "torch":
                start, stop = backend.cuda.Event(enable_timing=True), backend.cuda.Event(enable_timing=True)
                start.record()
                fn()
                stop.record()
                stop.synchronize()
                times.append(start.elapsed_time(stop))
            else:
                start, stop = backend.cuda.Event(), backend.cuda.Event()
                start.record()
                fn()
                stop.record()
                stop.synchronize()
                times.append(backend.cuda.get_elapsed_time(start, stop))
        return statistics.median(times)

    return time_ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-log2", type=int, default=20)
    parser.add_argument("--max-log2", type=int, default=27)
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--ratio", type=float, default=0.001)
    args = parser.parse_args()
    try:
        import torch as backend

        if not backend.cuda.is_available():
            raise ImportError("no CUDA device for PyTorch")
    except ImportError:
        try:
            import cupy as backend
        except ImportError:
            print("framework_baselines: neither PyTorch (with CUDA) nor CuPy is installed; skipped", file=sys.stderr)
            return 0
    time_ms = _timer(backend)
    print(f"FRAMEWORK\t{backend.__name__} {backend.__version__}")
    for log2 in range(args.min_log2, args.max_log2 + 1):
        d = 1 << log2
        k = max(1, round(args.ratio * d))
        if backend.__name__ == "torch":
            g = backend.randn(d, device="cuda", dtype=backend.float32)
            t = backend.topk(g.abs(), k).values[-1]

            def compaction():
                indices = backend.nonzero(g.abs() >= t).squeeze(1)
                return g[indices], indices

            print(f"RESULT\tframework_compaction\t{d}\t{time_ms(compaction, args.runs):.4f}", flush=True)
            print(f"RESULT\ttorch.topk\t{d}\t{time_ms(lambda: backend.topk(g.abs(), k, sorted=False), args.runs):.4f}",
                  flush=True)
        else:
            g = backend.random.standard_normal(d, dtype=backend.float32)
            t = backend.partition(backend.abs(g), d - k)[d - k]

            def compaction():
                indices = backend.nonzero(backend.abs(g) >= t)[0]
                return g[indices], indices

            print(f"RESULT\tframework_compaction\t{d}\t{time_ms(compaction, args.runs):.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
