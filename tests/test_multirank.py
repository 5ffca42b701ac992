"""Multi-rank behaviour of the compressed exchange: horovodrun with 2 and 3 workers runs
tests/multirank_worker.py, and these tests assert on what every rank measured."""

import glob
import json
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import REPO_ROOT, child_env, horovodrun
from tfcomp.cost_model import ClusterModel

pytestmark = pytest.mark.jobs  # every test here starts processes

EXACT = 0.0
# Sums over 3 ranks depend on the reduction order: grouped and single collectives, and Horovod's tensor
# fusion from run to run, can cut the ring differently. All ranks still get the same result (EXACT).
FLOAT_TOLERANCE = 1e-5
RUN_TO_RUN_TOLERANCE = 1e-6
FP16_RUN_TO_RUN_TOLERANCE = 1e-4
FP16_TOLERANCE = 1e-2  # fp16 sums of N(0, 1) values: an fp16 ulp near 4 is 0.004


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"{n}_workers")
def reports(request, tmp_path_factory):
    """Runs the worker under horovodrun once per world size; returns the list of rank reports."""
    num_workers = request.param
    out = tmp_path_factory.mktemp(f"multirank{num_workers}")
    command = [*horovodrun(num_workers), sys.executable, "-m", "tests.multirank_worker", "--out", str(out)]
    # A fresh calibration cache: the first exchange of each compressor measures, later ones reuse it.
    env = child_env(TFCOMP_CALIBRATION_CACHE=str(out / "calibration.json"))
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    files = sorted(glob.glob(str(out / "rank*.json")))
    assert len(files) == num_workers, files
    loaded = [json.load(open(f)) for f in files]
    assert all(r["size"] == num_workers for r in loaded)
    return loaded


def values(reports, prefix):
    """{name: [value on each rank]} for the keys under prefix."""
    names = sorted({k.split("/", 1)[1] for r in reports for k in r if k.startswith(prefix + "/")})
    return {name: [r[f"{prefix}/{name}"] for r in reports] for name in names}


def test_weights_identical_on_all_ranks(reports):
    spreads = values(reports, "spread")
    expected = {"DRAGONN", "DGC", "TopK", "RandomK", "EFSignSGD", "QSGD", "IntQuant", "FP16", "NoCompression",
                "IntQuant buckets", "DRAGONN buckets", "DRAGONN AR-Topk STAR", "TopK AR-Topk VAR", "RandomK buckets", "DRAGONN auto plan",
                "hvd.Compression.none", "hvd.Compression.fp16", "eager", "legacy_optimizer", "embedding",
                "backward_passes_per_step=2", "DGC+momentum", "DRAGONN+warmup", "gradient_predivide_factor=2",
                "op=Sum", "embedding sparse_as_dense", "DRAGONN auto plan, tried", "replanned",
                "Replan callback", "prediction checked", "Replan callback, calibrated between steps"}
    assert expected <= set(spreads)
    assert {name: s for name, s in spreads.items() if max(s) != EXACT} == {}


def test_plan_trial_decides_alike_everywhere_and_conserves_the_gradients(reports):
    size = reports[0]["size"]
    trial = values(reports, "trial")
    # Medians averaged over the ranks: 0.2 s on rank 0, 0.4 s on the others, against 0.3 s dense.
    plan_ms = 1e3 * (0.2 + 0.4 * (size - 1)) / size  # every step of an arm alike: its quartiles are its median
    assert [{k: r[k] for k in ("decided", "compressed", "dense_ms", "compressed_ms", "compressed_quartiles_ms",
                               "dense_quartiles_ms")} for r in trial["result"]] == [
        {"decided": True, "compressed": False, "dense_ms": pytest.approx(300.0), "compressed_ms": pytest.approx(plan_ms),
         "compressed_quartiles_ms": pytest.approx([plan_ms] * 2), "dense_quartiles_ms": pytest.approx([300.0] * 2)}] * size
    assert max(trial["conserved"]) < FLOAT_TOLERANCE
    assert max(trial["dense_after_choice"]) < FLOAT_TOLERANCE
    assert trial["residual_left"] == [0.0] * size
    assert trial["flush_dense_pending"] == [False] * size
    # 2 warm-up steps, then 2 with the plan and 2 dense (trial_steps=1): the choice at the 7th.
    assert trial["decided_after_warmup"] == [[False] * 6 + [True]] * size
    assert trial["steps_counted_after_warmup"] == [5] * size


def test_training_moved_the_weights(reports):
    assert all(min(moved) > 1e-3 for moved in values(reports, "trained").values())


