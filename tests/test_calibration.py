"""Calibration pieces that run in one process: the network fit, the compression pipeline it times,
the cache. (Calibration across ranks, with one rank's figures perturbed, is in test_multirank.py.)"""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

import horovod.tensorflow as hvd

import tfcomp
from tests import numpy_reference
from tfcomp import calibration, planning
from tfcomp import cost_model as cm
from tfcomp.collectives import LocalCollectives


@pytest.mark.parametrize("workers", [2, 3, 8])
def test_network_fit_recovers_latency_and_bandwidth(rng, workers):
    latency, bandwidth = float(rng.uniform(1e-6, 1e-4)), float(rng.uniform(1e7, 1e9))
    net = cm.Network(latency, bandwidth)
    size = 4.0 * 2**22
    tiny, large = cm.ring_allreduce(4, workers, net), cm.ring_allreduce(size, workers, net)
    fitted = calibration.network._fit_network(tiny, large, size, 2 * (workers - 1), 1.0 / workers)
    assert fitted.latency == pytest.approx(latency, rel=1e-3)
    assert fitted.bandwidth == pytest.approx(bandwidth, rel=1e-3)
    tiny, large = cm.ring_allgather(4, workers, net), cm.ring_allgather(size, workers, net)
    fitted = calibration.network._fit_network(tiny, large, size, workers - 1, 1.0)
    assert fitted.bandwidth == pytest.approx(bandwidth, rel=1e-3)


def test_network_fit_is_not_fooled_by_a_slow_tiny_collective():
    # Noise made the tiny allreduce take 9 ms and the large one 10 ms: half of it counts as transfer.
    fitted = calibration.network._fit_network(0.009, 0.010, 4e6, 2, 0.5)
    assert fitted.bandwidth == pytest.approx(2 * 0.5 * 4e6 / 0.005)
    # ... or longer than the large one: half of the tiny one's time counts as transfer.
    fitted = calibration.network._fit_network(0.012, 0.010, 4e6, 2, 0.5)
    assert fitted.latency == pytest.approx(0.006) and fitted.bandwidth == pytest.approx(2 * 0.5 * 4e6 / 0.006)


@pytest.mark.parametrize("tiny, large", [(-1e-5, -2e-5), (0.0, 0.0), (-1e-4, 3e-3), (2e-3, -1e-4)])
def test_network_fit_of_figures_made_negative_by_noise_is_a_valid_network(tiny, large):
    """Per-tensor costs are subtracted from the measured times; noise can leave them negative."""
    fitted = calibration.network._fit_network(tiny, large, 4e6, 2, 0.5)
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


@pytest.mark.parametrize("union_limit", [0.5, None])
def test_local_collectives_run_the_partitioned_exchange(rng, union_limit):
    """With stand-ins, rank 0's share comes back from K senders to the owner (K times each sum)
    and K times from the allgather: K^2 times this worker's pairs of owner 0, at most its budget."""
    compressor = tfcomp.TopK(0.05, strategy="partitioned", union_limit=union_limit, min_elements=1)
    size, workers = 5000, 4
    plan = planning.per_tensor_plan([(0, "v", size)], compressor, cm.ClusterModel.unpriced(workers))
    exchange = tfcomp.GradientExchange(compressor, op=hvd.Sum, plan=plan, collectives=LocalCollectives(workers))
    variable = tf.Variable(tf.zeros([size]))
    grad = rng.standard_normal(size).astype(np.float32)
    total, = exchange([tf.constant(grad)], [variable])
    sent = grad - exchange.memory.residuals[0].numpy()
    np.testing.assert_array_equal(total.numpy(), workers * workers * sent)
    chosen = np.flatnonzero(sent)
    assert np.all(numpy_reference.hash_owner(chosen, workers) == 0)
    budget = compressor.owner_budget(compressor.payload_length(size), workers)
    assert 0 < chosen.size <= (budget or size)


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
    pooled = calibration.timing._pool_without_outlier(blocks)
    others = [b for i, b in enumerate(blocks) if i != odd]
    assert set(pooled) == {"a", "b"} and len(pooled["a"]) == 10
    for name in pooled:  # the kept blocks' rounds, each block's in order (pairs stay pairs)
        assert sorted(pooled[name]) == sorted(np.concatenate([b[name] for b in others]))
        halves = (list(pooled[name][:5]), list(pooled[name][5:]))
        assert all(list(b[name]) in halves for b in others)
    alike = [{"a": np.full(3, x)} for x in (1.0, 1.5, 3.0)]
    assert sorted(calibration.timing._pool_without_outlier(alike)["a"]) == [1.0] * 3 + [1.5] * 3


