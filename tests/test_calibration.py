"""Calibration pieces that run in one process: the network fit, the compression pipeline it times,
the cache. (Calibration across ranks, with one rank's figures perturbed, is in test_multirank.py.)"""

import numpy as np
import pytest
import tensorflow as tf

import horovod.tensorflow as hvd

import tfcomp
from tfcomp import calibration, planning
from tfcomp import cost_model as cm
from tfcomp.collectives import LocalCollectives


@pytest.mark.parametrize("workers", [2, 3, 8])
def test_network_fit_recovers_latency_and_bandwidth(rng, workers):
    latency, bandwidth = float(rng.uniform(1e-6, 1e-4)), float(rng.uniform(1e7, 1e9))
    net = cm.Network(latency, bandwidth)
    size = 4.0 * 2**22
    tiny, large = cm.ring_allreduce(4, workers, net), cm.ring_allreduce(size, workers, net)
    fitted = calibration._fit_network(tiny, large, size, 2 * (workers - 1), 1.0 / workers)
    assert fitted.latency == pytest.approx(latency, rel=1e-3)
    assert fitted.bandwidth == pytest.approx(bandwidth, rel=1e-3)
    tiny, large = cm.ring_allgather(4, workers, net), cm.ring_allgather(size, workers, net)
    fitted = calibration._fit_network(tiny, large, size, workers - 1, 1.0)
    assert fitted.bandwidth == pytest.approx(bandwidth, rel=1e-3)


def test_network_fit_is_not_fooled_by_a_slow_tiny_collective():
    # Noise made the tiny allreduce take 9 ms and the large one 10 ms: half of it counts as transfer.
    fitted = calibration._fit_network(0.009, 0.010, 4e6, 2, 0.5)
    assert fitted.bandwidth == pytest.approx(2 * 0.5 * 4e6 / 0.005)
    # ... or longer than the large one: half of the tiny one's time counts as transfer.
    fitted = calibration._fit_network(0.012, 0.010, 4e6, 2, 0.5)
    assert fitted.latency == pytest.approx(0.006) and fitted.bandwidth == pytest.approx(2 * 0.5 * 4e6 / 0.006)


@pytest.mark.parametrize("tiny, large", [(-1e-5, -2e-5), (0.0, 0.0), (-1e-4, 3e-3), (2e-3, -1e-4)])
def test_network_fit_of_figures_made_negative_by_noise_is_a_valid_network(tiny, large):
    """Per-tensor costs are subtracted from the measured times; noise can leave them negative."""
    fitted = calibration._fit_network(tiny, large, 4e6, 2, 0.5)
    assert fitted.latency >= 0 and np.isfinite(fitted.bandwidth) and fitted.bandwidth > 0


@pytest.mark.parametrize("make", [lambda: tfcomp.DRAGONN(0.05), lambda: tfcomp.TopK(0.05), lambda: tfcomp.QSGD(4),
                                  lambda: tfcomp.RandomK(0.05)], ids=["DRAGONN", "TopK", "QSGD", "RandomK"])
def test_local_collectives_give_k_copies_of_what_this_worker_sent(rng, make):
    """What calibration times: the exchange's own bucket work, with collectives that deliver this
    worker's payload K times (allgather) or once (allreduce)."""
    compressor = make()
    size, workers = 5000, 3
    plan = planning.per_tensor_plan([(0, "v", size)], compressor_with_min_elements_1(compressor),
                                    cm.ClusterModel.unpriced(workers))
    exchange = tfcomp.GradientExchange(compressor, op=hvd.Sum, plan=plan, collectives=LocalCollectives(workers))
    variable = tf.Variable(tf.zeros([size]))
    grad = rng.standard_normal(size).astype(np.float32)
    total, = exchange([tf.constant(grad)], [variable])
    sent = grad - (exchange.memory.residuals[0].numpy() if compressor.error_feedback else 0)
    copies = 1 if compressor.collective == "allreduce" else workers
    if compressor.error_feedback:
        np.testing.assert_allclose(total.numpy(), copies * sent, rtol=1e-5, atol=1e-5)
        assert 0 < np.count_nonzero(sent) < size
    else:  # QSGD: unbiased levels of the norm, K copies of the same quantised tensor
        assert np.all(np.abs(total.numpy()) <= copies * np.linalg.norm(grad) * (1 + 1e-6))


def compressor_with_min_elements_1(compressor):
    import copy

    forced = copy.copy(compressor)
    forced.min_elements = 1
    return forced


