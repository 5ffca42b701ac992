# tfcomp's commands. `make run` sets everything up and runs the main job; `make test` runs the tests.
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(abspath $(VENV))/bin:$(PATH)
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: setup ops test bazel-test bench run clean

setup:            ## Debian packages, .venv with the pinned stack, Horovod with Gloo, the op library
	scripts/setup.sh

ops:              ## rebuild the op library only
	scripts/build_ops.sh

test: setup       ## the test suite (pytest)
	$(PY) -m pytest -q tests

bazel-test: setup ## the same test files as Bazel py_tests
	scripts/bazel.sh test //...

bench: setup      ## kernel benchmark; writes benchmarks/results/kernel_benchmark.md
	$(PY) -m benchmarks.kernel_benchmark --markdown_out=benchmarks/results/kernel_benchmark.md

run: bench        ## the main job (for now the kernel benchmark)

clean:
	bazel clean
	rm -f tfcomp/_tfcomp_ops.so