def test_both_entry_points_give_identical_weights(reports):
    differ = values(reports, "entry_points_differ")
    # Where the two jobs' calibrations made different plans (the machine's load), there is nothing
    # to compare; every configuration whose plan takes no calibration is compared.
    assert {"DRAGONN", "DGC", "TopK", "RandomK", "EFSignSGD", "QSGD", "IntQuant", "FP16", "NoCompression",
            "DGC+momentum", "DRAGONN+warmup"} <= set(differ)
    # Dense tensors go one allreduce each, as in Horovod, so with 3 workers Horovod's fusion (and the
    # summation order) can differ between runs; in fp16 that shows at the fp16 rounding level.
    tolerance = {n: FP16_RUN_TO_RUN_TOLERANCE if n == "FP16" else RUN_TO_RUN_TOLERANCE for n in differ}
    assert {n: d for n, d in differ.items() if max(d) > tolerance[n]} == {}
    if reports[0]["size"] == 2:  # a sum of two is the same in any order: bit-identical
        assert {n: d for n, d in differ.items() if max(d) != EXACT} == {}


def test_reduced_gradient_is_the_average_of_what_workers_sent(reports):
    # Error feedback conserves mass: sent = gradient + old memory - new memory, and the reduced
    # gradient is the average of the workers' sent tensors (float32 summation order aside).
    worst = values(reports, "average_of_sent")
    assert {"DRAGONN", "DGC", "TopK", "RandomK", "EFSignSGD", "QSGD+EF", "IntQuant", "DGC+momentum",
            "DRAGONN buckets", "DRAGONN AR-Topk STAR", "TopK AR-Topk VAR", "RandomK buckets",
            "IntQuant buckets", "DRAGONN partitioned", "DGC+momentum partitioned, limit 0.5"} <= set(worst)
    assert {n: w for n, w in worst.items() if max(w) > (FP16_TOLERANCE if n == "FP16" else FLOAT_TOLERANCE)} == {}


def test_partitioned_allreduce_matches_its_numpy_reference(reports):
    # Every rank's reduced tensors and residuals over three steps, with an owner budget that drops
    # sums and without one, against the NumPy reference of the protocol (same summation order).
    totals, residuals = values(reports, "partitioned_total"), values(reports, "partitioned_residual")
    assert set(totals) == set(residuals) == {"limit=0.5", "limit=None"}
    assert {n: w for n, w in totals.items() if max(w) > FLOAT_TOLERANCE} == {}
    assert {n: w for n, w in residuals.items() if max(w) > FLOAT_TOLERANCE} == {}


def test_without_compression_and_with_dragonn_ratio_1_equals_horovod(reports):
    found = values(reports, "equals_horovod")
    assert set(found) == {"DRAGONN ratio 1", "NoCompression"}
    assert all(max(d) <= FLOAT_TOLERANCE for d in found.values()), found


def test_predivide_factor_does_not_change_the_average(reports):
    assert max(r["predivide_differs"] for r in reports) <= FLOAT_TOLERANCE


def test_indexed_slices_go_sparse_unless_sparse_as_dense(reports):
    strategies = values(reports, "strategy")
    assert strategies["embedding"] == ["sparse allgather"] * len(reports)
    assert strategies["embedding sparse_as_dense"] == ["DRAGONN allgather"] * len(reports)


def test_backward_passes_per_step_communicates_every_second_step(reports):
    assert values(reports, "communications")["backward_passes_per_step=2"] == [4] * len(reports)


def test_checkpoint_restore_continues_exactly(reports):
    assert all(all(v) for v in values(reports, "residual_restored").values())
    differ = values(reports, "resume_differs")
    assert {n: d for n, d in differ.items() if max(d) > RUN_TO_RUN_TOLERANCE} == {}
    if reports[0]["size"] == 2:
        assert {n: d for n, d in differ.items() if max(d) != EXACT} == {}
    assert all(steps == [6] * len(reports) for steps in values(reports, "resume_step").values())


def test_skipped_loss_scale_step_leaves_residuals_untouched(reports):
    found = values(reports, "loss_scale")
    assert found["residual_changed_on_skip"] == [0.0] * len(reports)
    assert found["weights_changed_on_skip"] == [0.0] * len(reports)


def test_plan_is_the_same_on_every_rank(reports):
    assert len({r["plan/digest"] for r in reports}) == 1
    assert all(r["plan/cluster"] == reports[0]["plan/cluster"] for r in reports)
    cluster = ClusterModel.from_list(reports[0]["plan/cluster"])
    assert cluster.workers == len(reports)
    assert min(cluster.allreduce.bandwidth, cluster.allgather.bandwidth) > 1e6
    c0, c1 = cluster.encode_decode.c0, cluster.encode_decode.c1
    assert c0 >= 0 and c1 >= 0 and c0 + c1 * 2**20 > 0  # compressing a million elements costs something
    assert set(reports[0]["plan/strategies"]) <= {"dense", "allgather", "artopk"}


