"""A lab notebook beside the product: one-off investigations of this 2-vCPU machine, the emulated
cluster and Horovod, kept so that `research/notebook.md`'s figures can be made again.

Nothing in tfcomp, benchmarks/ or tests/ imports this package, and CI runs none of it. Each script
runs from the repository root as `python -m research.NAME` and writes into `research/results/`.
Importing `benchmarks` first gives these scripts the benchmarks' CPU allocator setting
(`TF_CPU_ALLOCATOR_USE_BFC`, see benchmarks/__init__.py) before any of them imports TensorFlow.
"""

import benchmarks  # noqa: F401  (sets TF_CPU_ALLOCATOR_USE_BFC before TensorFlow is imported)

__all__ = []
