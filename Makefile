# tfcomp's commands. `make run` sets everything up and runs the main job; `make test` runs the tests.
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(abspath $(VENV))/bin:$(PATH)
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: setup ops test test-fast bazel-build bazel-test cuda-check asan-test bench validate time-to-accuracy run install-check clean

setup:            ## Debian packages, .venv with the pinned stack, Horovod with Gloo, the op library
	scripts/setup.sh

ops:              ## rebuild the op library only
	scripts/build_ops.sh

test: setup       ## the whole test suite, once (pytest; CI runs this)
	$(PY) -m pytest -q tests

test-fast: setup  ## the in-process tests only (no horovodrun, namespaces or child processes), for iteration
	TFCOMP_IN_PROCESS_ONLY=1 $(PY) -m pytest -q -m "not jobs" tests

bazel-build: setup ## build every Bazel target (the op library and each test file's py_test), running none
	scripts/bazel.sh build //...

bazel-test: setup ## the same test files as Bazel py_tests (not in CI, which runs them once through `make test`)
	scripts/bazel.sh test //...

cuda-check: setup ## with nvcc: compile the CUDA op library and the GPU harness, run the checks that need no GPU
	scripts/cuda_check.sh

asan-test: setup  ## the op library built with AddressSanitizer, run against the fuzz cases (not in CI)
	scripts/asan_test.sh

bench: setup      ## kernel benchmark; writes benchmarks/results/kernel_benchmark.md
	$(PY) -m benchmarks.kernel_benchmark --markdown_out=benchmarks/results/kernel_benchmark.md

validate: setup   ## the cost model against 2-worker training of 4 models on 2 emulated hosts at 6 rates (root; --hosts=4 or 8 by hand); writes benchmarks/results/network_validation.md
	$(PY) -m benchmarks.network_validation --markdown_out=benchmarks/results/network_validation.md \
	    --json_out=benchmarks/results/network_validation.json

time-to-accuracy: setup ## Fashion-MNIST time to accuracy on 4 emulated hosts (root; about 50 min a seed); writes benchmarks/results/time_to_accuracy.*
	$(PY) -m benchmarks.time_to_accuracy --seeds=2

run: setup        ## the main job: 2 workers on 2 emulated 1 Gbit/s hosts train a CNN on Fashion-MNIST with tfcomp's default plan
	PYTHON=$(PY) scripts/run_main_job.sh

install-check:    ## pip install . into a fresh venv and use tfcomp from outside the checkout (about 5 min; not in CI)
	PYTHON=$${PYTHON:-python3.11} scripts/install_check.sh

clean:
	bazel clean
	rm -rf tfcomp/_tfcomp_ops.so build/gpu_harness