@pytest.mark.parametrize("tensor_elements", [(), (4096, 64) * 20], ids=["unknown tensors", "own merge probe"])
def test_measured_compression_is_a_positive_affine_fit(tensor_elements):
    figures = calibration.measure_compression(tfcomp.DRAGONN(0.01), 2, 2**16, tensor_elements=tensor_elements)
    fit = figures.encode_decode
    assert fit.c1 > 0 and fit.c0 >= 0 and figures.per_tensor >= 0 and figures.merge_per_element >= 0
    assert figures.fixed >= 0
    assert fit(2**16) > fit(2**12)
    assert figures.fitted
    # The partitioned and AR-Topk probes ran: a difference of medians of timings, exactly 0 only if
    # not measured (its sign and size are the machine's).
    assert figures.partitioned_per_slot != 0.0 and figures.artopk_per_slot != 0.0
    applied = figures.apply(cm.ClusterModel.unpriced(2))
    assert (applied.encode_decode, applied.compression_per_tensor, applied.merge_per_element,
            applied.compression_fixed) == tuple(figures)[:4]


def test_lower_bounds_from_the_smallest_and_largest_probe(rng):
    small, largest = 2**12, 2**20
    fixed, slope = float(rng.uniform(1e-3, 3e-3)), float(rng.uniform(2e-9, 9e-9))
    times = {n: fixed + slope * n + rng.uniform(-1e-6, 1e-6, 9) for n in (small, largest)}
    lower = calibration.compression._lower_bound_figures(times, small, largest)
    assert lower.encode_decode.c1 == pytest.approx(slope, rel=0.01)
    assert lower.fixed == pytest.approx(fixed, rel=0.01)
    assert (lower.encode_decode.c0, lower.per_tensor, lower.merge_per_element) == (0.0, 0.0, 0.0)
    assert lower.fitted and not lower.complete
    # Times that do not grow with the size: not fitted (calibration then measures every probe).
    flat = {small: times[largest], largest: times[small]}
    assert not calibration.compression._lower_bound_figures(flat, small, largest).fitted


def _pieces_and_value(pieces) -> tuple:
    """(how many pieces the generator yielded, what it returned)."""
    count = 0
    while True:
        try:
            next(pieces)
        except StopIteration as done:
            return count, done.value
        count += 1


def test_timed_blocks_come_in_pieces_of_first_calls_and_rounds():
    calls = []
    first = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    second = {"c": lambda: calls.append("c")}
    count, times = _pieces_and_value(
        calibration.timing.without_outlying_block([(first, 2), (second, 3)], synchronise=None, warmup=2, blocks=3))
    assert count == 3 + 3 * (2 + 3)  # a piece per run's untimed calls, then one per round of a set's block
    assert calls[:6] == ["a", "a", "b", "b", "c", "c"]
    assert calls[6:10] == ["a", "b", "a", "b"] and calls[10:13] == ["c"] * 3  # a block of each set in turn
    assert {name: len(t) for name, t in times.items()} == {"a": 4, "b": 4, "c": 6}  # 2 of 3 blocks kept


def test_compression_measured_in_pieces_gives_complete_figures():
    compressor = tfcomp.DRAGONN(0.01)
    count, figures = _pieces_and_value(calibration.compression_pieces(compressor, 2, 2**16))
    probes = 8  # 2^12, 2^16, 2^20 (the largest, and the merge probe's total), buckets, many, merged, partitioned, artopk
    assert count >= 2 * probes + 3 * calibration.compression._SHORT_PROBE_ROUNDS  # each made, called first, then rounds
    assert figures.complete and figures.encode_decode.c1 > 0.0


def test_calibration_pieces_check_their_arguments_before_any_piece():
    with pytest.raises(ValueError, match="max_elements must be"):
        calibration.calibration_pieces(tfcomp.DRAGONN(), global_process_set(), 0)


