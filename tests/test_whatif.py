"""`python -m tfcomp.whatif`: predictions against the cost model's formulas, JSON, plot, profiles, errors."""

import json
import subprocess
import sys

import pytest

import tfcomp
from tfcomp import cost_model as cm
from tfcomp import whatif
from tests.helpers import REPO_ROOT, child_env


def run(*args):
    return subprocess.run([sys.executable, "-m", "tfcomp.whatif", *args], cwd=REPO_ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=300)


def test_json_matches_the_formulas(rng):
    params = int(rng.integers(10**6, 10**8))
    workers = int(rng.integers(2, 64))
    encode_ms = float(rng.uniform(0, 50))
    result = run("--params", str(params), "--workers", str(workers), "--latency", "1ms", "--bandwidth", "10Gbps",
                 "--compressor", "dragonn", "--ratio", "0.001", "--encode-ms", str(encode_ms), "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    rows = {r["name"]: r for r in out["strategies"]}
    assert set(rows) == {"dense_ring_allreduce", "allgather", "artopk_ring", "artopk_tree"}
    net = cm.Network(1e-3, 1.25e9)
    k = round(0.001 * params)
    assert rows["dense_ring_allreduce"]["communication_s"] == pytest.approx(cm.ring_allreduce(4 * params, workers, net))
    assert rows["dense_ring_allreduce"]["compression_s"] == 0.0
    assert rows["allgather"]["communication_s"] == pytest.approx(cm.ring_allgather(8 * k + 4, workers, net))
    assert rows["artopk_ring"]["communication_s"] == pytest.approx(cm.artopk_ring(4 * k, 4 * k + 4, workers, net))
    assert rows["artopk_tree"]["communication_s"] == pytest.approx(cm.artopk_tree(4 * k, 4 * k + 4, workers, net))
    for row in out["strategies"]:
        assert row["total_s"] == pytest.approx(row["communication_s"] + row["compression_s"])
        if row["name"] != "dense_ring_allreduce":
            assert row["compression_s"] == pytest.approx(encode_ms / 1e3)
    assert out["choice"] == min(out["strategies"], key=lambda r: r["total_s"])["name"]


def test_fast_network_and_slow_encode_choose_dense():
    out = json.loads(run("--params", "1000000", "--workers", "4", "--bandwidth", "400Gbps", "--latency", "1us",
                         "--encode-ms", "20", "--json").stdout)
    assert out["choice"] == "dense_ring_allreduce"


def test_table_measures_encode_time_here_and_plot_is_drawn(tmp_path):
    plot = tmp_path / "whatif.png"
    result = run("--params", "300000", "--workers", "2", "--bandwidth", "1Gbps", "--compressor", "topk",
                 "--ratio", "0.01", "--plot", str(plot))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].split() == ["strategy", "communication", "ms", "compression", "ms", "total", "ms"]
    compression_ms = float(lines[3].split()[2])  # allgather row: measured on this machine, not 0
    assert compression_ms > 0
    assert lines[-1].startswith("choice: ")
    assert plot.stat().st_size > 10_000 and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_profile_of_a_keras_model(tmp_path):
    import tensorflow as tf

    model = tf.keras.Sequential([tf.keras.layers.Dense(1000, input_shape=(2000,)), tf.keras.layers.Dense(10)])
    path = tmp_path / "profile.json"
    whatif.save_profile(model, str(path))
    assert [t["elements"] for t in json.loads(path.read_text())["tensors"]] == [2000 * 1000, 1000, 10000, 10]
    result = run("--profile", str(path), "--workers", "2", "--bandwidth", "1Gbps", "--encode-ms", "5")
    assert result.returncode == 0, result.stderr
    assert "2,011,010 float32 gradients" in result.stdout and "tfcomp plan for" in result.stdout


def test_randomk_offers_its_allreduce_and_quantisers_their_allgather():
    rows = whatif.predict(10**6, tfcomp.RandomK(0.01), cm.ClusterModel(
        4, cm.Network(1e-4, 1e9), cm.Network(1e-4, 1e9), cm.AffineCost(1e-3, 0.0)))["strategies"]
    assert [r["name"] for r in rows] == ["dense_ring_allreduce", "allreduce"]
    rows = whatif.predict(10**6, tfcomp.QSGD(), cm.ClusterModel(
        4, cm.Network(1e-4, 1e9), cm.Network(1e-4, 1e9), cm.AffineCost(1e-3, 0.0)))["strategies"]
    assert [r["name"] for r in rows] == ["dense_ring_allreduce", "allgather"]


@pytest.mark.parametrize("args, message", [
    (["--params", "100", "--bandwidth", "-1Gbps"], "bandwidth must be > 0, got '-1Gbps'"),
    (["--params", "100", "--bandwidth", "0Gbps"], "bandwidth must be > 0, got '0Gbps'"),
    (["--params", "100", "--bandwidth", "10furlongs"], "bandwidth must be a number with a unit"),
    (["--params", "100", "--latency", "3 fortnights"], "latency must be a number with a unit"),
    (["--params", "100", "--latency", "-1ms"], "latency must be >= 0, got '-1ms'"),
    (["--params", "100", "--latency", "1e300s", "--encode-ms", "1"], "allreduce.latency must be a finite number"),
    (["--params", "100", "--compressor", "zip"], "--compressor must be one of dragonn"),
    (["--params", "0"], "--params must be a number of elements > 0, got 0"),
    (["--params", "100", "--workers", "0"], "--workers must be an integer >= 1, got 0"),
    (["--params", "100", "--ratio", "1.5"], "--ratio: ratio must be a number in (0, 1], got 1.5"),
    (["--params", "100", "--encode-ms", "-3"], "--encode-ms must be a number of milliseconds >= 0"),
    (["--params", "abc"], "argument --params: invalid int value: 'abc'"),
    (["--bandwidth", "1Gbps"], "one of the arguments --params --profile is required"),
    (["--profile", "/nonexistent/profile.json"], "--profile '/nonexistent/profile.json' is not a readable profile"),
])
def test_bad_arguments_exit_non_zero_with_one_line(capsys, args, message):
    assert whatif.main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("whatif: error: ") and message in lines[0], captured.err


def test_bad_arguments_from_the_command_line():
    result = run("--params", "100", "--bandwidth", "-5Mbps")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == "whatif: error: bandwidth must be > 0, got '-5Mbps'"
