"""`python -m tfcomp.whatif`: predictions against the cost model's formulas, JSON, plot, profiles, errors."""

import dataclasses
import json
import math
import subprocess
import sys

import pytest

import tfcomp
from tfcomp import cost_model as cm
from tfcomp import planning
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
    result = run("--params", str(params), "--tensors", "1", "--workers", str(workers), "--latency", "1ms",
                 "--bandwidth", "10Gbps", "--compressor", "dragonn", "--ratio", "0.001", "--encode-ms", str(encode_ms),
                 "--decode-ms", str(decode_ms), "--json")
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
    # One tensor: stock Horovod cannot overlap it, and the plan is the fastest strategy tfcomp runs where that
    # shortens the step (the exchange alone: no compute times) by more than the margin of it, else dense.
    dense = rows["dense_ring_allreduce"]["total_s"]
    assert out["horovod_total_s"] == pytest.approx(dense) and out["dense_total_s"] == pytest.approx(dense)
    fastest = min((r for r in out["strategies"] if r["runs_in_tfcomp"]), key=lambda r: r["total_s"])
    assert out["predicted_gain"] == pytest.approx(max(dense - fastest["total_s"], 0.0) / dense)
    assert out["margin"] == planning.COMPRESSION_MARGIN == out["inputs"]["margin"]
    chosen = fastest if dense - fastest["total_s"] > out["margin"] * dense else rows["dense_ring_allreduce"]
    assert out["compresses"] == (chosen is fastest and fastest["name"] != "dense_ring_allreduce")
    assert out["plan"]["total_s"] == pytest.approx(chosen["total_s"])
    names = {"dense_ring_allreduce": "dense", "artopk_ring": "artopk"}
    assert out["choice"] == names.get(chosen["name"], chosen["name"])
    assert out["compute_times"] == {"forward": "assumed", "backward": "assumed"}
    assert out["tensor_spread"] == "one tensor (--tensors 1)"
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
    (["--params", "100", "--encode-ms", "1", "--margin", "1"], "--margin must be a fraction in [0, 1), got 1.0"),
    (["--params", "100", "--encode-ms", "1", "--margin", "-0.1"], "--margin must be a fraction in [0, 1), got -0.1"),
    (["--params", "100", "--encode-ms", "1", "--tensors", "0"],
     "--tensors must be an integer from 1 to --params, got 0"),
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


def json_of(capsys, *args) -> dict:
    """The what-if's --json answer, run in this process."""
    assert whatif.main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out.splitlines()[-1])  # after the seed line of conftest


ISSUE_44 = ["--params", "25.6M", "--workers", "8", "--bandwidth", "100Gbit/s", "--device", "h100", "--forward-ms", "30",
            "--backward-ms", "60"]  # ResNet-50 on 8 GPUs at 100 Gbit/s


def test_inside_the_margin_the_answer_is_stay_dense_with_the_gain_and_the_margin(capsys):
    """Issue 44's case: the best compressing plan of 161 equal tensors is predicted 0.3 % faster a
    step than dense; the what-if says stay dense, with that gain and the margin, and recommends the
    compressing plan only where the margin is under its gain."""
    out = json_of(capsys, *ISSUE_44, "--tensors", "161")
    gain = out["predicted_gain"]
    assert 0.0 < gain < planning.COMPRESSION_MARGIN == out["margin"]
    best = out["compressing_plan"]
    assert gain == pytest.approx((out["dense_total_s"] - best["total_s"]) / out["dense_total_s"])
    assert not out["compresses"] and out["choice"] == "dense"
    assert out["plan"]["total_s"] == pytest.approx(out["dense_total_s"]) == out["horovod_total_s"]
    assert out["speedup_over_horovod"] == pytest.approx(1.0)
    assert whatif.main([*ISSUE_44, "--tensors", "161"]) == 0
    text = capsys.readouterr().out
    verdict = next(line for line in text.splitlines() if line.startswith("verdict: "))
    assert verdict == (f"verdict: stay dense: the best compressing plan's step is predicted {100 * gain:.2f} % shorter "
                       f"than all dense ({1e3 * best['total_s']:.3f} against {1e3 * out['dense_total_s']:.3f} ms), "
                       f"inside the 5 % margin ({50 * out['dense_total_s']:.3f} ms)")
    assert "\nchoice: dense: a training step of " in text
    below = json_of(capsys, *ISSUE_44, "--tensors", "161", "--margin", str(gain * 0.9))
    assert below["compresses"] and below["plan"] == best and below["choice"] != "dense"


