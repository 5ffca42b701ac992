"""`python -m tfcomp.whatif`: predictions against the cost model's formulas, JSON, plot, profiles, errors."""

import json
import math
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


@pytest.mark.jobs
def test_json_matches_the_formulas(rng):
    params = int(rng.integers(10**6, 10**8))
    workers = int(rng.integers(2, 64))
    encode_ms, decode_ms = float(rng.uniform(0, 50)), float(rng.uniform(0, 10))
    result = run("--params", str(params), "--workers", str(workers), "--latency", "1ms", "--bandwidth", "10Gbps",
                 "--compressor", "dragonn", "--ratio", "0.001", "--encode-ms", str(encode_ms), "--decode-ms",
                 str(decode_ms), "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    rows = {r["name"]: r for r in out["strategies"]}
    assert set(rows) == {"dense_ring_allreduce", "allgather", "artopk_ring", "artopk_tree", "partitioned"}
    net = cm.Network(1e-3, 1.25e9)
    k = round(0.001 * params)
    assert rows["dense_ring_allreduce"]["communication_s"] == pytest.approx(cm.ring_allreduce(4 * params, workers, net))
    assert rows["dense_ring_allreduce"]["compression_s"] == 0.0
    assert rows["allgather"]["communication_s"] == pytest.approx(cm.ring_allgather(8 * k + 4, workers, net))
    assert rows["artopk_ring"]["communication_s"] == pytest.approx(cm.artopk_ring(4 * k, 4 * k + 4, workers, net))
    assert rows["artopk_tree"]["communication_s"] == pytest.approx(cm.artopk_tree(4 * k, 4 * k + 4, workers, net))
    owned = math.ceil(k / workers)  # DRAGONN's default union_limit 1: k sums kept in all
    assert rows["partitioned"]["communication_s"] == pytest.approx(
        (workers - 1) * net.hop(8 * k / workers) + cm.ring_allgather(8 * owned + 8, workers, net))
    for row in out["strategies"]:
        assert row["total_s"] == pytest.approx(row["communication_s"] + row["compression_s"])
        assert row["runs_in_tfcomp"] == (row["name"] != "artopk_tree")
        if row["name"] != "dense_ring_allreduce":
            assert row["compression_s"] == pytest.approx((encode_ms + decode_ms) / 1e3)
    # One tensor: stock Horovod cannot overlap it, and the plan is the fastest strategy tfcomp runs.
    assert out["horovod_total_s"] == pytest.approx(rows["dense_ring_allreduce"]["total_s"])
    fastest = min((r for r in out["strategies"] if r["runs_in_tfcomp"]), key=lambda r: r["total_s"])
    assert out["plan"]["total_s"] == pytest.approx(fastest["total_s"])
    assert out["choice"] == {"dense_ring_allreduce": "dense", "artopk_ring": "artopk"}.get(fastest["name"], fastest["name"])
    assert out["speedup_over_horovod"] == pytest.approx(out["horovod_total_s"] / out["plan"]["total_s"])
    assert out["inputs"]["elements"] == params and out["inputs"]["workers"] == workers
    assert out["inputs"]["encode_ms"] == encode_ms and out["inputs"]["decode_ms"] == decode_ms
    assert any("--encode-ms" in a for a in out["assumptions"])


@pytest.mark.parametrize("compressor", ["dragonn", "dgc", "topk"])
def test_device_prices_buckets_from_the_gpu_table(capsys, compressor, rng):
    from tfcomp import compressors, device_costs

    params, workers = int(rng.integers(10**6, 10**8)), int(rng.integers(2, 64))
    assert whatif.main(["--params", str(params), "--workers", str(workers), "--compressor", compressor,
                        "--device", "H100", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])  # after the seed line of conftest
    table = device_costs.MEASURED["h100"]
    assert table.gpu in out["assumptions"][0] and table.date in out["assumptions"][0]
    assert out["inputs"]["device"] == "H100" and out["inputs"]["encode_ms"] is None
    cost, _ = device_costs.bucket_cost(table, getattr(compressors, whatif._COMPRESSORS[compressor])(0.001), workers)
    compressed = [r for r in out["strategies"] if r["name"] != "dense_ring_allreduce"]
    assert compressed and all(r["compression_s"] == pytest.approx(cost(params)) for r in compressed)


@pytest.mark.parametrize("compressor, ops", [("DRAGONN", ("estimate_threshold", "dragonn_compress")),
                                             ("DGC", ("estimate_threshold", "dgc_compress")),
                                             ("TopK", ("topk_compress",))])
def test_device_fit_follows_the_measured_table(compressor, ops):
    """Encode plus decode of K payloads as fitted, against the table's own sums where the times are
    large enough to matter (2^24 elements and up): within 25 %."""
    from tfcomp import compressors, device_costs

    table = device_costs.MEASURED["h100"]
    for k in (4, 16, 64):
        cost, _ = device_costs.bucket_cost(table, getattr(compressors, compressor)(table.ratio), k)
        for i, d in enumerate(table.sizes):
            measured = 1e-3 * (sum(table.ms[op][i] for op in ops) + table.ms[f"decode_K{k}"][i])
            if d >= 2**24:
                assert cost(d) == pytest.approx(measured, rel=0.25), (compressor, k, d)


@pytest.mark.jobs
def test_fast_network_and_slow_encode_choose_dense():
    out = json.loads(run("--params", "1000000", "--workers", "4", "--bandwidth", "400Gbps", "--latency", "1us",
                         "--encode-ms", "20", "--json").stdout)
    assert out["choice"] == "dense" and [b["strategy"] for b in out["plan"]["buckets"]] == ["dense"]


@pytest.mark.jobs
def test_spelled_as_people_write_it():
    """Units with bit/s, counts with M, compressor names in any case: the same figures."""
    usual = run("--params", "25.6M", "--bandwidth", "10Gbit/s", "--compressor", "DRAGONN", "--encode-ms", "3", "--json")
    plain = run("--params", "25600000", "--bandwidth", "10Gbps", "--compressor", "dragonn", "--encode-ms", "3", "--json")
    assert usual.returncode == 0, usual.stderr
    assert json.loads(usual.stdout) == json.loads(plain.stdout)


@pytest.mark.jobs
def test_stock_horovod_overlaps_the_backward_pass_and_the_tfcomp_plan_does_not(rng):
    """Many tensors ready over a long backward pass on a fast network: Horovod's allreduce hides
    under it; the compressed one-bucket rows and the plan pay the backward pass in full."""
    forward_ms, backward_ms = float(rng.uniform(5, 20)), float(rng.uniform(200, 400))
    out = json.loads(run("--params", "4M", "--tensors", "50", "--workers", "4", "--bandwidth", "100Gbit/s",
                         "--encode-ms", "5", "--forward-ms", str(forward_ms), "--backward-ms", str(backward_ms),
                         "--json").stdout)
    last_tensor = cm.ring_allreduce(4 * 4e6 / 50, 4, cm.Network(50e-6, 12.5e9))
    assert out["horovod_total_s"] == pytest.approx((forward_ms + backward_ms) / 1e3 + last_tensor, rel=0.01)
    assert out["plan"]["total_s"] >= (forward_ms + backward_ms) / 1e3 + out["plan"]["exchange_s"] - 1e-12
    assert any("backprop order in proportion" in a for a in out["assumptions"])


@pytest.mark.jobs
def test_overlap_slowdown_slows_what_overlaps_the_backward_pass(rng):
    """Stock Horovod's allreduce overlaps a long backward pass; with transfers 2 to 4x slower beside
    it, it ends later, while the one-bucket rows, which start after the pass, do not change."""
    backward_ms, slowdown = float(rng.uniform(200, 400)), float(rng.uniform(2, 4))
    common = ["--params", "8M", "--tensors", "8", "--workers", "2", "--bandwidth", "1Gbit/s", "--encode-ms", "5",
              "--backward-ms", str(backward_ms), "--json"]
    plain = json.loads(run(*common).stdout)
    slowed = json.loads(run(*common, "--overlap-slowdown", str(slowdown)).stdout)
    assert slowed["inputs"]["overlap_slowdown"] == slowdown
    assert any("transfers during the backward pass" in a and f"{slowdown:g}x" in a for a in slowed["assumptions"])
    assert slowed["horovod_total_s"] > plain["horovod_total_s"]
    # One bucket after the backward pass does not overlap it: the same either way.
    assert [r["total_s"] for r in slowed["strategies"]] == [r["total_s"] for r in plain["strategies"]]
    # The replay itself: one tensor ready at 0, the backward pass's last tensor at `busy`.
    net = cm.Network(0.0, 1e8)
    cluster = cm.ClusterModel(2, net, net, cm.AffineCost(0.0, 0.0), overlap_slowdown=slowdown)
    alone = cm.ring_allreduce(4e6, 2, net)  # 0.04 s on an idle device
    busy = 0.5 * alone
    finish = cm.horovod_dense_finish([10**6, 1], [0.0, busy], cluster, cycle_seconds=0.0)
    first = busy + alone - busy / slowdown  # slowed until `busy`, then at full speed
    assert finish == pytest.approx(first + cm.ring_allreduce(4, 2, net))


@pytest.mark.jobs
def test_profile_ready_times_drive_the_horovod_replay(tmp_path, rng):
    """A profile's ready_ms (variable order) are the gradients' ready times: the last one ready
    bounds stock Horovod's step from below, whatever order they come in."""
    sizes = [int(n) for n in rng.integers(10**4, 10**6, 6)]
    ready_ms = [float(t) for t in rng.uniform(1, 80, 6)]
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"tensors": [{"name": f"v{i}", "elements": n, "ready_ms": t}
                                               for i, (n, t) in enumerate(zip(sizes, ready_ms))]}))
    out = json.loads(run("--profile", str(profile), "--workers", "4", "--bandwidth", "10Gbit/s", "--encode-ms", "1",
                         "--backward-ms", "80", "--json").stdout)
    cluster = cm.ClusterModel(4, cm.Network(50e-6, 1.25e9), cm.Network(50e-6, 1.25e9), cm.AffineCost(0.0, 0.0))
    assert out["horovod_total_s"] == pytest.approx(max(0.08, cm.horovod_dense_finish(sizes, [t / 1e3 for t in ready_ms],
                                                                                     cluster)))
    assert out["assumptions"][1] == "gradients ready at the profile's ready_ms"