@pytest.mark.parametrize("answer", [False, True], ids=["cannot pay: stops", "could pay: measures all"])
def test_compression_measured_in_two_stages(monkeypatch, answer):
    timed, asked = [], []
    measure = calibration.timing.without_outlying_block

    def recording(sets, synchronise, **kwargs):
        timed.append(sorted(str(name) for runs, _ in sets for name in runs))
        return measure(sets, synchronise, **kwargs)

    def could_pay(lower):
        asked.append(lower)
        return answer

    monkeypatch.setattr(calibration.compression, "without_outlying_block", recording)
    figures = calibration.measure_compression(tfcomp.DRAGONN(0.01), 2, 2**16, could_pay=could_pay)
    largest = calibration.compression.largest_compression_probe(2**16)
    assert timed[0] == sorted([str(2**12), str(largest)]) and len(asked) == 1 and not asked[0].complete
    if answer:
        assert len(timed) == 2 and {"buckets", "many", "merged"} <= set(timed[1]) and figures.complete
    else:
        assert len(timed) == 1 and figures == asked[0]


def test_probes_compress_with_the_costs_settings_only(monkeypatch):
    """A compressor with warm-up steps is timed compressing (its warm-up would send the probes
    dense), whatever its planning settings; the compressor itself is left as it was."""
    probed = []
    original = calibration.compression._exchange_probe
    monkeypatch.setattr(calibration.compression, "_exchange_probe",
                        lambda compressor, *args: probed.append(compressor) or original(compressor, *args))
    compressor = tfcomp.DGC(0.01, warmup_steps=10**6, strategy="allgather", min_elements=2**20, momentum=0.9)
    calibration.measure_compression(compressor, 2, 2**16)
    assert probed and all(p.warmup_steps == 0 and p.strategy is None
                      and p.min_elements == tfcomp.compressors.DEFAULT_MIN_ELEMENTS for p in probed)
    assert all(p.momentum == 0.9 and p.ratio == 0.01 and type(p) is tfcomp.DGC for p in probed)
    assert (compressor.warmup_steps, compressor.strategy, compressor.min_elements) == (10**6, "allgather", 2**20)


MERGED_FALLBACK = calibration.compression.merge_probe(2**20)  # 2^20 elements as 8 tensors


SLOTS = 2**20 // 100  # the largest probe's payload slots (DRAGONN 0.01)


def probe_times(rng, seconds_of_size, merged=MERGED_FALLBACK, merged_extra=0.0, rounds=10):
    """Synthetic probe times {name: [rounds]} for the probes of a largest size of 2^20 elements
    (each `seconds_of_size` of its elements, +-2 %), with the merge probe of tensors `merged`
    taking `merged_extra` seconds more than one tensor of their total."""
    sizes = sorted({2**12, 2**16, 2**20, sum(merged)})
    elements = {**{n: n for n in sizes}, "buckets": calibration.compression._BUCKETS_PROBE_BUCKETS * 2**12, "many": 2**16,
                "merged": sum(merged)}
    times = {name: seconds_of_size(n) * rng.uniform(0.98, 1.02, rounds) for name, n in elements.items()}
    times["merged"] = times[sum(merged)] + merged_extra
    return sizes, times


def test_whole_times_that_do_not_grow_with_size_still_price_every_element(rng):
    # A machine so loaded that every probe took about 23 ms whatever its size (seen in CI; here
    # the larger ones a little less, so that the fitted slope is 0).
    sizes, times = probe_times(rng, lambda n: 0.024 - 1e-9 * n)
    figures = calibration.compression._compression_figures(times, sizes, 2**20, MERGED_FALLBACK, slots=SLOTS)
    largest = float(np.median(times[2**20]))
    assert figures.encode_decode.c1 == pytest.approx(largest / 2**20) and not figures.fitted
    assert figures.encode_decode(2**20) + figures.fixed >= largest  # an upper bound
    # Times that do grow keep their fitted slope.
    sizes, times = probe_times(rng, lambda n: 0.002 + 1e-8 * n)
    grown = calibration.compression._compression_figures(times, sizes, 2**20, MERGED_FALLBACK, slots=SLOTS)
    assert grown.encode_decode.c1 == pytest.approx(1e-8, rel=0.1) and grown.fitted


def test_merge_probe_is_the_gradients_own_tensors_where_they_fit():
    own = [16384, 128] * 41  # many_small of benchmarks/network_worker.py: 82 tensors
    assert calibration.compression.merge_probe(2**20, own) == tuple(own)
    assert calibration.compression.merge_probe(2**20, np.array(own, dtype=np.int64)) == tuple(own)
    # One tensor, more than 512, fewer than 2^16 or more than 2^22 elements, an empty one: the
    # largest size in 8.
    for other in ([], [2**20], [128] * 513, [1000] * 60, [2**20] * 5, [0, 70000, 70000]):
        assert calibration.compression.merge_probe(2**20, other) == MERGED_FALLBACK
    assert len(MERGED_FALLBACK) == 8 and sum(MERGED_FALLBACK) == 2**20
    assert sum(calibration.compression.merge_probe(2**22 - 8)) == 2**22 - 8


