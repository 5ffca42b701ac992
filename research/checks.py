"""Checks of the lab scripts' summaries (research/link_burst.py, compression_cost_noise.py,
machine_steadiness.py, latency_after.py, horovod_timeline.py and prediction_replay.py), from
made-up job results. Nothing in CI runs them (the file name does not start with test_); run them
from the repository root with `python -m pytest -q research/checks.py`."""

import dataclasses
import json
import statistics

import numpy as np
import pytest

import tfcomp
from benchmarks.network_worker import predict
from research import compression_cost_noise, horovod_timeline, latency_after, link_burst, machine_steadiness
from research.prediction_replay import replay, summary
from tests.conftest import rng  # noqa: F401  (the suite's fixture: fresh random inputs, TFCOMP_TEST_SEED)
from tests.test_network_validation import _exchange_running, _Trainer, result
from tfcomp import cost_model as cm
from tfcomp import planning

__all__ = []


def test_affine_fit_recovers_latency_and_bandwidth_and_its_misfit(rng):
    latency, bandwidth = rng.uniform(1e-4, 3e-3), rng.uniform(1e7, 1e9)
    # Sizes over three decades, as the benchmark's: with sizes drawn uniformly, all six could lie
    # close together and one bent point pull the line to within 0.3 of it (it did, once in CI's runs).
    sizes = np.sort(np.geomspace(1e5, 1e8, 6) * rng.uniform(0.8, 1.25, size=6))
    fitted_latency, fitted_bandwidth, misfit = link_burst.affine_fit(sizes, latency + sizes / bandwidth)
    assert fitted_latency == pytest.approx(latency, rel=1e-6, abs=1e-9)
    assert fitted_bandwidth == pytest.approx(bandwidth, rel=1e-6)
    assert misfit < 1e-6
    bent = latency + sizes / bandwidth
    bent[0] *= 3  # a burst: the smallest size much slower than the line through the rest
    assert link_burst.affine_fit(sizes, bent)[2] > 0.3  # at least 0.50 over 20000 seeds


def _job(burst_ms, rate_bits, scale, workers=2):
    """Medians of a link of `rate_bits` that delivers its rate from the first byte, `scale` slower."""
    medians = []
    for collective in ("allreduce", "allgather"):
        for nbytes in [4] + [n for n in link_burst.SIZES if collective == "allreduce" or n <= link_burst.ALLGATHER_MAX_BYTES]:
            ring = link_burst._ring_bytes(collective, nbytes, workers)
            medians.append({"collective": collective, "bytes": nbytes, "seconds": scale * (1e-3 + 8 * ring / rate_bits)})
    return {"burst_ms": burst_ms, "rate_bits": rate_bits, "medians": medians}


def test_link_summary_reads_the_rate_and_the_spread_between_jobs():
    rows, markdown = link_burst.summarise([_job(1.0, 1e9, 1.0), _job(1.0, 1e9, 1.2), _job(1.0, 1e9, 1.1)], workers=2)
    assert [(r["collective"], r["jobs"]) for r in rows] == [("allreduce", 3), ("allgather", 3)]
    for row in rows:
        assert row["fit_fraction"] == pytest.approx(1 / 1.1, rel=1e-6)  # the median job's
        assert row["fit_misfit"] < 1e-6
        assert all(s == pytest.approx(0.2 / 1.1) for s in row["spread"].values())
    assert "| 1 | 1 Gbit/s | allreduce | 3 | 0.91 |" in markdown


def test_compression_cost_spreads_within_and_between_jobs():
    # Results of 210c981 and before had two kinds; the table follows whatever kinds the jobs hold.
    jobs = [{"model": "cnn", "job": 0, "c1": {"compute alone": [4e-9, 5e-9, 4.5e-9], "with the network": [3e-9] * 3}},
            {"model": "cnn", "job": 1, "c1": {"compute alone": [6e-9] * 3, "with the network": [3e-9, 3.3e-9, 3.6e-9]}}]
    assert compression_cost_noise.spread([4.0, 5.0, 4.5]) == pytest.approx(1 / 4.5)
    table = compression_cost_noise.summarise(jobs)
    assert "| cnn | compute alone | 4.00, 5.00, 4.50 (22 %); 6.00, 6.00, 6.00 (0 %) | 5.50 (4.00 to 6.00) | 36 % |" in table
    assert "| cnn | with the network | 3.00, 3.00, 3.00 (0 %); 3.00, 3.30, 3.60 (18 %) | 3.00 (3.00 to 3.60) | 20 % |" in table
    assert "as calibration measures it" not in table
    ours = compression_cost_noise.summarise([{"model": "vit", "job": 0, "c1": {compression_cost_noise.KIND: [2e-9, 2.2e-9]}}])
    assert f"| vit | {compression_cost_noise.KIND} | 2.00, 2.20 (10 %) | 2.10 (2.00 to 2.20) | 10 % |" in ours


