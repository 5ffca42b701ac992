"""The validation harness's summary: prediction errors and the issue's checks from worker results."""

import dataclasses
import types

import pytest
import tensorflow as tf

import tfcomp
from benchmarks.network_validation import _cache_text, summarise
from benchmarks.network_worker import Trainer, compute_time, predict
from tfcomp import cost_model as cm
from tfcomp import planning
from tfcomp import strategies as st


def result(model, config, measured, predicted=None, strategies=("dense",)):
    r = {"model": model, "config": config, "measured_s": measured, "samples_s": [measured],
         "cluster": [2, 1e-4, 6.25e7, 1e-4, 6.25e7, 0, 3e-9, 0, 0, 0]}
    if predicted is not None:
        r.update(predicted_s=predicted, strategies=list(strategies))
    return r


def setting(giant_dense, giant_plan, small_dense, small_plan, small_per_tensor, errors):
    """A setting's results; `errors`: the relative prediction errors of the six predicted
    configurations that count (plain Horovod, forced DRAGONN and the plan, per model)."""
    e = iter(errors)
    return {"workers": 2, "results": [
        result("giant", "compute", 0.03),
        result("giant", "compute_synced", 0.032),
        result("giant", "horovod_dense", giant_dense, giant_dense * (1 + next(e))),
        result("giant", "dragonn", giant_plan, giant_plan * (1 + next(e)), ["allgather"]),
        result("giant", "plan", giant_plan, giant_plan * (1 + next(e)), ["allgather"]),
        result("many_small", "compute", 0.005),
        result("many_small", "compute_synced", 0.009),
        result("many_small", "horovod_dense", small_dense, small_dense * (1 + next(e))),
        result("many_small", "dragonn", small_plan, small_plan * (1 + next(e)), ["allgather"]),
        result("many_small", "plan", small_plan, small_plan * (1 + next(e))),
        result("many_small", "per_tensor", small_per_tensor, small_per_tensor * 1.9, ["allgather", "dense"]),
    ]}


def test_summary_reports_errors_and_checks(rng):
    errors = [float(x) for x in rng.uniform(-0.3, 0.3, 12)]
    by_setting = {"unshaped": setting(0.08, 0.1, 0.02, 0.021, 0.03, errors[:6]),
                  "1gbit": setting(0.6, 0.1, 0.05, 0.015, 0.02, errors[6:])}
    text, checks = summarise(by_setting)
    # per_tensor's +90 % is shown but not counted: layer-wise compression is what the plan avoids.
    assert checks["prediction_error_max"] == pytest.approx(max(abs(x) for x in errors))
    assert checks["prediction_error_median"] == pytest.approx(sorted(abs(x) for x in errors)[5:7][0] / 2
                                                              + sorted(abs(x) for x in errors)[5:7][1] / 2)
    assert "| +90.0% |" in text
    assert checks["unshaped_many_small_plan_over_horovod"] == pytest.approx(0.021 / 0.02)
    assert checks["1gbit_giant_horovod_over_plan"] == pytest.approx(6.0)
    assert checks["1gbit_many_small_per_tensor_over_plan"] == pytest.approx(0.02 / 0.015)
    # 11 rows of measurements, 2 of the plan against plain Horovod.
    assert text.count("| unshaped |") == 13 and "| 1gbit | 0.50 | giant | dragonn | allgather |" in text
    assert "steal" not in text  # no figure measured, no line


def test_summary_shows_a_configuration_without_a_prediction_unpriced(rng):
    # Without the plan configuration plain Horovod has no figures to be priced with.
    dense, forced = (float(x) for x in rng.uniform(0.01, 0.1, 2))
    by_setting = {"1gbit": {"workers": 2, "results": [
        result("cnn", "compute", 0.005), result("cnn", "horovod_dense", dense),
        result("cnn", "dragonn", forced, forced * 1.1, ["allgather"])]}}
    text, checks = summarise(by_setting)
    assert f"| 1gbit | | cnn | horovod_dense | dense | {1e3 * dense:.1f} | — | |" in text
    assert checks["prediction_error_max"] == pytest.approx(0.1)