@pytest.mark.parametrize("tensors", [[16384, 128] * 41, [50000, 70000, 30000]])
def test_merge_cost_is_what_the_own_bucket_adds_beyond_its_per_tensor_costs(rng, tensors):
    per_tensor, merge = float(rng.uniform(1e-5, 3e-5)), float(rng.uniform(1e-9, 4e-9))
    total = sum(tensors)
    extra = (len(tensors) - 1) * per_tensor + merge * total
    sizes, times = probe_times(rng, lambda n: 0.001 + 1e-8 * n, tuple(tensors), extra)
    tensors_in_probe = calibration.compression._PER_TENSOR_PROBE_TENSORS  # the per-tensor probe: that many tensors against one
    times["many"] = times[2**16] + (tensors_in_probe - 1) * per_tensor
    figures = calibration.compression._compression_figures(times, sizes, 2**20, tuple(tensors), slots=SLOTS)
    assert figures.per_tensor == pytest.approx(per_tensor)
    assert figures.merge_per_element == pytest.approx(merge)


def test_other_strategies_are_priced_per_slot_by_what_they_add_to_the_allgathers_probe(rng):
    """partitioned and artopk: the median, round by round, of their probe's time less the
    allgather's at the largest size, per payload slot; signed (a strategy may save work); 0
    where they were not probed (compressors without them)."""
    sizes, times = probe_times(rng, lambda n: 0.001 + 1e-8 * n)
    assert calibration.compression._compression_figures(times, sizes, 2**20, MERGED_FALLBACK,
                                            slots=SLOTS)[-2:] == (0.0, 0.0)
    added, saved = float(rng.uniform(1e-4, 1e-2)), float(rng.uniform(1e-4, 1e-3))
    times["partitioned"] = times[2**20] + added * rng.uniform(0.9, 1.1, times[2**20].size)
    times["artopk"] = times[2**20] - saved
    figures = calibration.compression._compression_figures(times, sizes, 2**20, MERGED_FALLBACK, slots=SLOTS)
    assert figures.partitioned_per_slot == pytest.approx(added / SLOTS, rel=0.1)
    assert figures.artopk_per_slot == pytest.approx(-saved / SLOTS)
    model = figures.apply(cm.ClusterModel.unpriced(4))
    assert (model.partitioned_per_slot, model.artopk_per_slot) == (figures.partitioned_per_slot, figures.artopk_per_slot)
    assert calibration.CompressionFigures.of(model) == figures


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
    path = str(tmp_path / "sub" / "calibration.cache.json")
    model = cm.ClusterModel(4, cm.Network(1e-4, 1e9), cm.Network(2e-4, 2e9), cm.AffineCost(1e-4, 3e-9))
    calibration.cache.write_cache(path, "key-a", model)
    calibration.cache.write_cache(path, "key-b", cm.ClusterModel(2, model.allreduce, model.allgather, model.encode_decode),
                             complete=False)
    assert calibration.cache.read_cache(path, "key-b")[1] is False
    assert calibration.cache.read_cache(path, "key-a") == (model, True)
    assert calibration.cache.read_cache(path, "key-c") is None
    ps = global_process_set()

    def key(elements, ratio=0.01):
        return calibration.cache_key(tfcomp.DRAGONN(ratio), ps, elements)

    assert key(2**20) == key(2**20)
    assert key(2**20) != key(2**20, ratio=0.02)
    # Settings that choose buckets, not what compressing costs, share the figures; the costs' own do not.
    unrelated = tfcomp.DRAGONN(0.01, warmup_steps=50, min_elements=7, planning="off", strategy="artopk",
                               artopk_owner="var")
    assert calibration.cache_key(unrelated, ps, 2**20) == key(2**20)
    for related in (tfcomp.DRAGONN(0.01, num_samples=4096), tfcomp.DRAGONN(0.01, momentum=0.9),
                    tfcomp.DRAGONN(0.01, error_feedback=False), tfcomp.DGC(0.01)):
        assert calibration.cache_key(related, ps, 2**20) != key(2**20), related
    assert key(2**20) != key(2**20 + 4)  # a probe's size changes
    # Below 1 MiB and above 2^25 elements the probes are the same size.
    assert key(10) == key(2**17)
    assert key(2**25) == key(2**30)
    # The merge probe: the gradients' own tensors where it takes them, else the size alone counts.
    own = [16384, 128] * 41
    assert calibration.cache_key(tfcomp.DRAGONN(0.01), ps, sum(own), own) != key(sum(own))
    assert calibration.cache_key(tfcomp.DRAGONN(0.01), ps, 2**23, [2**21] * 4) == key(2**23)
    # The CPU allocator: malloc page-faults large tensors on every step, BFC does not.
    monkeypatch.setenv("TF_CPU_ALLOCATOR_USE_BFC", "true")
    with_bfc = key(2**20)
    assert calibration.cpu_allocator() == "BFC"
    monkeypatch.setenv("TF_CPU_ALLOCATOR_USE_BFC", "false")
    assert calibration.cpu_allocator() == "malloc" and key(2**20) != with_bfc
    monkeypatch.delenv("TF_CPU_ALLOCATOR_USE_BFC")
    assert calibration.cpu_allocator() == "malloc" and key(2**20) != with_bfc
    monkeypatch.setenv(calibration.CACHE_ENV, "none")
    assert calibration.cache.cache_path() is None
    monkeypatch.setenv(calibration.CACHE_ENV, path)
    assert calibration.cache.cache_path() == path


