"""Bazel's entry point for every tests/test_*.py: runs pytest on the file given as its argument.

A test file run as a plain script only imports; through this runner its tests run, and a file in
which pytest collects no test fails (pytest's exit code 5) instead of passing without running."""

import sys

import pytest

if __name__ == "__main__":
    sys.exit(pytest.main([sys.argv[1], "-q", "-p", "no:cacheprovider"]))