def _trace(tensors):
    """A made-up Horovod timeline: per tensor (name, [(phase, start us, duration us, depth)])."""
    events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": 1}}]
    for pid, (name, phases) in enumerate(tensors, start=1):
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"PartitionedCall/x/{name}"}})
        # Begin/end events in time order, children inside their parent.
        marks = [(start, 1, "B", phase) for phase, start, _, _ in phases] + \
                [(start + duration, 0, "E", phase) for phase, start, duration, _ in phases]
        for ts, _, kind, phase in sorted(marks):
            events.append({"ph": kind, "name": phase, "ts": ts, "pid": pid} if kind == "B" else {"ph": "E", "ts": ts, "pid": pid})
    return events


def test_horovod_timeline_groups_tensors_and_times_each_phase(tmp_path, rng):
    negotiate = rng.uniform(10, 5000, size=6)
    gloo = rng.uniform(100, 9000, size=6)
    tensors = [(f"HorovodAllreduce_layer_{i}_0", [("NEGOTIATE_ALLREDUCE", 0.0, negotiate[i], 0),
                                                   ("ALLREDUCE", negotiate[i], gloo[i] + 20.0, 0),
                                                   ("GLOO_ALLREDUCE", negotiate[i] + 10.0, gloo[i], 1)])
               for i in range(6)]
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps(_trace(tensors))[:-1] + ",")  # as a running job leaves it: not closed
    spans = horovod_timeline.phase_spans(horovod_timeline.read_timeline(str(path)))
    assert sorted((s[1], s[4]) for s in spans) == sorted([("NEGOTIATE_ALLREDUCE", 0), ("ALLREDUCE", 0), ("GLOO_ALLREDUCE", 1)] * 6)
    text = horovod_timeline.summarise(spans)
    row = {line.split(" | ")[1].strip(): line for line in text.splitlines()[2:]}
    assert all(line.startswith("| HorovodAllreduce_layer_#_# |") for line in row.values())
    cells = row["GLOO_ALLREDUCE"].split(" | ")
    assert (int(cells[2]), float(cells[3]), float(cells[4])) == \
        (6, round(np.median(gloo) / 1e3, 2), round(np.mean(gloo) / 1e3, 2))
    assert "NEGOTIATE" not in horovod_timeline.summarise(spans, skip=("HorovodAllreduce_layer",))
    path.write_text("{}")
    with pytest.raises(ValueError, match="not a Horovod timeline"):
        horovod_timeline.read_timeline(str(path))


def test_latency_after_table_has_a_row_per_setting_and_preceding_collective(rng):
    figures = {label: {name: {"median_ms": float(rng.uniform(0.5, 9)), "slow_share": float(rng.uniform())}
                       for name in ("allreduce", "allgather")} for label in latency_after.BEFORE}
    results = {"1gbit": {horovod: figures for horovod in latency_after.HOROVOD_SETTINGS}}
    lines = latency_after.summarise(results).splitlines()
    assert len(lines) == 2 + len(latency_after.BEFORE) * len(latency_after.HOROVOD_SETTINGS)
    first = figures["one float"]
    assert lines[2] == (f"| 1gbit | defaults | one float | {first['allreduce']['median_ms']:.2f} "
                        f"({first['allreduce']['slow_share']:.0%}) | {first['allgather']['median_ms']:.2f} "
                        f"({first['allgather']['slow_share']:.0%}) |")