def random_model(rng, workers=2):
    return cm.ClusterModel(workers, cm.Network(float(rng.uniform(1e-6, 1e-3)), float(rng.uniform(1e7, 1e10))),
                           cm.Network(float(rng.uniform(1e-6, 1e-3)), float(rng.uniform(1e7, 1e10))),
                           cm.AffineCost(float(rng.uniform(0, 1e-3)), float(rng.uniform(0, 1e-8))),
                           float(rng.uniform(0, 1e-4)))


def cache_file(entries):
    return json.dumps({"format": calibration.cache._CACHE_FORMAT, "version": calibration.cache._CACHE_VERSION, "entries": entries})


def entry_of(figures):
    return {"figures": figures, "host": "h", "time": 0.0}


GOOD = random_model(np.random.default_rng(0)).to_list()


def with_figure(position, text):
    """A cache whose entry "key" has GOOD's figures but the one at `position` written as `text` (JSON)."""
    figures = list(GOOD)
    figures[position] = "__value__"
    return cache_file({"key": entry_of(figures)}).replace('"__value__"', text)


# Files that are not a usable cache as a whole (backed up as <path>.bad when rewritten) ...
BAD_FILES = {
    "empty": "",
    "not JSON": "{not json",
    "truncated": cache_file({"key": entry_of(GOOD)})[:-20],
    "binary": "\x00\xff\xfe garbage",
    "array": "[1, 2, 3]",
    "string": '"calibration"',
    "null": "null",
    "nested too deep": "[" * 100_000,
    "old flat format": json.dumps({"key": entry_of(GOOD)}),
    "another format": json.dumps({"format": "something else", "version": 2, "entries": {}}),
    "another version": json.dumps({"format": calibration.cache._CACHE_FORMAT, "version": 99, "entries": {}}),
    "version true": json.dumps({"format": calibration.cache._CACHE_FORMAT, "version": True, "entries": {}}),
    "entries an array": json.dumps({"format": calibration.cache._CACHE_FORMAT, "version": 2, "entries": [1, 2]}),
}
# ... and files whose entry for the key is unusable (the entry is replaced, the file kept).
BAD_ENTRIES = {
    "entry a string": cache_file({"key": "figures"}),
    "entry an array": cache_file({"key": GOOD}),
    "no figures": cache_file({"key": {"host": "h"}}),
    "figures a string": cache_file({"key": entry_of("1,2,3")}),
    "too few figures": cache_file({"key": entry_of(GOOD[:5])}),
    "NaN latency": with_figure(1, "NaN"),
    "Infinity bandwidth": with_figure(2, "Infinity"),
    "1e308 latency": with_figure(3, "1e308"),
    "1e999 c0": with_figure(5, "1e999"),
    "negative c1": with_figure(6, "-1e-9"),
    "huge integer per_tensor": with_figure(7, str(10**400)),
    "a string figure": with_figure(8, '"0.001"'),
    "null figure": with_figure(9, "null"),
    "0 workers": with_figure(0, "0"),
    "2.5 workers": with_figure(0, "2.5"),
    "huge integer workers": with_figure(0, str(10**400)),
    "wrong worker count": with_figure(0, "3"),
}


@pytest.mark.parametrize("content", list(BAD_FILES.values()) + list(BAD_ENTRIES.values()),
                         ids=list(BAD_FILES) + list(BAD_ENTRIES))
