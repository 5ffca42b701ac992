"""tfcomp's benchmarks: kernels, exchange steps, the emulated cluster, time to accuracy.

Every benchmark runs with TensorFlow's BFC allocator for CPU tensors (`TF_CPU_ALLOCATOR_USE_BFC`,
set here, before any benchmark imports TensorFlow, unless the environment already sets it; jobs
started through `horovodrun` inherit it). TensorFlow's default CPU allocator passes every tensor
to malloc, and glibc maps an allocation over 32 MiB afresh each time, so a gradient of that size
is page-faulted anew on every step, in the compute and in the exchange alike (research/notebook.md,
"TensorFlow's BFC allocator for CPU tensors"). `TF_CPU_ALLOCATOR_USE_BFC=false python -m
benchmarks...` measures the default.
`benchmarks.tables.machine_header` names the allocator a run used.
"""

import os

os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