def test_replan_with_ready_times_keeps_the_dense_bucket_alike_on_every_rank(reports):
    gradients = 6  # make_model's kernels and biases
    for r in reports:
        assert r["replan/steps_measured"] == 4  # one epoch of 4 steps
        ready = r["replan/ready_seconds"]
        assert len(ready) == gradients and min(ready) < 1.0 and all(0.0 <= t < 60.0 for t in ready)
        assert len(r["replan/bucket_end_seconds"]) == len(r["replan/buckets_before"])
        assert all(t >= 0.0 for t in r["replan/bucket_end_seconds"])
        # Backprop order; the small model's one dense bucket, kept: its tensors price alike in any buckets.
        assert r["replan/buckets_before"] == [[5, 4, 3, 2, 1, 0]]
        assert r["replan/changed"] is False
        assert r["replan/buckets_after"] == [[5, 4, 3, 2, 1, 0]]
        assert r["replan/steps_after"] == r["replan/window"]  # the same timeline (not a new plan's), its window full
    assert len({r["replan/digest"] for r in reports}) == 1
    assert len({r["replan/callback_digest"] for r in reports}) == 1
    assert len({r["replan/callback"] for r in reports}) == 1 and reports[0]["replan/callback"] in (True, False)
    # The same model's first plan in the same job took the ready times replan() had cached.
    assert all(r["replan/callback_ready_cached"] is True for r in reports)
    # 8 epochs of 4 steps, the window full from step 23 (or later, after a trial): checks every 2 steps.
    assert len({json.dumps(r["replan/callback_checks"]) for r in reports}) == 1


def test_dense_plans_drop_the_flush_of_residuals_they_have_sent(reports):
    dropped = values(reports, "dropped_plan")
    size = reports[0]["size"]
    assert [{k: r[k] for k in ("decided", "compressed", "compressed_ms", "dense_ms")} for r in dropped["trial"]] == [
        {"decided": True, "compressed": False, "compressed_ms": pytest.approx(400.0),
         "dense_ms": pytest.approx(300.0)}] * size
    assert dropped["changed"] == [True] * size
    assert dropped["runtime"] == [[True, True, 0]] * size  # no trial, no residual left: no flush
    trial_step = dropped["trial_step"]
    assert [t[:2] for t in trial_step] == [[1, 3]] * size  # one switch: plan, dense with residuals, plain dense
    assert all("AssignVariableOp" in t[2] for t in trial_step)  # the plan's residuals
    assert all({"If", "StatelessIf"} & set(t[3]) for t in trial_step)  # the flush of the plan's residuals
    assert [t[4] for t in trial_step] == [[]] * size  # as Horovod sends them: no variable, no tf.cond
    assert dropped["conds"] == [1] * size  # the timeline's sampled clocks, off the step's critical path
    assert dropped["horovod"] == [True] * size  # Horovod's own reduction
    assert max(dropped["against_horovod"]) < FLOAT_TOLERANCE
    assert dropped["residual_left"] == [0.0] * size
    settled = values(reports, "settled")
    assert settled["before_flush"] == [False] * size
    assert settled["before"] == [[False, False]] * size  # the flush in the step, nothing left to send
    assert settled["changed"] == [True] * size
    assert settled["runtime"] == [[True, True, 0]] * size
    assert settled["conds"] == [1] * size
    assert settled["horovod"] == [True] * size
    assert max(settled["against_horovod"]) < FLOAT_TOLERANCE
    assert settled["residual_left"] == [0.0] * size
    assert max(dropped["conserved"]) < FLOAT_TOLERANCE


def test_a_departing_exchange_is_re_planned_alike_on_every_rank(reports):
    for r in reports:
        assert r["predict/too_early"] is True
        on_time, late = r["predict/on_time"], r["predict/late"]
        assert on_time["departure"] == pytest.approx(0.0, abs=1e-9) and on_time["replanned"] is False
        assert on_time["overlap_slowdown"] == 1.0 and not on_time["recalibrated"]
        assert late["measured_seconds"] == pytest.approx(3.0 * on_time["measured_seconds"])
        assert late["departure"] == pytest.approx(2.0) and late["replanned"] is True
        assert 1.0 <= late["overlap_slowdown"] == r["predict/late_slowdown"] <= 20.0
        assert late["recalibrated"] is False  # strategy="dense": no network makes this plan compress
    for r in reports:
        assert r["predict/dropped"] == [True, False, False, True]
    for key in ("predict/on_time_digest", "predict/late_digest", "predict/late_slowdown"):
        assert len({r[key] for r in reports}) == 1
    assert len({json.dumps(r["predict/late"], sort_keys=True) for r in reports}) == 1