def test_an_unusable_cache_is_reported_in_one_line_ignored_and_rewritten(rng, tmp_path, caplog, content):
    path = tmp_path / "calibration.cache.json"
    path.write_bytes(content.encode("utf-8", "surrogateescape") if "\x00" not in content else b"\x00\xff\xfe{")
    old = path.read_bytes()
    assert calibration.cache.read_cache(str(path), "key", workers=2) is None
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "\n" not in messages[0], messages
    assert messages[0].startswith(f"tfcomp: calibration cache {path}: ") and "measuring again" in messages[0], messages
    caplog.clear()
    model = random_model(rng)
    calibration.cache.write_cache(str(path), "key", model)
    assert calibration.cache.read_cache(str(path), "key", workers=2) == (model, True)
    assert caplog.text == ""
    whole_file = content in BAD_FILES.values()
    assert os.path.exists(f"{path}.bad") == whole_file
    if whole_file:
        assert open(f"{path}.bad", "rb").read() == old  # nothing lost
    assert sorted(os.listdir(tmp_path)) == sorted(["calibration.cache.json"] + (["calibration.cache.json.bad"] if whole_file else []))


def test_absurd_figures_are_named_in_the_report(tmp_path, caplog):
    path = tmp_path / "calibration.cache.json"
    path.write_text(BAD_ENTRIES["1e308 latency"])
    assert calibration.cache.read_cache(str(path), "key", workers=2) is None
    assert "entry key: ClusterModel.allgather.latency must be a finite number of seconds in [0, 3600], got 1e+308" in (
        caplog.text)
    path.write_text(BAD_ENTRIES["wrong worker count"])
    assert calibration.cache.read_cache(str(path), "key", workers=2) is None
    assert "entry key: has figures for 3 workers, this job has 2" in caplog.text
    path.write_text(BAD_FILES["array"])
    assert calibration.cache.read_cache(str(path), "key", workers=2) is None
    assert "holds a JSON array, not a cache object" in caplog.text


def test_a_missing_file_or_key_is_silent(tmp_path, caplog, rng):
    path = str(tmp_path / "calibration.cache.json")
    assert calibration.cache.read_cache(path, "key", workers=2) is None
    calibration.cache.write_cache(path, "other", random_model(rng))
    assert calibration.cache.read_cache(path, "key", workers=2) is None
    assert caplog.text == ""


def test_rewriting_keeps_the_other_usable_entries_and_drops_unusable_ones(tmp_path, rng):
    path = tmp_path / "calibration.cache.json"
    kept, ours = random_model(rng, workers=4), random_model(rng)
    path.write_text(cache_file({"kept": entry_of(kept.to_list()), "nan": entry_of([float("nan")] * 11),
                                "string": "x", "key": entry_of([0.0] * 11)}))
    calibration.cache.write_cache(str(path), "key", ours)
    content = json.loads(path.read_text())
    assert set(content["entries"]) == {"kept", "key"}
    assert calibration.cache.read_cache(str(path), "kept", workers=4) == (kept, False)  # written without "complete"
    assert calibration.cache.read_cache(str(path), "key", workers=2) == (ours, True)