@pytest.mark.parametrize("spell", [3.0, 0.2])
def test_a_block_far_from_the_others_is_left_out_and_the_rest_pooled_in_round_order(rng, spell):
    """A slow spell (3x) or an odd fast block (0.2x) is dropped; of three like blocks, one end."""
    blocks = [{"a": rng.uniform(1.0, 1.1, 5), "b": rng.uniform(2.0, 2.2, 5)} for _ in range(3)]
    odd = int(rng.integers(3))
    blocks[odd] = {name: v * spell for name, v in blocks[odd].items()}
    pooled = calibration._pool_without_outlier(blocks)
    others = [b for i, b in enumerate(blocks) if i != odd]
    assert set(pooled) == {"a", "b"} and len(pooled["a"]) == 10
    for name in pooled:  # the kept blocks' rounds, each block's in order (pairs stay pairs)
        assert sorted(pooled[name]) == sorted(np.concatenate([b[name] for b in others]))
        halves = (list(pooled[name][:5]), list(pooled[name][5:]))
        assert all(list(b[name]) in halves for b in others)
    alike = [{"a": np.full(3, x)} for x in (1.0, 1.5, 3.0)]
    assert sorted(calibration._pool_without_outlier(alike)["a"]) == [1.0] * 3 + [1.5] * 3


@pytest.mark.parametrize("tensor_elements", [(), (4096, 64) * 20], ids=["unknown tensors", "own merge probe"])
def test_measured_compression_is_a_positive_affine_fit(tensor_elements):
    figures = calibration.measure_compression(tfcomp.DRAGONN(0.01), 2, 2**16, tensor_elements=tensor_elements)
    fit = figures.encode_decode
    assert fit.c1 > 0 and fit.c0 >= 0 and figures.per_tensor >= 0 and figures.merge_per_element >= 0
    assert figures.fixed >= 0
    assert fit(2**16) > fit(2**12)
    assert figures.explained  # nothing communicated, nothing subtracted
    applied = figures.apply(cm.ClusterModel.unpriced(2))
    assert (applied.encode_decode, applied.compression_per_tensor, applied.merge_per_element,
            applied.compression_fixed) == tuple(figures)[:4]


def test_compression_is_priced_at_whole_times_when_the_network_cannot_explain_them():
    # A network measured in a slow spell: its modelled communication (over 1 s a collective) exceeds
    # what the probes took, so subtracting it would price compression at 0.
    slow = cm.Network(1.0, 1e6)
    network = cm.ClusterModel(2, slow, slow, cm.AffineCost(0.0, 0.0))
    figures = calibration.measure_compression(tfcomp.DRAGONN(0.01), 2, 2**16, network, LocalCollectives(2))
    assert not figures.explained
    fit = figures.encode_decode
    assert fit.c1 > 0 and fit(2**20) + figures.fixed > 0 and figures.fixed < 1.0  # the probes' own times, not 0


MERGED_FALLBACK = calibration._merge_probe(2**20)  # 2^20 elements as 8 tensors


def probe_times(rng, seconds_of_size, merged=MERGED_FALLBACK, merged_extra=0.0, rounds=10):
    """Synthetic probe times {name: [rounds]} for the probes of a largest size of 2^20 elements
    (each `seconds_of_size` of its elements, +-2 %), with the merge probe of tensors `merged`
    taking `merged_extra` seconds more than one tensor of their total."""
    sizes = sorted({2**12, 2**16, 2**20, sum(merged)})
    elements = {**{n: n for n in sizes}, "buckets": 8 * 2**12, "many": 2**16, "merged": sum(merged)}
    times = {name: seconds_of_size(n) * rng.uniform(0.98, 1.02, rounds) for name, n in elements.items()}
    times["merged"] = times[sum(merged)] + merged_extra
    return sizes, times


def test_whole_times_that_do_not_grow_with_size_still_price_every_element(rng):
    # A machine so loaded that every probe took about 23 ms whatever its size (seen in CI; here
    # the larger ones a little less, so that the fitted slope is 0).
    sizes, times = probe_times(rng, lambda n: 0.024 - 1e-9 * n)
    figures = calibration._compression_figures(times, sizes, 2**20, MERGED_FALLBACK, explained=False)
    largest = float(np.median(times[2**20]))
    assert figures.encode_decode.c1 == pytest.approx(largest / 2**20)
    assert figures.encode_decode(2**20) + figures.fixed >= largest  # an upper bound
    # Explained times are fitted as they are: a slope of 0 is what the caller rejects.
    explained = calibration._compression_figures(times, sizes, 2**20, MERGED_FALLBACK, explained=True)
    assert explained.encode_decode.c1 == 0.0
    # Times that do grow keep their fitted slope.
    sizes, times = probe_times(rng, lambda n: 0.002 + 1e-8 * n)
    grown = calibration._compression_figures(times, sizes, 2**20, MERGED_FALLBACK, explained=False)
    assert grown.encode_decode.c1 == pytest.approx(1e-8, rel=0.1)