def test_summary_states_the_cpu_time_the_host_took():
    by_setting = {"unshaped": setting(0.08, 0.1, 0.02, 0.021, 0.03, [0.0] * 6),
                  "1gbit": setting(0.6, 0.1, 0.05, 0.015, 0.02, [0.0] * 6)}
    by_setting["unshaped"]["cpu_steal"], by_setting["1gbit"]["cpu_steal"] = 0.034, 0.41
    text, _ = summarise(by_setting)
    assert "(steal): unshaped 3 %, 1gbit 41 %." in text


def test_paired_ratio_is_the_median_of_ratios_round_by_round():
    by_setting = {"unshaped": setting(0.08, 0.1, 0.02, 0.021, 0.03, [0.0] * 6)}
    results = by_setting["unshaped"]["results"]
    # A machine that slows down round by round: plan and Horovod equal in every round.
    horovod, plan = results[7], results[9]
    horovod["samples_s"], plan["samples_s"] = [0.010, 0.020, 0.040], [0.011, 0.020, 0.038]
    horovod["measured_s"], plan["measured_s"] = 0.020, 0.020
    _, checks = summarise(by_setting)
    assert checks["unshaped_many_small_plan_over_horovod"] == pytest.approx(1.0)
    assert checks["unshaped_many_small_plan_over_horovod_paired"] == pytest.approx(1.0)
    plan["samples_s"] = [0.011, 0.022, 0.060]
    _, checks = summarise(by_setting)
    assert checks["unshaped_many_small_plan_over_horovod_paired"] == pytest.approx(1.1)


def test_plan_against_horovod_shows_rounds_and_trials():
    by_setting = {"unshaped": setting(0.08, 0.1, 0.02, 0.021, 0.03, [0.0] * 6)}
    results = by_setting["unshaped"]["results"]
    horovod, plan = results[7], results[9]
    horovod["samples_s"], plan["samples_s"] = [0.010, 0.020, 0.040], [0.012, 0.019, 0.048]
    plan["trials"] = [{"decided": True, "compressed": False, "compressed_ms": 25.0, "dense_ms": 21.5}]
    text, _ = summarise(by_setting)
    assert ("| unshaped | many_small | plan | dense | dropped (25.0 against 21.5 ms dense) | 1.050 | "
            "1.200 (0.95 to 1.20) |") in text
    assert "| unshaped | giant | plan | allgather | none | 1.250 | 1.250 (1.25 to 1.25) |" in text


def test_compute_time_takes_the_synced_step_less_its_modelled_allreduce_at_least_the_compute_step(rng):
    cluster = cm.ClusterModel(2, cm.Network(float(rng.uniform(1e-5, 1e-3)), 1e9), cm.Network(1e-4, 1e9),
                              cm.AffineCost(0.0, 0.0), float(rng.uniform(0, 1e-4)))
    sync = cm.ring_allreduce(4, 2, cluster.allreduce) + cluster.per_tensor
    results = [result("m", "compute", 0.005), result("m", "compute_synced", 0.009)]
    assert compute_time(results, "m", cluster) == pytest.approx(0.009 - sync)
    assert compute_time(results[:1], "m", cluster) == 0.005
    assert compute_time(results[1:], "m", cluster) == pytest.approx(0.009 - sync)
    # Calibration's latency above what the allreduce adds to the step: the compute step bounds it.
    slow = dataclasses.replace(cluster, allreduce=cm.Network(0.004, 1e9))
    assert compute_time(results, "m", slow) == 0.005
    assert compute_time(results[1:], "m", slow) == pytest.approx(0.009 - cm.ring_allreduce(4, 2, slow.allreduce)
                                                                 - cluster.per_tensor)


class _Trainer:
    """What predict() reads of a network_worker.Trainer: its exchange, its model's variables and
    the plan it prices (Trainer's own property)."""

    plan = Trainer.plan

    def __init__(self, exchange, sizes, fitted_plan=None, measured_exchange_s=None):
        self.exchange = exchange
        self.fitted_plan = fitted_plan
        self.measured_exchange_s = measured_exchange_s
        self.model = types.SimpleNamespace(trainable_variables=[types.SimpleNamespace(shape=tf.TensorShape([n]))
                                                                for n in sizes])


def _exchange_running(plan):
    exchange = object.__new__(tfcomp.GradientExchange)  # predict() reads only its plan
    exchange.__dict__["plan"] = plan
    return exchange