@pytest.mark.jobs
def test_measure_here_times_compression_on_this_machine_and_plot_is_drawn(tmp_path):
    plot = tmp_path / "whatif.png"
    result = run("--params", "300000", "--workers", "2", "--bandwidth", "1Gbps", "--compressor", "topk",
                 "--ratio", "0.01", "--measure-here", "--plot", str(plot))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].startswith("assumed compression: measured just now on this machine's CPU")
    header = next(i for i, line in enumerate(lines) if line.startswith("one bucket after the backward pass"))
    allgather = lines[header + 2].split()
    assert allgather[0] == "allgather" and float(allgather[2]) > 0  # measured here, not 0
    assert any(line.startswith("choice: ") for line in lines)
    assert plot.stat().st_size > 10_000 and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.jobs
def test_predicting_imports_neither_tensorflow_nor_horovod(tmp_path):
    """--help and a prediction from given costs (with a plot) stay off TensorFlow and Horovod: only
    --measure-here needs them."""
    code = ("import sys, contextlib, io\n"
            "from tfcomp import whatif\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    with contextlib.suppress(SystemExit):\n"
            "        whatif.main(['--help'])\n"
            f"    assert whatif.main(['--params', '1M', '--encode-ms', '1', '--plot', {str(tmp_path / 'p.png')!r}]) == 0\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'horovod', 'keras')))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=child_env(), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_without_compression_costs_it_asks_for_them(capsys):
    assert whatif.main(["--params", "1M"]) == 2
    assert "say what compression costs on your devices: --encode-ms" in capsys.readouterr().err


@pytest.mark.jobs
def test_profile_of_a_keras_model(tmp_path):
    import tensorflow as tf

    model = tf.keras.Sequential([tf.keras.layers.Dense(1000, input_shape=(2000,)), tf.keras.layers.Dense(10)])
    path = tmp_path / "profile.json"
    whatif.save_profile(model, str(path))
    assert [t["elements"] for t in json.loads(path.read_text())["tensors"]] == [2000 * 1000, 1000, 10000, 10]
    result = run("--profile", str(path), "--workers", "2", "--bandwidth", "1Gbps", "--encode-ms", "5")
    assert result.returncode == 0, result.stderr
    assert "2,011,010 float32 gradients" in result.stdout and "tfcomp plan for" in result.stdout


@pytest.mark.jobs
def test_profile_with_measured_step_times(tmp_path):
    """save_profile with a batch times the step here: every gradient ready after the forward pass (0 at
    the earliest), the last layer before the first, the last at the backward pass's end; the what-if
    takes those times."""
    import numpy as np
    import tensorflow as tf

    model = tf.keras.Sequential([tf.keras.layers.Dense(512, activation="relu", input_shape=(256,)),
                                 tf.keras.layers.Dense(512, activation="relu"), tf.keras.layers.Dense(10)])
    rng = np.random.default_rng(7)
    batch = (rng.standard_normal((64, 256)).astype(np.float32), rng.integers(0, 10, 64))
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    path = tmp_path / "profile.json"
    whatif.save_profile(model, str(path), batch=batch, loss=loss, steps=3)
    profile = json.loads(path.read_text())
    ready = [t["ready_ms"] for t in profile["tensors"]]
    # A gradient can be ready within the clock's microsecond of the forward pass's end: >= 0.
    assert profile["forward_ms"] > 0 and all(t >= 0 for t in ready)
    # The last layer's kernel and bias are ready before the first layer's kernel, whose gradient needs
    # the whole backward pass; the order within one layer, and of neighbouring ones, is the executor's.
    assert max(ready[-2:]) <= ready[0] and profile["backward_ms"] == max(ready)
    out = json.loads(run("--profile", str(path), "--workers", "2", "--encode-ms", "1", "--json").stdout)
    assert out["inputs"]["forward_s"] == pytest.approx(profile["forward_ms"] / 1e3)
    assert out["inputs"]["backward_s"] == pytest.approx(profile["backward_ms"] / 1e3)
    assert any(a.startswith("forward pass") for a in out["assumptions"])
    assert "gradients ready at the profile's ready_ms" in out["assumptions"]
    with pytest.raises(ValueError, match="loss: give the loss function"):
        whatif.save_profile(model, str(path), batch=batch)


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
    (["--params", "0"], "--params must be a whole number of elements >= 1, got '0'"),
    (["--params", "2.5"], "--params must be a whole number of elements >= 1, got '2.5'"),
    (["--params", "100", "--tensors", "101"], "--tensors must be an integer from 1 to --params, got 101"),
    (["--params", "100", "--decode-ms", "2"], "--decode-ms goes with --encode-ms"),
    (["--params", "100", "--encode-ms", "1", "--backward-ms", "-1"], "--backward-ms must be a number of milliseconds"),
    (["--params", "100", "--workers", "0"], "--workers must be an integer >= 1, got 0"),
    (["--params", "100", "--ratio", "1.5"], "--ratio: ratio must be a number in (0, 1], got 1.5"),
    (["--params", "100", "--encode-ms", "-3"], "--encode-ms must be a number of milliseconds >= 0"),
    (["--params", "100", "--encode-ms", "1", "--measure-here"], "not allowed with argument --encode-ms"),
    (["--params", "100", "--encode-ms", "1", "--device", "h100"], "not allowed with argument --encode-ms"),
    (["--params", "100", "--device", "a100"], "--device must be one of h100 (the GPUs measured), got 'a100'"),
    (["--params", "100", "--device", "h100", "--compressor", "qsgd"], "no GPU figures for QSGD"),
    (["--params", "abc"], "--params must be a number of elements, e.g. 126000000, 1.2e8 or 25.6M; got 'abc'"),
    (["--params", "100", "--encode-ms", "1", "--overlap-slowdown", "0.5"], "--overlap-slowdown must be a number from 1 to 20"),
    (["--params", "100", "--encode-ms", "1", "--overlap-slowdown", "nan"], "--overlap-slowdown must be a number from 1 to 20"),
    (["--bandwidth", "1Gbps"], "one of the arguments --params --profile is required"),
    (["--profile", "/nonexistent/profile.json"], "--profile '/nonexistent/profile.json' is not a readable profile"),
])
def test_bad_arguments_exit_non_zero_with_one_line(capsys, args, message):
    assert whatif.main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("whatif: error: ") and message in lines[0], captured.err


@pytest.mark.jobs
def test_bad_arguments_from_the_command_line():
    result = run("--params", "100", "--bandwidth", "-5Mbps")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == "whatif: error: bandwidth must be > 0, got '-5Mbps'"
