"""Horovod's TF2 custom-loop patterns with tfcomp compressors, on 2 workers: tests/entry_points_worker.py
runs under horovodrun and these tests assert on what every rank measured."""

import glob
import json
import subprocess
import sys

import pytest

from tests.helpers import REPO_ROOT, child_env, horovodrun

pytestmark = pytest.mark.jobs  # every test here starts processes

WORKERS = 2


def run_worker(out, *extra):
    command = [*horovodrun(WORKERS), sys.executable, "-m", "tests.entry_points_worker", "--out", str(out), *extra]
    env = child_env(TFCOMP_CALIBRATION_CACHE=str(out / "calibration.json"))  # cold
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    files = sorted(glob.glob(str(out / "rank*.json")))
    assert len(files) == WORKERS, files
    return [json.load(open(f)) for f in files]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    return run_worker(tmp_path_factory.mktemp("entry_points"))


def values(reports, prefix):
    """{name: [value on each rank]} for the keys under prefix."""
    names = sorted({k.split("/", 1)[1] for r in reports for k in r if k.startswith(prefix + "/")})
    return {name: [r[f"{prefix}/{name}"] for r in reports] for name in names}


def test_tape_inside_and_outside_tf_function_keeps_one_exchange(reports):
    labels = {f"{name} {mode}" for name in ("NoCompression", "FP16", "TopK ratio 1", "TopK", "DRAGONN", "DGC")
              for mode in ("tf.function", "eager")}
    assert set(values(reports, "exchanges")) == labels
    assert all(v == [1, 1] for v in values(reports, "exchanges").values())
    assert all(v == [1, 1] for v in values(reports, "plans").values())
    assert all(v == [4, 4] for v in values(reports, "steps").values())


def test_tape_residuals_are_created_once_per_variable(reports):
    residuals = values(reports, "residuals")
    assert all(residuals[f"{name} {mode}"] == [1, 1] for name in ("TopK", "DRAGONN", "DGC")
               for mode in ("tf.function", "eager"))
    assert all(residuals[f"{name} {mode}"] == [0, 0] for name in ("NoCompression", "FP16")
               for mode in ("tf.function", "eager"))


def test_tape_weights_identical_on_all_ranks(reports):
    spreads = values(reports, "spread")
    assert {n: s for n, s in spreads.items() if n != "partial tape, local layer" and max(s) != 0.0} == {}
    # PartialDistributedGradientTape: the local layer trains on each rank's own data.
    assert min(spreads["partial tape, local layer"]) > 1e-4


def test_lossless_tape_equals_plain_horovod(reports):
    differ = values(reports, "horovod_differs")
    assert len(differ) == 6
    assert {n: d for n, d in differ.items() if max(d) != 0.0} == {}


def test_watched_tensors_keep_their_residuals_and_float64_is_exact(reports):
    found = values(reports, "watched")
    assert found["steps"] == [6, 6]
    assert found["residuals"] == [1, 1]
    assert found["residual_nonzero"] == [True, True]
    assert found["spread"] == [0.0, 0.0]
    assert found["float64_dtype"] == ["float64", "float64"]
    assert max(found["float64_relative_error"]) <= 1e-15


def test_rank0_only_checkpoint_resumes_exactly_after_gather_state(reports):
    differ = values(reports, "rank0_resume_differs")
    exact = {n: d for n, d in differ.items() if "without" not in n}
    assert set(exact) == {"DRAGONN", "DGC", "TopK", "DGC+momentum"}
    assert {n: d for n, d in exact.items() if max(d) != 0.0} == {}
    # Without it every rank goes on with rank 0's memory: the run is not the uninterrupted one.
    assert all(min(d) > 0.0 for n, d in differ.items() if "without" in n)
    assert all(s == [8, 8] for s in values(reports, "rank0_resume_step").values())


STRING_COMPRESSION_PROBE = """
import json, sys
if sys.argv[1] == "tfcomp first":
    import tfcomp
    import horovod.tensorflow.keras as hvd
else:
    import horovod.tensorflow.keras as hvd
    import tfcomp
import horovod.tensorflow as hvd_tf
import tensorflow as tf
hvd.init()
refusals = {}
for entry, build in [
        ("horovod.tensorflow.keras.DistributedOptimizer",
         lambda: hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression="dragonn")),
        ("horovod.tensorflow.DistributedOptimizer",
         lambda: hvd_tf.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression="dragonn")),
        ("horovod.tensorflow.DistributedGradientTape",
         lambda: hvd_tf.DistributedGradientTape(tf.GradientTape(), compression="dragonn"))]:
    try:
        build()
        refusals[entry] = None
    except TypeError as error:
        refusals[entry] = str(error)
print(json.dumps(refusals))
"""


@pytest.mark.parametrize("order", ["tfcomp first", "horovod first"])
def test_a_string_compression_is_refused_at_construction_after_a_bare_import_tfcomp(order):
    """A program that only imports tfcomp (no other tfcomp name used) and gives Horovod's entry points a
    string: refused when the optimizer or tape is built, in either import order (before, the string went
    through and the first step failed inside Horovod's graph: 'str' object has no attribute 'compress')."""
    result = subprocess.run([sys.executable, "-c", STRING_COMPRESSION_PROBE, order], cwd=REPO_ROOT, env=child_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-5000:]
    refusals = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(refusals) == 3
    for entry, message in refusals.items():
        assert message is not None, f"{entry} accepted compression='dragonn'"
        assert message.startswith("compression must be a tfcomp compressor instance"), message
        assert message.endswith("got 'dragonn' (a string): write compression=tfcomp.DRAGONN()"), message


@pytest.mark.parametrize("module", ["tfcomp.exchange", "tfcomp.collectives", "tfcomp.step", "tfcomp.horovod_glue",
                                    "tfcomp.compressors"])
def test_any_tfcomp_module_imported_before_horovod_leaves_the_glue_installed(module):
    """The glue installs itself when Horovod's TensorFlow package is imported, also where that import comes from
    inside a tfcomp module's own imports (no circular-import error)."""
    code = (f"import {module}\n"
            "import horovod.tensorflow.keras\n"
            "import horovod._keras, horovod.tensorflow as hvd\n"
            "print(hvd._make_allreduce_grads_fn._tfcomp_wrapped, horovod._keras.create_distributed_optimizer._tfcomp_wrapped)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=child_env(), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-5000:]
    assert result.stdout.split() == ["True", "True"]


@pytest.mark.parametrize("kind, what", [("compressor", "compressor"), ("model", "gradients")])
def test_ranks_that_disagree_raise_on_every_rank(tmp_path, kind, what):
    found = run_worker(tmp_path, "--mismatch", kind)
    messages = [r["mismatch/error"] for r in found]
    assert all(m.startswith(f"tfcomp: the ranks' exchanges differ in {what}") for m in messages), messages
    assert all("ranks that differ from rank 0: [1]" in m for m in messages), messages


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