def test_a_write_interrupted_halfway_leaves_the_old_file(tmp_path, rng, monkeypatch):
    """The new file is written beside the old one and renamed over it: a job killed while writing
    (here: interrupted in the middle of json.dump) leaves the old cache whole, and no temporary."""
    path = str(tmp_path / "calibration.cache.json")
    old = random_model(rng)
    calibration.cache.write_cache(path, "key", old)
    before = open(path, "rb").read()

    def half_a_dump(content, f, **kwargs):
        text = json.dumps(content, **kwargs)
        f.write(text[: len(text) // 2])
        f.flush()
        raise KeyboardInterrupt

    monkeypatch.setattr(calibration.cache.json, "dump", half_a_dump)
    with pytest.raises(KeyboardInterrupt):
        calibration.cache.write_cache(path, "key", random_model(rng))
    assert open(path, "rb").read() == before
    assert calibration.cache.read_cache(path, "key", workers=2) == (old, True)
    assert os.listdir(tmp_path) == ["calibration.cache.json"]


def test_a_cache_that_cannot_be_written_is_reported_not_raised(tmp_path, rng, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    path = str(blocker / "calibration.cache.json")  # a directory that is a file
    calibration.cache.write_cache(path, "key", random_model(rng))
    assert f"tfcomp: calibration cache {path}: could not be written" in caplog.text


class _TwoWorkers:
    """Rank 0 of a process set of two, for calibrate's cache logic without a second process."""

    def size(self):
        return 2

    def rank(self):
        return 0


@pytest.mark.parametrize("content", [BAD_FILES["not JSON"], BAD_FILES["array"], BAD_ENTRIES["NaN latency"],
                                     BAD_ENTRIES["wrong worker count"], BAD_ENTRIES["entry a string"]],
                         ids=["not JSON", "array", "NaN latency", "wrong worker count", "entry a string"])
def test_calibrate_measures_again_and_rewrites_an_unusable_cache(tmp_path, rng, monkeypatch, caplog, content):
    global_process_set()
    measured = random_model(rng)
    calls = []

    def fake_measure(compressor, process_set, max_elements, tensor_elements, cached, could_pay):
        """The network always measured; the compression figures measured only without `cached`
        (one piece of calibration)."""
        calls.append(cached)
        yield
        if cached is None:
            return measured, calibration.CompressionFigures.of(measured), True
        return cached.apply(measured), cached, False

    monkeypatch.setattr(calibration, "_measure", fake_measure)
    # Rank 0's decisions and figures, "broadcast" to itself.
    monkeypatch.setattr(calibration, "broadcast_floats", lambda values, *args, **kwargs: np.asarray(values, np.float64))
    path = tmp_path / "calibration.cache.json"
    monkeypatch.setenv(calibration.CACHE_ENV, str(path))
    compressor, process_set = tfcomp.DRAGONN(0.01), _TwoWorkers()
    key = calibration.cache_key(compressor, process_set, 2**20)
    path.write_text(content.replace('"key"', json.dumps(key)))
    assert calibration.calibrate(compressor, process_set, 2**20) == measured
    assert calls == [None] and len([r for r in caplog.records if r.levelname == "WARNING"]) == 1
    caplog.clear()
    assert calibration.calibrate(compressor, process_set, 2**20) == measured  # from the rewritten cache
    assert calls[1:] == [calibration.CompressionFigures.of(measured)]
    assert "WARNING" not in caplog.text


def test_ready_times_are_cached_per_model_beside_the_figures(tmp_path, monkeypatch, rng, caplog):
    path = tmp_path / "calibration.cache.json"
    monkeypatch.setenv(calibration.CACHE_ENV, str(path))
    ps = global_process_set()
    sizes = [int(n) for n in rng.integers(1, 2**20, size=int(rng.integers(2, 12)))]
    ready = sorted(float(t) for t in rng.uniform(0.0, 0.3, size=len(sizes)))
    assert calibration.cached_ready_times(ps, sizes) is None  # no file yet
    model = random_model(rng)
    calibration.cache.write_cache(str(path), "figures", model)
    calibration.store_ready_times(ps, sizes, ready)
    calibration.cache.write_cache(str(path), "more figures", model)  # rewriting the figures keeps the times
    assert calibration.cached_ready_times(ps, sizes) == ready
    assert calibration.cached_ready_times(ps, sizes[:-1] + [sizes[-1] + 1]) is None  # another model
    assert calibration.cache.read_cache(str(path), "figures") == (model, True)
    with pytest.raises(ValueError, match=r"has \d+ ready times for \d+ gradients"):
        calibration.store_ready_times(ps, sizes, ready[:-1])
    with pytest.raises(ValueError, match="is not an object with a list of ready times in seconds"):
        calibration.store_ready_times(ps, sizes, [-1.0] + ready[1:])
    # A broken entry is reported in one line and ignored; the next store replaces it.
    content = json.loads(path.read_text())
    key = next(iter(content["ready_times"]))
    content["ready_times"][key]["seconds"] = ["soon"] * len(sizes)
    path.write_text(json.dumps(content))
    assert calibration.cached_ready_times(ps, sizes) is None
    assert "ready times" in caplog.text and "is not an object with a list of ready times" in caplog.text
    calibration.store_ready_times(ps, sizes, ready)
    assert calibration.cached_ready_times(ps, sizes) == ready
    monkeypatch.setenv(calibration.CACHE_ENV, "none")
    assert calibration.cached_ready_times(ps, sizes) is None


def test_dense_verdicts_are_cached_per_model_and_compressor_beside_the_rest(tmp_path, monkeypatch, rng, caplog):
    path = tmp_path / "calibration.cache.json"
    monkeypatch.setenv(calibration.CACHE_ENV, str(path))
    ps = global_process_set()
    sizes = [int(n) for n in rng.integers(1, 2**20, size=int(rng.integers(2, 12)))]
    gain, ready = float(rng.uniform(0.05, 0.9)), sorted(float(t) for t in rng.uniform(0.0, 0.3, size=len(sizes)))
    dragonn = tfcomp.DRAGONN(0.01)
    assert calibration.cached_dense_verdict(ps, dragonn, sizes) is None  # no file yet
    calibration.store_ready_times(ps, sizes, ready)
    calibration.store_dense_verdict(ps, dragonn, sizes, gain)
    calibration.cache.write_cache(str(path), "figures", random_model(rng))  # rewriting the rest keeps verdicts
    assert calibration.cached_dense_verdict(ps, dragonn, sizes) == pytest.approx(gain)
    assert calibration.cached_ready_times(ps, sizes) == ready
    assert calibration.cached_dense_verdict(ps, tfcomp.DRAGONN(0.001), sizes) is None  # another compressor
    assert calibration.cached_dense_verdict(ps, dragonn, sizes + [8]) is None  # another model
    calibration.store_dense_verdict(ps, dragonn, sizes, 1.7)  # a step more exposed than long: kept as 1
    assert calibration.cached_dense_verdict(ps, dragonn, sizes) == 1.0
    content = json.loads(path.read_text())
    key = next(iter(content["verdicts"]))
    content["verdicts"][key]["potential_gain"] = "large"
    path.write_text(json.dumps(content))
    assert calibration.cached_dense_verdict(ps, dragonn, sizes) is None
    assert "is not an object with a potential gain in [0, 1]" in caplog.text
    monkeypatch.setenv(calibration.CACHE_ENV, "none")
    assert calibration.cached_dense_verdict(ps, dragonn, sizes) is None


def test_the_stop_early_rule_asks_for_a_clear_gain_only_of_a_compressor_tried_in_training(rng):
    """planning.compression_could_pay: on networks from 10 Mbit/s to 100 Gbit/s, compression at
    least costs could pay where the plan compresses; a compressor tried in training also needs
    the plan predicted CLEAR_GAIN times faster than dense (the gain is its all-dense time over its
    own, from tfcomp.planning's prices)."""
    tensors = [(p, f"t{p}", int(n)) for p, n in reversed(list(enumerate(rng.integers(2**16, 2**20, size=6))))]
    least = cm.AffineCost(0.0, float(rng.uniform(1e-9, 4e-9)))
    tried, untried = tfcomp.DRAGONN(0.01), tfcomp.DRAGONN(0.01, trial_steps=0)
    assert tried.tried_steps > 0 and untried.tried_steps == 0
    seen = set()
    for bandwidth in np.logspace(np.log10(10e6 / 8), np.log10(100e9 / 8), 160):
        network = cm.Network(1e-4, float(bandwidth))
        cluster = cm.ClusterModel(4, network, network, least)
        plan = planning.make_plan(tensors, tried, cluster)
        gain = planning.all_dense_time(plan) / planning.predicted_exchange_time(plan)
        kind = "dense" if not plan.compressed else ("clear" if gain >= planning.CLEAR_GAIN else "small")
        seen.add(kind)
        assert planning.compression_could_pay(tensors, untried, cluster) == bool(plan.compressed), bandwidth
        assert planning.compression_could_pay(tensors, tried, cluster) == (kind == "clear"), bandwidth
    assert seen == {"dense", "small", "clear"}


def test_the_planner_hands_its_stop_early_rule_to_calibration(monkeypatch):
    """Planner.recalibrate gives calibration `planning.compression_could_pay` of its tensors and
    compressor; calibration itself holds no planning rule (without one it measures every cost)."""
    from tfcomp.planner import Planner

    given = []
    monkeypatch.setattr(calibration, "calibrate", lambda *args, **kwargs: given.append(kwargs) or "figures")
    compressor = tfcomp.DRAGONN(0.01)
    tensors = [(1, "b", 5000), (0, "a", 3000)]
    assert Planner(compressor, global_process_set(), {}).recalibrate(tensors) == "figures"
    rule = given[0]["could_pay"]
    network = cm.Network(1e-4, 10e6 / 8)
    cluster = cm.ClusterModel(4, network, network, cm.AffineCost(0.0, 1e-9))
    assert rule.func is planning.compression_could_pay and rule.args == (tensors, compressor)
    assert rule(cluster) == planning.compression_could_pay(tensors, compressor, cluster)
    assert given[0]["tensor_elements"] == [5000, 3000] and given[0]["max_elements"] == 8000