def test_compression_probed_on_every_rank_at_once_gives_the_same_figures_everywhere(reports):
    figures = reports[0]["plan/probed_together"]
    (c0, c1, *_), (fitted, complete) = figures, figures[5:7]
    assert c1 > 0 and c0 >= 0 and fitted and complete
    assert all(r["plan/probed_together"] == figures for r in reports)


def test_compression_costs_are_cached_and_reused_and_the_network_measured_by_every_job(reports):
    # The first job measures once, or twice where its network figures failed to explain the probes.
    assert reports[0]["plan/first_entry_cached"]
    assert all(r["plan/measured_after_first"] >= 1 for r in reports)
    if reports[0]["plan/first_entry_complete"]:  # reused as it is (lower bounds: the test below)
        assert all(r["plan/measured_after_second"] == r["plan/measured_after_first"] for r in reports)
        assert all(r["plan/cached_compression_equal"] for r in reports)
    assert all(r["plan/networks_measured_after_first"] >= 1 for r in reports)
    assert all(r["plan/networks_measured_after_second"] > r["plan/networks_measured_after_first"] for r in reports)


def test_perturbed_calibration_on_one_rank_still_gives_one_plan(reports):
    # Rank 1 measured a 1 kB/s network and free compression; rank 0's figures win everywhere.
    assert reports[1]["plan/perturbed_own_bandwidth"] == 1e3 and reports[0]["plan/perturbed_cluster"][2] > 1e6
    assert len({r["plan/perturbed_digest"] for r in reports}) == 1
    assert all(r["plan/perturbed_cluster"] == reports[0]["plan/perturbed_cluster"] for r in reports)
    assert all(r["plan/perturbed_finite"] for r in reports)


def test_compression_figures_agreed_as_the_median_of_the_ranks(reports):
    expected = np.median([r["plan/own_costs"] for r in reports], axis=0)
    for r in reports:
        np.testing.assert_allclose(r["plan/agreed_costs"], expected, rtol=1e-12)
        assert r["plan/agreed_flags"] == [True, True]  # rank 0's fitted (the others' were False)


def test_different_plans_raise_on_every_rank(reports):
    messages = [r["plan/mismatch_error"] for r in reports]
    assert all(m.startswith("tfcomp: the ranks made different exchange plans") for m in messages), messages


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_calibration_between_steps_starts_dense_and_finishes_alike_on_every_rank(reports):
    for r in reports:
        # The first step measured nothing and sent everything dense: the mean of the ranks' gradients.
        assert r["between/first_plan"] == ["dense"] and r["between/first_pending"] is True
        assert r["between/first_seconds"] == 0.0 and r["between/check_while_pending"] is True
        assert r["between/first_mean_error"] < FLOAT_TOLERANCE
        # The gate waited for 10 timed steps; where it let calibration run, that was spread over more.
        exposed, step, spread, calibrates, share = r["between/gate"]
        assert calibrates is (exposed >= max(0.05, 2.0 * spread) * step)
        if calibrates:
            assert r["between/steps"] > 11 and r["between/seconds"] > 0.0 and share >= 0.02
            assert ClusterModel.from_list(r["between/cluster"]).encode_decode.c1 > 0.0  # compression measured
        else:
            assert r["between/steps"] == 11 and r["between/seconds"] == 0.0 and share == 0.0
        assert r["between/calibrate_step_after_done"] is False
        assert r["between/at_once_pending"] is False
        assert ClusterModel.from_list(r["between/at_once_cluster"]).encode_decode.c1 > 0.0
        assert r["between/callback_calibrated_at"] >= 11
    for key in ("steps", "gate", "cluster", "digest", "at_once_changed", "at_once_cluster", "callback_gate",
                "callback_calibrated_at", "callback_replanned", "callback_digest"):
        assert len({json.dumps(r[f"between/{key}"]) for r in reports}) == 1, key


def test_barrier_holds_every_rank_until_the_last_arrives(reports):
    # The last rank slept 1 s before the barrier; the others waited for it there, eagerly and when
    # the barrier was called while a tf.function was traced. (At least 0.5 s: the ranks left the
    # barrier before it within a few ms of each other, here or on a loaded machine.)
    waited = values(reports, "barrier")
    assert set(waited) == {"eager_seconds", "traced_seconds"}
    for where, seconds in waited.items():
        assert min(seconds) >= 0.5, where