def test_resnet50_is_the_default_spread_of_params():
    """ResNet-50's tensors as torchvision lays them out (25,557,032 elements, its published count),
    scaled to --params: every tensor at least one element, in proportion to ResNet-50's within
    one; where --params is under 161, that many tensors of one element."""
    layout = whatif.resnet50_tensors()
    sizes = [n for _, n in layout]
    assert len(layout) == 161 and sum(sizes) == 25_557_032 and len({name for name, _ in layout}) == 161
    assert sum(name.endswith("conv1.weight") or ".conv" in name or "downsample.0" in name for name, _ in layout) == 53
    assert layout[-2:] == [("fc.weight", 2048 * 1000), ("fc.bias", 1000)] and max(sizes) == 512 * 512 * 9
    for params in (161, 1000, 25_600_000, 126_000_000, 10**10 + 7):
        spread, words = whatif._spread(params, None)
        assert [name for name, _ in spread] == [name for name, _ in layout] and "ResNet-50" in words
        assert sum(n for _, n in spread) == params and min(n for _, n in spread) >= 1
        share = (params - 161) / sum(sizes)
        assert all(abs(n - 1 - share * m) < 1 for (_, n), m in zip(spread, sizes))
    assert whatif._spread(100, None)[0] == [(f"params_{i}", 1) for i in range(100)]
    assert whatif._spread(10, 3)[0] == [("params_0", 4), ("params_1", 3), ("params_2", 3)]


def test_a_spread_of_tensors_lets_dense_overlap_the_backward_pass(capsys):
    """Without --tensors the what-if assumes ResNet-50's spread and says so: ResNet-50 at 100 Gbit/s
    on 8 workers is then about as fast dense as compressed (issue 44: 1.00x with its 161 tensors),
    where one tensor of all the elements hides none of the exchange under the backward pass."""
    spread = json_of(capsys, *ISSUE_44)
    one = json_of(capsys, *ISSUE_44, "--tensors", "1")
    assert spread["inputs"]["tensors"] == 161 and "ResNet-50" in spread["tensor_spread"]
    assert any(a.startswith("tensors: the tensors of ResNet-50") for a in spread["assumptions"])
    assert spread["speedup_over_horovod"] == pytest.approx(1.0, abs=0.01)
    assert one["speedup_over_horovod"] > 1.1 and one["horovod_total_s"] > 1.1 * spread["horovod_total_s"]


def test_the_headline_compares_training_steps_and_says_where_compute_came_from(capsys):
    """The choice line gives both training steps and says the compute times were given; with none
    given it compares no steps: the exchanges' ratio only bounds the step's."""
    assert whatif.main(["--params", "126M", "--bandwidth", "1Gbit/s", "--device", "h100", "--forward-ms", "40",
                        "--backward-ms", "80"]) == 0
    choice = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("choice: "))
    out = json_of(capsys, "--params", "126M", "--bandwidth", "1Gbit/s", "--device", "h100", "--forward-ms", "40",
                  "--backward-ms", "80")
    assert out["compute_times"] == {"forward": "given", "backward": "given"}
    assert choice == (f"choice: {out['choice']}: a training step of {1e3 * out['plan']['total_s']:.3f} ms against "
                      f"stock Horovod's {1e3 * out['horovod_total_s']:.3f} ms, {out['speedup_over_horovod']:.2f}x its "
                      "speed (a step: forward 40 ms (given) + backward 80 ms (given) + the exchange's part after the "
                      "backward pass)")
    assert out["plan"]["total_s"] >= 0.12 and out["horovod_total_s"] >= 0.12
    assert whatif.main(["--params", "126M", "--bandwidth", "1Gbit/s", "--device", "h100"]) == 0
    text = capsys.readouterr().out
    choice = next(line for line in text.splitlines() if line.startswith("choice: "))
    assert "there is no training step to compare: a step gains less than" in choice and "its speed" not in choice
    assert "assumed a step: forward 0 ms (assumed: not given) + backward 0 ms (assumed: not given)" in text


