"""The summaries of the emulated-cluster diagnostics (benchmarks/link_burst.py and
benchmarks/compression_cost_noise.py), from made-up job results."""

import numpy as np
import pytest

from benchmarks import compression_cost_noise, link_burst


def test_affine_fit_recovers_latency_and_bandwidth_and_its_misfit():
    rng = np.random.default_rng()
    latency, bandwidth = rng.uniform(1e-4, 3e-3), rng.uniform(1e7, 1e9)
    sizes = np.sort(rng.uniform(1e5, 1e8, size=6))
    fitted_latency, fitted_bandwidth, misfit = link_burst.affine_fit(sizes, latency + sizes / bandwidth)
    assert fitted_latency == pytest.approx(latency, rel=1e-6, abs=1e-9)
    assert fitted_bandwidth == pytest.approx(bandwidth, rel=1e-6)
    assert misfit < 1e-6
    bent = latency + sizes / bandwidth
    bent[0] *= 3  # a burst: the smallest size much slower than the line through the rest
    assert link_burst.affine_fit(sizes, bent)[2] > 0.3


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