def test_machine_steadiness_spreads_the_probe_its_jobs_and_its_ratios(rng):
    # Two jobs of two processes; the second job's machine runs 1.5x slower, every process
    # timing its probe at 3x its read pass and 4x its matrix product, round by round.
    processes = []
    for job, slowdown in ((0, 1.0), (1, 1.5)):
        for cpu in (0, 1):
            read = slowdown * rng.uniform(3e-3, 3.1e-3, size=5)
            processes.append({"job": job, "cpu": cpu, "times_s": {"probe": 3 * read, "read": read,
                                                                  "matmul": 0.75 * read}})
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in
            machine_steadiness.summarise(processes).splitlines()[2:]}
    assert set(rows) == {"probe", "read", "matmul", "probe, each job's median over its processes",
                         "probe / read", "probe / matmul"}
    slow_fast = [statistics.median(p["times_s"]["probe"]) for p in processes]
    assert rows["probe"][-1].strip(" |") == f"{compression_cost_noise.spread(slow_fast):.0%}"
    assert float(rows["probe, each job's median over its processes"][-1].strip(" %|")) > 35
    assert rows["probe / read"][1].strip() == "3"  # the ratios do not move with the machine
    assert rows["probe / read"][-1].strip(" |") == "0%"
    assert rows["probe / matmul"][1].strip() == "4"


def test_machine_steadiness_counts_the_draws_of_five_jobs_within_the_bound():
    # Six jobs whose probes take 10, 10, 10, 10, 10.5 and 13 ms: five of them drawn spread at most
    # 20 % only without the 13 ms job (1 of the 6 draws).
    processes = [{"job": job, "cpu": 0, "times_s": {"probe": [ms / 1e3] * 3, "read": [1e-3] * 3, "matmul": [1e-3] * 3}}
                 for job, ms in enumerate([10, 10, 10, 10, 10.5, 13])]
    assert machine_steadiness.summarise(processes).splitlines()[-1] == (
        "Of the 6 ways to draw 5 of the 6 jobs, 1 (17%) have their probe medians within a spread of 20%.")
    assert "ways to draw" not in machine_steadiness.summarise(processes[:4])


def test_a_replay_prices_the_kept_plans_as_the_worker_did_and_fits_their_slowdown_again(rng):
    sizes = [int(n) for n in rng.integers(100_000, 400_000, 4)]
    cluster = cm.ClusterModel(2, cm.Network(5e-5, 1.25e8), cm.Network(5e-5, 1.25e8), cm.AffineCost(1e-4, 2e-9),
                              1e-5)
    ready = sorted(float(t) for t in rng.uniform(0.0, 0.02, len(sizes)))
    plan = planning.make_plan([(i, f"g{i}", n) for i, n in enumerate(sizes)], tfcomp.DRAGONN(0.01, strategy="dense"),
                              cluster, ready_seconds=ready)
    slowed = dataclasses.replace(plan, cluster=dataclasses.replace(cluster, overlap_slowdown=3.0))
    measured_exchange = planning.predicted_exchange_time(slowed)
    results = [result("m", "compute_synced", 0.05), result("m", "horovod_dense", 0.2), result("m", "plan", 0.1)]
    trainers = {("m", "plan"): _Trainer(_exchange_running(plan), sizes, fitted_plan=slowed,
                                        measured_exchange_s=measured_exchange),
                ("m", "horovod_dense"): _Trainer(None, sizes)}
    predict(results, trainers)
    rows = replay({"1gbit": {"results": results}})
    assert [(r["setting"], r["config"]) for r in rows] == [("1gbit", "horovod_dense"), ("1gbit", "plan")]
    for row, r in zip(rows, results[1:]):
        assert row["measured_s"] == r["measured_s"] and row["recorded_s"] == r["predicted_s"]
        assert row["now_s"] == pytest.approx(r["predicted_s"], rel=1e-3)  # the plan's slowdown fitted again
    figures = summary(rows)
    assert figures["all"]["now_s"][1] == pytest.approx(max(abs(r["predicted_s"] / r["measured_s"] - 1)
                                                           for r in results[1:]), rel=1e-3)
    # Without a measured exchange the kept plan is priced as kept; a record without plans gives no rows.
    del results[2]["measured_exchange_s"]
    assert replay({"1gbit": {"results": results}})[1]["now_s"] == pytest.approx(results[2]["predicted_s"])
    assert replay({"1gbit": {"results": [result("m", "plan", 0.1, 0.1)]}}) == []
    for name in ("planning", "os"):
        results[2]["plan"]["compressor"] = [name, {}]
        with pytest.raises(ValueError, match="must name a tfcomp compressor class"):
            replay({"1gbit": {"results": results}})