@pytest.mark.parametrize("with_ready_times", [True, False])
def test_predictions_overlap_the_backward_pass_where_ready_times_were_measured(rng, with_ready_times):
    sizes = [int(n) for n in rng.integers(1000, 400_000, 6)]
    cluster = cm.ClusterModel(2, cm.Network(5e-5, 1.25e8), cm.Network(5e-5, 1.25e8), cm.AffineCost(1e-4, 2e-9),
                              1e-5)
    ready = sorted(float(t) for t in rng.uniform(0.0, 0.02, len(sizes))) if with_ready_times else None
    plan = planning.make_plan([(i, f"g{i}", n) for i, n in enumerate(sizes)], tfcomp.DRAGONN(0.01), cluster,
                              ready_seconds=ready)
    results = [result("m", "compute", 0.05), result("m", "compute_synced", 0.06),
               result("m", "horovod_dense", 0.2), result("m", "plan", 0.1)]
    for r in results:
        r["parameters"] = sum(sizes)
    trainers = {("m", "plan"): _Trainer(_exchange_running(plan), sizes), ("m", "horovod_dense"): _Trainer(None, sizes)}
    predict(results, trainers)
    compute = compute_time(results, "m", cluster)
    span = max(ready) if with_ready_times else 0.0
    horovod = (cm.horovod_dense_finish(sizes, ready, cluster) if with_ready_times
               else st.DENSE.time(sum(sizes), tfcomp.NoCompression(), cluster, tensors=len(sizes)).total)
    assert results[2]["predicted_s"] == pytest.approx(compute - span + horovod)
    assert results[3]["predicted_s"] == pytest.approx(compute - span + planning.predicted_exchange_time(plan))
    assert results[3]["overlapped_s"] == pytest.approx(span)
    # Overlapped or not, a prediction never ends before the compute step does.
    assert min(results[2]["predicted_s"], results[3]["predicted_s"]) >= compute


def test_predictions_price_the_fitted_plan_where_warm_up_fitted_one(rng):
    sizes = [int(n) for n in rng.integers(100_000, 400_000, 4)]
    cluster = cm.ClusterModel(2, cm.Network(5e-5, 1.25e8), cm.Network(5e-5, 1.25e8), cm.AffineCost(1e-4, 2e-9),
                              1e-5)
    ready = sorted(float(t) for t in rng.uniform(0.0, 0.02, len(sizes)))
    plan = planning.make_plan([(i, f"g{i}", n) for i, n in enumerate(sizes)], tfcomp.NoCompression(), cluster,
                              ready_seconds=ready)
    slowed = dataclasses.replace(plan, cluster=dataclasses.replace(cluster, overlap_slowdown=3.0))
    results = [result("m", "compute", 0.05), result("m", "horovod_dense", 0.2), result("m", "plan", 0.1)]
    trainers = {("m", "plan"): _Trainer(_exchange_running(plan), sizes, fitted_plan=slowed, measured_exchange_s=0.03),
                ("m", "horovod_dense"): _Trainer(None, sizes)}
    predict(results, trainers)
    assert results[2]["predicted_s"] == pytest.approx(0.05 - max(ready) + planning.predicted_exchange_time(slowed))
    assert results[1]["predicted_s"] == pytest.approx(0.05 - max(ready) + cm.horovod_dense_finish(sizes, ready,
                                                                                                   slowed.cluster))
    assert results[1]["overlap_slowdown"] == results[2]["overlap_slowdown"] == 3.0
    assert results[2]["measured_exchange_s"] == 0.03
    assert planning.Plan.from_record(results[2]["plan"], tfcomp.NoCompression()).cluster == slowed.cluster
    # Slower transfers beside the backward pass never end the exchange earlier.
    assert planning.predicted_exchange_time(slowed) >= planning.predicted_exchange_time(plan)


def test_the_header_says_how_the_workers_ran_horovods_response_cache():
    assert _cache_text(None, None) == "on (Horovod's default capacity)"
    assert _cache_text(0, "512") == "off"  # the flag wins over the inherited variable
    assert _cache_text(None, "0") == "off" and _cache_text(None, "512") == "capacity 512"
