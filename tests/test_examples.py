"""The main job's training script runs under horovodrun, learns, and compresses what it says."""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO_ROOT, child_env, horovodrun



def run_example(tmp_path, *flags):
    log = tmp_path / "metrics.json"
    command = [*horovodrun(2), sys.executable,
               os.path.join(REPO_ROOT, "examples", "train_keras.py"), f"--log_json={log}", *flags]
    result = subprocess.run(command, cwd=REPO_ROOT, env=child_env(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result.stdout, json.loads(log.read_text())


@pytest.mark.parametrize("entry", ["horovod", "tfcomp"])
def test_digits_training_with_dragonn_learns_and_reports_compression(tmp_path, entry):
    stdout, metrics = run_example(tmp_path, "--compressor=dragonn", "--ratio=0.01", "--momentum=0.9",
                                  "--dataset=digits", "--epochs=3", f"--entry={entry}",
                                  "--strategy=allgather")
    assert metrics["workers"] == 2
    assert len(metrics["train_loss"]) == 3 and metrics["train_loss"][-1] < metrics["train_loss"][0]
    assert metrics["test_accuracy"] > 0.8  # 10 classes: chance is 0.1
    # Forced to allgather, the search merges every gradient into one bucket (MergeComp).
    assert sorted(metrics["compressed_tensors"]) == [f"dense{layer}/{kind}:0" for layer in ("", "_1", "_2")
                                                     for kind in ("bias", "kernel")]
    assert metrics["sent_fraction_of_dense"] < 0.05
    assert "Epoch 3/3" in stdout and "DRAGONN allgather" in stdout and "of dense)" in stdout
    assert stdout.count("tfcomp plan for") == 1 and "allgather" in stdout.split("tfcomp plan for")[1]


def test_dense_run_through_stock_horovod(tmp_path):
    stdout, metrics = run_example(tmp_path, "--compressor=none", "--dataset=synthetic", "--epochs=1")
    assert metrics["compressed_tensors"] == [] and metrics["sent_fraction_of_dense"] == 1.0
    assert "no compression table" in stdout


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