def test_merge_probe_is_the_gradients_own_tensors_where_they_fit():
    own = [16384, 128] * 41  # many_small of benchmarks/network_worker.py: 82 tensors
    assert calibration._merge_probe(2**20, own) == tuple(own)
    assert calibration._merge_probe(2**20, np.array(own, dtype=np.int64)) == tuple(own)
    # One tensor, more than 512, fewer than 2^16 or more than 2^22 elements, an empty one: the
    # largest size in 8.
    for other in ([], [2**20], [128] * 513, [1000] * 60, [2**20] * 5, [0, 70000, 70000]):
        assert calibration._merge_probe(2**20, other) == MERGED_FALLBACK
    assert len(MERGED_FALLBACK) == 8 and sum(MERGED_FALLBACK) == 2**20
    assert sum(calibration._merge_probe(2**22 - 8)) == 2**22 - 8


@pytest.mark.parametrize("tensors", [[16384, 128] * 41, [50000, 70000, 30000]])
def test_merge_cost_is_what_the_own_bucket_adds_beyond_its_per_tensor_costs(rng, tensors):
    per_tensor, merge = float(rng.uniform(1e-5, 3e-5)), float(rng.uniform(1e-9, 4e-9))
    total = sum(tensors)
    extra = (len(tensors) - 1) * per_tensor + merge * total
    sizes, times = probe_times(rng, lambda n: 0.001 + 1e-8 * n, tuple(tensors), extra)
    times["many"] = times[2**16] + 63 * per_tensor  # the per-tensor probe: 64 tensors against one
    figures = calibration._compression_figures(times, sizes, 2**20, tuple(tensors), explained=True)
    assert figures.per_tensor == pytest.approx(per_tensor)
    assert figures.merge_per_element == pytest.approx(merge)


def global_process_set():
    import horovod.tensorflow as hvd

    hvd.init()
    return hvd.global_process_set


def test_one_worker_needs_no_measurement():
    model = calibration.calibrate(tfcomp.DRAGONN(), global_process_set())
    assert model.workers == 1 and model.encode_decode == cm.AffineCost(0.0, 0.0)
    assert cm.ring_allreduce(1e9, 1, model.allreduce) == 0.0


@pytest.mark.parametrize("kwargs, message", [({"max_elements": 0}, "max_elements must be"),
                                             ({"tensor_elements": [4096, -1]}, "tensor_elements must be")])
def test_bad_calibration_arguments_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        calibration.calibrate(tfcomp.DRAGONN(), global_process_set(), **kwargs)


def test_cache_round_trip_and_keys(tmp_path, monkeypatch):
    path = str(tmp_path / "sub" / "calibration.json")
    model = cm.ClusterModel(4, cm.Network(1e-4, 1e9), cm.Network(2e-4, 2e9), cm.AffineCost(1e-4, 3e-9))
    calibration._write_cache(path, "key-a", model)
    calibration._write_cache(path, "key-b", cm.ClusterModel(2, model.allreduce, model.allgather, model.encode_decode))
    assert calibration._read_cache(path, "key-a") == model
    assert calibration._read_cache(path, "key-c") is None
    (tmp_path / "broken.json").write_text("{not json")
    assert calibration._read_cache(str(tmp_path / "broken.json"), "key-a") is None
    ps = global_process_set()

    def key(elements, ratio=0.01):
        return calibration.cache_key(tfcomp.DRAGONN(ratio), ps, elements)

    assert key(2**20) == key(2**20)
    assert key(2**20) != key(2**20, ratio=0.02)
    assert key(2**20) != key(2**20 + 4)  # a probe's size changes
    # Below 1 MiB and above 2^25 elements the probes are the same size.
    assert key(10) == key(2**17)
    assert key(2**25) == key(2**30)
    # The merge probe: the gradients' own tensors where it takes them, else the size alone counts.
    own = [16384, 128] * 41
    assert calibration.cache_key(tfcomp.DRAGONN(0.01), ps, sum(own), own) != key(sum(own))
    assert calibration.cache_key(tfcomp.DRAGONN(0.01), ps, 2**23, [2**21] * 4) == key(2**23)
    monkeypatch.setenv(calibration.CACHE_ENV, "none")
    assert calibration._cache_path() is None
    monkeypatch.setenv(calibration.CACHE_ENV, path)
    assert calibration._cache_path() == path
