"""Shared pytest fixtures: fresh random inputs every run, reproducible through TFCOMP_TEST_SEED."""

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture
def rng(request):
    """A NumPy Generator seeded afresh for each test; the seed is printed so a failure can be replayed
    with TFCOMP_TEST_SEED=<seed>."""
    seed = int(os.environ.get("TFCOMP_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
    print(f"{request.node.nodeid}: TFCOMP_TEST_SEED={seed}")
    return np.random.default_rng(seed)
