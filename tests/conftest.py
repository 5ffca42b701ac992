"""Shared pytest set-up: fresh random inputs every run (reproducible through TFCOMP_TEST_SEED), and
the `jobs` marker that splits the suite into its in-process tier and the tests that start processes.

`make test` runs every test. `make test-fast` runs `-m "not jobs"` with TFCOMP_IN_PROCESS_ONLY=1, under
which a test not marked `jobs` that starts a process (horovodrun, a network namespace, a Python child)
fails, naming itself, instead of slowing the fast tier down unseen."""

import os
import subprocess

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

IN_PROCESS_ONLY_ENV = "TFCOMP_IN_PROCESS_ONLY"
_running = {"test": None, "may_start_processes": True}


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "jobs: the test starts other processes (horovodrun, network namespaces, Python children); "
        "`make test-fast` leaves it out")
    if os.environ.get(IN_PROCESS_ONLY_ENV) == "1":
        subprocess.Popen = _in_process_only(subprocess.Popen)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before the test's fixtures are set up (module-scoped ones included), note whether it may start processes."""
    _running["test"] = item.nodeid
    _running["may_start_processes"] = item.get_closest_marker("jobs") is not None


def _in_process_only(popen):
    """`subprocess.Popen` refusing to start a process from a test that is not marked `jobs`."""

    class InProcessOnlyPopen(popen):
        def __init__(self, args, *rest, **kwargs):
            if not _running["may_start_processes"]:
                raise RuntimeError(
                    f"{_running['test']} starts a process ({args!r}) but is not marked @pytest.mark.jobs; "
                    f"mark it so that `make test-fast` ({IN_PROCESS_ONLY_ENV}=1) leaves it out")
            super().__init__(args, *rest, **kwargs)

    return InProcessOnlyPopen


@pytest.fixture
def rng(request):
    """A NumPy Generator seeded afresh for each test; the seed is printed so a failure can be replayed
    with TFCOMP_TEST_SEED=<seed>."""
    seed = int(os.environ.get("TFCOMP_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
    print(f"{request.node.nodeid}: TFCOMP_TEST_SEED={seed}")
    return np.random.default_rng(seed)
