"""An all-dense tfcomp plan is Horovod's step (issue 44), in a 2-worker job (horovodrun runs
tests/dense_step_worker.py): the traced training step holds the same Horovod collectives, in the
same order and with the same attributes, as plain Horovod's, for Keras's `DistributedOptimizer` and
for `DistributedGradientTape` inside a `tf.function`, and no op of tfcomp's library outside the
timeline's sampled branch; 30 steps of `model.fit` on Fashion-MNIST end with weights bit-identical
to plain Horovod's."""

import glob
import json
import os
import subprocess
import sys

import pytest

from examples import fashion_mnist
from tests.helpers import REPO_ROOT, child_env, horovodrun

pytestmark = [pytest.mark.jobs, pytest.mark.skipif(
    not os.path.exists(os.path.join(fashion_mnist.DEBIAN_DIR, fashion_mnist.DEBIAN_FILES["train_data"])),
    reason="Debian's dataset-fashion-mnist is not installed (make setup installs it)")]

WORKERS = 2


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out = tmp_path_factory.mktemp("dense_step")
    command = [*horovodrun(WORKERS), sys.executable, "-m", "tests.dense_step_worker", "--out", str(out)]
    env = child_env(TFCOMP_CALIBRATION_CACHE=str(out / "calibration.json"))
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    files = sorted(glob.glob(str(out / "rank*.json")))
    assert len(files) == WORKERS, files
    return [json.load(open(f)) for f in files]


@pytest.mark.parametrize("entry_point", ["keras", "tape"])
def test_the_dense_step_holds_horovods_collectives_in_order(reports, entry_point):
    for r in reports:
        horovod, dense = r[f"ops/{entry_point}/horovod"], r[f"ops/{entry_point}/tfcomp"]
        assert len(horovod) == 4  # two kernels and two biases, one allreduce each
        assert dense == horovod
        assert r[f"traces_alike/{entry_point}/horovod"] and r[f"traces_alike/{entry_point}/tfcomp"]


@pytest.mark.parametrize("entry_point", ["keras", "tape"])
def test_no_tfcomp_op_runs_outside_the_sampled_timeline(reports, entry_point):
    for r in reports:
        # The timeline's clocks, only inside the tf.cond of the steps it samples.
        assert r[f"tfcomp_ops/{entry_point}"] == [["Tfcomp>TimeAfter", "sampled branch"]]


def test_fashion_mnist_weights_are_bit_identical_to_plain_horovod(reports):
    for r in reports:
        count, other = r["weights_count/fashion_mnist"]
        assert count == other == 6
        assert r["weights_equal/fashion_mnist"] == [True] * count