def test_plot_data_equal_the_slow_paths_at_a_few_bandwidths(monkeypatch, rng):
    """--plot's curves (`_plot_data`, the search pricing buckets lazily) are, at bandwidths drawn
    from `PLOT_GBITS`, what `_prediction` gives there with every bucket of the search priced (the
    full table, as before the search became lazy)."""
    tensors = [(name, n) for name, n in reversed(whatif._spread(int(rng.integers(10**6, 10**8)), None)[0])]
    ready = whatif._ready_times([n for _, n in tensors], 0.06)
    net = cm.Network(5e-5, 1.25e9)
    cluster = cm.ClusterModel(8, net, net, cm.AffineCost(1e-4, float(rng.uniform(1e-10, 2e-9))))
    compressor = tfcomp.DRAGONN(0.001)
    fast = whatif._plot_data(tensors, ready, compressor, cluster, 0.03, 0.06, planning.COMPRESSION_MARGIN)
    assert all(len(ms) == len(whatif.PLOT_GBITS) == 61 for ms in fast.values())
    lazy = planning._best_partitions
    monkeypatch.setattr(planning, "_best_partitions", lambda *args: dict(lazy(*args).items()))  # every bucket priced
    for index in sorted(rng.choice(len(whatif.PLOT_GBITS), 4, replace=False)):
        slow_net = cm.Network(5e-5, whatif.PLOT_GBITS[index] * 1e9 / 8)
        slow, _ = whatif._prediction(tensors, ready, compressor, dataclasses.replace(
            cluster, allreduce=slow_net, allgather=slow_net), 0.03, 0.06, planning.COMPRESSION_MARGIN)
        assert fast["tfcomp plan"][index] == 1e3 * slow["plan"]["total_s"]
        assert fast["stock Horovod (overlapped)"][index] == 1e3 * slow["horovod_total_s"]
        assert [fast[f"one bucket, {row['name']}"][index] for row in slow["strategies"]] == [
            1e3 * row["total_s"] for row in slow["strategies"]]


def _transformer_tensors() -> list:
    """BERT-base's 199 tensors (110M elements): embeddings, 12 layers of attention and feed-forward
    kernels with their biases and layer norms, the pooler."""
    hidden, ffn = 768, 3072
    sizes = [30522 * hidden, 512 * hidden, 2 * hidden, hidden, hidden]
    for _ in range(12):
        sizes += [hidden * hidden, hidden] * 4 + [hidden, hidden, hidden * ffn, ffn, ffn * hidden, hidden, hidden,
                                                   hidden]
    return sizes + [hidden * hidden, hidden]


GRID_WORKERS = (2, 4, 8, 16, 64)
GRID_GBITS = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)


def test_no_compressing_plan_within_the_margin_over_a_grid(rng):
    """Models of four spreads (one giant tensor, ResNet-50, many small tensors, BERT-base), K from
    2 to 64, 100 Mbit/s to 100 Gbit/s, DRAGONN priced from the H100 table: where make_plan (with and
    without the step) or the what-if compresses, its predicted gain over all dense (priced apart, by
    a compressor forced dense and by stock Horovod's replay) exceeds the margin of the step; where
    compressing clearly pays (1 Gbit/s, the large models) it still compresses; and the margin turns
    some plans dense that compressed before."""
    from tfcomp import device_costs

    models = {"giant": [10**8], "resnet50": [n for _, n in whatif.resnet50_tensors()],
              "many_small": [int(n) for n in rng.integers(1000, 30000, 300)], "bert_base": _transformer_tensors()}
    forward, backward, margin = 0.03, 0.06, planning.COMPRESSION_MARGIN
    compressor, forced_dense = tfcomp.DRAGONN(0.001), tfcomp.DRAGONN(0.001, strategy="dense")
    turned_dense = 0
    for name, sizes in models.items():
        tensors = [(i, f"t{i}", n) for i, n in reversed(list(enumerate(sizes)))]
        ready = whatif._ready_times([n for _, _, n in tensors], backward)
        for workers in GRID_WORKERS:
            cost, _ = device_costs.bucket_cost(device_costs.MEASURED["h100"], compressor, workers)
            for gbits in GRID_GBITS:
                net = cm.Network(5e-5, gbits * 1e9 / 8)
                cluster = cm.ClusterModel(workers, net, net, cost)
                where = (name, workers, gbits)
                dense_end = planning.predicted_exchange_time(
                    planning.make_plan(tensors, forced_dense, cluster, ready_seconds=ready))
                step = forward + max(backward, dense_end)
                for step_seconds, of in ((None, dense_end), (step, step)):
                    plan = planning.make_plan(tensors, compressor, cluster, ready_seconds=ready,
                                              step_seconds=step_seconds)
                    if plan.compressed:
                        assert dense_end - planning.predicted_exchange_time(plan) > margin * of, where
                result, _ = whatif._prediction([(n, e) for _, n, e in tensors], ready, compressor, cluster, forward,
                                               backward, margin)
                assert result["dense_total_s"] == pytest.approx(result["horovod_total_s"], rel=1e-12), where
                if result["compresses"]:
                    assert result["horovod_total_s"] - result["plan"]["total_s"] > margin * result["horovod_total_s"]
                else:
                    assert result["plan"]["total_s"] == result["dense_total_s"], where
                    turned_dense += 0.0 < result["predicted_gain"] <= margin
                if gbits == 1.0 and name != "many_small" and workers >= 4:
                    assert result["compresses"] and plan.compressed, where
    assert turned_dense > 0
