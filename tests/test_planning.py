"""The bucket search against brute force, strategy choices at the extremes, plan pricing and digests."""

import dataclasses
import itertools
import math
import re

import numpy as np
import pytest

import tfcomp
from tfcomp import cost_model as cm
from tfcomp import planning
from tfcomp import strategies as st


def cluster(workers=2, gbps=1.0, latency=1e-4, c0=3e-4, c1=4e-9):
    net = cm.Network(latency, gbps * 1e9 / 8)
    return cm.ClusterModel(workers, net, net, cm.AffineCost(c0, c1))


def backprop(sizes):
    """[(position, name, elements)] in backprop order for gradients listed in variable order."""
    return [(i, f"t{i}", n) for i, n in reversed(list(enumerate(sizes)))]


def brute_force(tensors, compressor, model, groups):
    """min over all contiguous partitions into exactly `groups` buckets of the summed bucket costs."""
    sizes = [n for _, _, n in tensors]
    best = math.inf
    for cuts in itertools.combinations(range(1, len(sizes)), groups - 1):
        bounds = (0, *cuts, len(sizes))
        total = sum(min(s.time(sum(sizes[a:b]), compressor, model).total for s in compressor.strategies)
                    for a, b in zip(bounds, bounds[1:]))
        best = min(best, total)
    return best


@pytest.mark.parametrize("trial", range(4))
def test_search_finds_the_best_partition_brute_force_finds(rng, trial):
    sizes = [int(rng.choice([8, 300, 5000, 2**16, 2**20])) for _ in range(int(rng.integers(3, 8)))]
    model = cluster(workers=int(rng.integers(2, 17)), gbps=float(rng.choice([0.5, 5, 100])),
                    c0=float(rng.uniform(1e-5, 1e-3)), c1=float(rng.uniform(1e-10, 1e-8)))
    compressor = tfcomp.DRAGONN(0.01, min_elements=1)  # every tensor may be compressed
    tensors = backprop(sizes)
    strategies = compressor.strategies
    # The dynamic programme is exact for every number of groups.
    partitions = planning._best_partitions(tensors, [0.0] * len(sizes), strategies, compressor, model, len(sizes))
    assert sorted(partitions) == list(range(1, len(sizes) + 1))
    for y, buckets in partitions.items():
        assert len(buckets) == y
        found = sum(b.predicted.total for b in buckets)
        assert found == pytest.approx(brute_force(tensors, compressor, model, y), rel=1e-9, abs=1e-12)
        order = [p for b in buckets for p in b.positions]
        assert order == [p for p, _, _ in tensors]  # contiguous, in backprop order
    # Algorithm 2 keeps a candidate only where it is faster, and the plan is never slower than all dense.
    plan = planning.make_plan(tensors, compressor, model, max_groups=len(sizes), min_gain=0.0)
    one_bucket = planning.Plan(tuple(partitions[1]), plan.names, compressor, model, sizes=plan.sizes)
    assert planning.predicted_exchange_time(plan) <= planning.predicted_exchange_time(one_bucket) * (1 + 1e-12)
    assert planning.predicted_exchange_time(plan) <= planning.all_dense_time(plan) * (1 + 1e-12)
    assert sorted(p for b in plan.buckets for p in b.positions) == list(range(len(sizes)))
    assert [p for b in plan.buckets for p in b.positions] == [p for p, _, _ in tensors]


@pytest.mark.parametrize("trial", range(6))
def test_tensors_under_min_elements_are_always_sent_dense(rng, trial):
    """Whatever the network, small tensors (biases, normalisation gains) never enter a compressed
    bucket; every tensor is in exactly one bucket; the plan is never slower than all dense; and the
    large tensors are bucketed as they would be without the small ones."""
    sizes = [int(rng.choice([10, 256, 1000, 5000, 2**16, 2**20])) for _ in range(int(rng.integers(2, 12)))]
    min_elements = int(rng.choice([300, 1024, 6000]))
    compressor = tfcomp.DRAGONN(0.01, min_elements=min_elements)
    model = cluster(workers=int(rng.integers(2, 9)), gbps=float(rng.choice([0.1, 1.0, 100.0])))
    ready = sorted(rng.uniform(0.0, 0.05, len(sizes))) if trial % 2 else None
    plan = planning.make_plan(backprop(sizes), compressor, model, ready_seconds=ready)
    assert sorted(p for b in plan.buckets for p in b.positions) == list(range(len(sizes)))
    for b in plan.compressed:
        assert all(sizes[p] >= min_elements for p in b.positions), (b, sizes)
    assert planning.predicted_exchange_time(plan) <= planning.all_dense_time(plan) * (1 + 1e-12)
    large = [(p, name, n) for p, name, n in backprop(sizes) if n >= min_elements]
    if plan.compressed and large:
        alone = planning.make_plan(large, compressor, model, ready_seconds=[
            t for (_, _, n), t in zip(backprop(sizes), ready or [0.0] * len(sizes)) if n >= min_elements])
        if alone.compressed:  # (both plans are also compared with all dense, which may tip one of them)
            assert [b.positions for b in alone.compressed] == [b.positions for b in plan.compressed]


def test_slow_network_compresses_the_big_tensors_fast_network_sends_dense():
    sizes = [4096 * 2048, 2048, 512 * 10, 10]
    slow = planning.make_plan(backprop(sizes), tfcomp.DRAGONN(0.001), cluster(gbps=1.0))
    fast = planning.make_plan(backprop(sizes), tfcomp.DRAGONN(0.001), cluster(gbps=100.0, c1=5e-9))
    assert any(b.strategy == "allgather" and 0 in b.positions for b in slow.buckets)
    assert [b.strategy for b in fast.buckets] == ["dense"]
    assert planning.predicted_exchange_time(slow) < 0.2 * planning.all_dense_time(slow)
    assert planning.predicted_exchange_time(fast) == pytest.approx(planning.all_dense_time(fast))


def test_many_workers_prefer_artopk_and_one_worker_sends_dense():
    sizes = [2**22]
    # Lossless partitioning (no union limit) is priced at its worst case, an allgather's traffic and more.
    lossless = tfcomp.DRAGONN(0.01, union_limit=None)
    many = planning.make_plan(backprop(sizes), lossless, cluster(workers=64, gbps=10.0, latency=1e-6))
    assert [b.strategy for b in many.buckets] == ["artopk"]  # allgather grows with K, AR-Topk does not
    alone = planning.make_plan(backprop(sizes), tfcomp.DRAGONN(0.01), cluster(workers=1))
    assert [b.strategy for b in alone.buckets] == ["dense"]


@pytest.mark.parametrize("workers, expected", [(2, "allgather"), (4, "partitioned"), (8, "partitioned"),
                                               (64, "partitioned")])
def test_partitioned_allreduce_where_its_owner_budget_cuts_the_traffic(workers, expected):
    """Each worker's traffic: allgather (K-1) k pairs; partitioned (K-1)/K k pairs to the owners
    plus (K-1) ceil(k/K) sums and a flag from them (union limit 1): 4x fewer at K = 8; at K = 2 the
    same bytes in two collectives."""
    compressor = tfcomp.DRAGONN(0.01)
    plan = planning.make_plan(backprop([2**22]), compressor, cluster(workers=workers, gbps=1.0, latency=1e-5))
    assert [b.strategy for b in plan.buckets] == [expected]
    net = cm.Network(0.0, 1.0)  # seconds = bytes
    k = compressor.payload_length(2**22)
    ratio = cm.ring_allgather(8 * k, workers, net) / cm.partitioned_allreduce(compressor, [2**22], workers, net)
    assert ratio == pytest.approx(k / (k / workers + math.ceil(k / workers) + 1))


def test_forced_strategy_and_planning_off():
    sizes = [100, 5000, 2000, 3]
    forced = planning.make_plan(backprop(sizes), tfcomp.DGC(0.1, strategy="artopk", min_elements=1), cluster(gbps=100.0))
    assert {b.strategy for b in forced.buckets} == {"artopk"}
    # Tensors under min_elements go dense even where the strategy is forced.
    forced = planning.make_plan(backprop(sizes), tfcomp.DGC(0.1, strategy="artopk", min_elements=1024), cluster(gbps=100.0))
    assert {(p, b.strategy) for b in forced.buckets for p in b.positions} == {
        (0, "dense"), (1, "artopk"), (2, "artopk"), (3, "dense")}
    compressor = tfcomp.TopK(0.1, planning="off", min_elements=1000)
    off = planning.per_tensor_plan(backprop(sizes), compressor, cluster())
    assert [(b.positions, b.strategy) for b in off.buckets] == [((3,), "dense"), ((2,), "allgather"),
                                                               ((1,), "allgather"), ((0,), "dense")]


def test_neighbouring_dense_buckets_are_merged_and_the_dense_allreduce_runs_beside_the_encode():
    sizes = [10, 20, 30, 2**22, 40]
    plan = planning.make_plan(backprop(sizes), tfcomp.DRAGONN(0.001), cluster(gbps=0.5))
    strategies = [b.strategy for b in plan.buckets]
    assert all(not (a == b == "dense") for a, b in zip(strategies, strategies[1:]))
    model = plan.cluster
    dense_elements = sum(b.elements for b in plan.buckets if b.strategy == "dense")
    compressed = [b for b in plan.buckets if b.strategy == "allgather"]
    # All ready at once: the dense allreduce goes first, on the network while the buckets are encoded.
    assert dense_elements > 0 and compressed
    expected = (max(cm.ring_allreduce(4 * dense_elements, 2, model.allreduce),
                    sum(model.encode_decode(b.elements) for b in compressed))
                + cm.ring_allgather(sum(8 * round(0.001 * b.elements) + 4 for b in compressed), 2, model.allgather))
    assert planning.predicted_exchange_time(plan) == pytest.approx(expected)


def test_dense_tensors_overlap_the_backward_pass_as_horovod_sends_them(rng):
    sizes = [2**20] * 4
    ready = [0.0, 0.05, 0.10, 0.15]  # backprop order: the first bucket's gradients are ready first
    model = cluster(gbps=10.0)
    after = planning.make_plan(backprop(sizes), tfcomp.NoCompression(), model)
    assert len(after.buckets) == 1  # all ready at once: one allreduce
    plan = planning.make_plan(backprop(sizes), tfcomp.NoCompression(), model, ready_seconds=ready)
    # One dense bucket, a price: each tensor's allreduce starts once it is ready, so the first three
    # hide behind the backward pass and only the last one's shows.
    assert [b.positions for b in plan.buckets] == [(3, 2, 1, 0)]
    one = cm.ring_allreduce(4 * 2**20, 2, model.allreduce)
    assert planning.predicted_exchange_time(plan) == pytest.approx(0.15 + one)
    # An all-dense plan is priced by the same replay as plain Horovod, with fusion and cycle ticks.
    for _ in range(5):
        many = [int(n) for n in rng.integers(1, 2**21, 40)]
        times = sorted(rng.uniform(0.0, 0.05, 40))
        model = dataclasses.replace(cluster(workers=4, gbps=float(rng.uniform(0.5, 20))), per_tensor=2e-5,
                                    overlap_slowdown=float(rng.uniform(1.0, 2.0)))
        plan = planning.make_plan(backprop(many), tfcomp.NoCompression(), model, ready_seconds=times)
        by_position = [n for _, _, n in backprop(many)]
        assert planning.predicted_exchange_time(plan) == pytest.approx(cm.horovod_dense_finish(by_position, times, model))
    with pytest.raises(ValueError, match="ready_seconds must give one time per tensor"):
        planning.make_plan(backprop(sizes), tfcomp.NoCompression(), model, ready_seconds=ready[:3])
    with pytest.raises(ValueError, match="ready_seconds must be finite seconds >= 0"):
        planning.make_plan(backprop(sizes), tfcomp.NoCompression(), model, ready_seconds=[0.0, -1.0, 0.1, 0.2])
    # Timeline arithmetic of 000 Sec. 4.1 with two dense buckets.
    assert cm.overlapped_dense_iteration(0.2, [0.05, 0.03]) == pytest.approx(0.23)
    assert cm.overlapped_dense_iteration(0.01, [0.05, 0.03]) == pytest.approx(0.08)
    assert cm.compressed_iteration(0.2, 0.01, 0.002) == pytest.approx(0.212)


def test_digest_depends_on_buckets_strategies_and_compressor():
    sizes = [2**20, 500, 2**18]
    base = planning.make_plan(backprop(sizes), tfcomp.DRAGONN(0.001), cluster(gbps=1.0))
    again = planning.make_plan(backprop(sizes), tfcomp.DRAGONN(0.001), cluster(gbps=1.0))
    other_ratio = planning.make_plan(backprop(sizes), tfcomp.DRAGONN(0.002), cluster(gbps=1.0))
    dense = planning.make_plan(backprop(sizes), tfcomp.DRAGONN(0.001), cluster(gbps=1000.0))
    assert base.digest() == again.digest()
    assert len({base.digest(), other_ratio.digest(), dense.digest()}) == 3
    assert 0 <= base.digest() < 2**63


def test_a_plan_needs_every_tensors_elements(rng):
    sizes = [int(n) for n in rng.integers(1, 2**20, 5)]
    plan = planning.make_plan(backprop(sizes), tfcomp.DRAGONN(0.001), cluster(gbps=1.0))
    assert plan.sizes == dict(enumerate(sizes))
    position = int(rng.integers(len(sizes)))
    with pytest.raises(ValueError, match=rf"sizes must give .* positions \[{position}\] without"):
        dataclasses.replace(plan, sizes={p: n for p, n in plan.sizes.items() if p != position})
    whole = planning.Bucket(tuple(range(len(sizes))), sum(sizes), "dense", cm.StrategyTime(0.0, 0.0), 0.0)
    with pytest.raises(ValueError, match=f"bucket 0 has {sum(sizes)} elements, but sizes give its tensors {sum(sizes) + 1}"):
        dataclasses.replace(plan, buckets=(whole,), sizes={**plan.sizes, position: sizes[position] + 1})


def test_table_is_readable():
    plan = planning.make_plan(backprop([2**22, 64]), tfcomp.DRAGONN(0.001), cluster(gbps=1.0))
    text = plan.table()
    assert "bucket" in text and "strategy" in text and "predicted ms" in text and "dense ms" in text
    assert "allgather" in text and "all dense" in text and "1.00 Gbit/s" in text


def test_unit_runs_keep_long_tensor_lists_searchable(rng):
    sizes = [int(x) for x in rng.integers(1, 5000, 400)]
    plan = planning.make_plan(backprop(sizes), tfcomp.DRAGONN(0.01), cluster(gbps=0.5))
    assert sorted(p for b in plan.buckets for p in b.positions) == list(range(400))


def test_cluster_model_round_trips_through_a_list(rng):
    model = dataclasses.replace(cluster(workers=5, gbps=float(rng.uniform(0.1, 100)), c0=float(rng.uniform(0, 1e-3))),
                                per_tensor=float(rng.uniform(0, 1e-4)), compression_per_tensor=float(rng.uniform(0, 1e-4)),
                                merge_per_element=float(rng.uniform(0, 1e-9)), compression_fixed=float(rng.uniform(0, 1e-3)))
    assert cm.ClusterModel.from_list(np.array(model.to_list())) == model


@pytest.mark.parametrize("make", [planning.make_plan, planning.per_tensor_plan], ids=["make_plan", "per_tensor_plan"])
def test_plans_are_made_only_from_valid_figures(rng, make):
    tensors = backprop([int(n) for n in rng.integers(1, 2**20, 5)])
    with pytest.raises(TypeError, match="cluster must be a tfcomp.cost_model.ClusterModel, got list"):
        make(tensors, tfcomp.DRAGONN(0.01), cluster().to_list())
    # Figures changed behind validation's back (a frozen dataclass can still be forced).
    forced = cluster()
    bad = float(rng.choice([math.nan, math.inf, 1e308]))
    object.__setattr__(forced, "compression_fixed", bad)
    with pytest.raises(ValueError, match=rf"ClusterModel.compression_fixed must be .* got {re.escape(repr(bad))}"):
        make(tensors, tfcomp.DRAGONN(0.01), forced)


def test_fixed_compression_cost_is_paid_once_per_exchange(rng):
    fixed = float(rng.uniform(1e-4, 1e-3))
    free, costly = cluster(gbps=0.5), dataclasses.replace(cluster(gbps=0.5), compression_fixed=fixed)
    alone = st.STRATEGIES["allgather"].time(2**20, tfcomp.DRAGONN(0.001), costly)
    in_plan = st.STRATEGIES["allgather"].time(2**20, tfcomp.DRAGONN(0.001), costly, alone=False)
    assert alone.compression == pytest.approx(in_plan.compression + fixed)
    assert st.STRATEGIES["dense"].time(2**20, tfcomp.DRAGONN(0.001), costly).compression == 0.0
    plan = planning.per_tensor_plan(backprop([2**22, 2**22]), tfcomp.DRAGONN(0.001), costly)
    assert len(plan.compressed) == 2
    same_with_free = planning.Plan(plan.buckets, plan.names, plan.compressor, free, sizes=plan.sizes)
    assert planning.predicted_exchange_time(plan) == pytest.approx(
        planning.predicted_exchange_time(same_with_free) + fixed)


def test_plan_sends_dense_when_the_fixed_cost_outweighs_the_saving():
    tensors = backprop([2**16, 2**16])  # 512 KiB at 1 Gbit/s: compression saves about 1 ms
    compressor = tfcomp.DRAGONN(0.001)
    cheap = planning.make_plan(tensors, compressor, cluster(gbps=1.0, c0=1e-5, c1=1e-10))
    assert cheap.compressed
    saving = planning.all_dense_time(cheap) - planning.predicted_exchange_time(cheap)
    costly = dataclasses.replace(cluster(gbps=1.0, c0=1e-5, c1=1e-10), compression_fixed=2 * saving)
    plan = planning.make_plan(tensors, compressor, costly)
    assert not plan.compressed and len(plan.buckets) == 1
    assert planning.predicted_exchange_time(plan) == pytest.approx(planning.all_dense_time(plan))
    forced = planning.make_plan(tensors, tfcomp.DRAGONN(0.001, strategy="allgather"), costly)
    assert forced.compressed  # a forced strategy is kept whatever it costs


def test_intquant_pays_the_allreduce_of_its_payload_and_the_scales_allgather():
    model = cluster(workers=4)
    compressor = tfcomp.IntQuant(8)
    priced = st.ALLREDUCE.time(10**6, compressor, model)
    payload = compressor.payload_bytes(10**6) + 4  # and the float32 count of non-finite values
    expected = (cm.ring_allreduce(payload, 4, model.allreduce) + cm.ring_allgather(4, 4, model.allgather)
                + st.WIRE_TENSORS * model.per_tensor)
    assert priced.communication == pytest.approx(expected)
    assert compressor.strategies == ("dense", "allreduce")
    # 1 byte per element against float32's 4: at 1 Gbit/s the plan quantises the big tensor.
    plan = planning.make_plan(backprop([4096 * 2048, 10]), compressor, model)
    assert any(b.strategy == "allreduce" and 0 in b.positions for b in plan.buckets)


def test_a_compressing_plan_carries_the_best_all_dense_plan_it_beat():
    sizes = [2**20] * 4
    ready = [0.0, 0.05, 0.10, 0.15]
    model = cluster(gbps=0.5, c0=1e-4, c1=1e-9)
    plan = planning.make_plan(backprop(sizes), tfcomp.DRAGONN(0.01), model, ready_seconds=ready)
    assert plan.compressed and plan.dense_buckets
    dense_only = planning.make_plan(backprop(sizes), tfcomp.DRAGONN(0.01, strategy="dense"), model,
                                    ready_seconds=ready)
    assert [b.positions for b in plan.dense_buckets] == [b.positions for b in dense_only.buckets]
    twin = plan.all_dense()
    assert twin.buckets == plan.dense_buckets and not twin.compressed and not twin.dense_buckets
    assert planning.all_dense_time(plan) == pytest.approx(planning.predicted_exchange_time(dense_only))
    assert planning.predicted_exchange_time(plan) < planning.all_dense_time(plan)
    assert plan.digest() != dataclasses.replace(plan, dense_buckets=()).digest()


def test_a_plan_record_survives_json_and_prices_the_same(rng):
    import json
    sizes = [int(n) for n in rng.integers(2**16, 2**20, size=7)]
    ready = sorted(float(t) for t in rng.uniform(0, 0.02, size=7))
    model = dataclasses.replace(cluster(gbps=float(rng.uniform(0.5, 1)), c1=float(rng.uniform(1e-10, 1e-9))),
                                overlap_slowdown=float(rng.uniform(1, 3)))
    compressor = tfcomp.DRAGONN(0.01, min_elements=1)
    plan = planning.make_plan(backprop(sizes), compressor, model, ready_seconds=ready)
    assert plan.compressed and plan.dense_buckets and any(plan.ready.values())
    again = planning.Plan.from_record(json.loads(json.dumps(plan.record())), tfcomp.DRAGONN(0.01, min_elements=1))
    assert again.buckets == plan.buckets and again.dense_buckets == plan.dense_buckets
    assert (again.names, again.sizes, again.ready, again.cluster) == (plan.names, plan.sizes, plan.ready, plan.cluster)
    assert planning.predicted_exchange_time(again) == planning.predicted_exchange_time(plan)
    assert again.digest() == plan.digest() and plan.record()["compressor"] == ["DRAGONN", compressor.get_config()]
    broken = plan.record()
    broken["cluster"] = broken["cluster"][:-1]
    with pytest.raises(ValueError, match="ClusterModel figures must be 13 numbers"):
        planning.Plan.from_record(broken, compressor)


def slowed(plan, slowdown):
    return dataclasses.replace(plan, cluster=dataclasses.replace(plan.cluster, overlap_slowdown=slowdown))


SLOWDOWN_GRID = [cm.MAX_OVERLAP_SLOWDOWN ** (i / (planning.GRID_POINTS - 1)) for i in range(planning.GRID_POINTS)]


def predicted(plan, slowdown):
    return planning.predicted_exchange_time(slowed(plan, slowdown))


def test_fitted_overlap_slowdown_reproduces_the_measured_exchange(rng):
    overlapping = explained = 0
    for _ in range(20):
        sizes = [int(n) for n in rng.integers(2**14, 2**21, size=int(rng.integers(3, 9)))]
        backward = float(rng.uniform(0.02, 0.2))
        ready = sorted(float(t) for t in rng.uniform(0.0, backward, size=len(sizes)))
        ready[-1] = backward
        plan = planning.make_plan(backprop(sizes), tfcomp.NoCompression(), cluster(gbps=float(rng.uniform(0.5, 20))),
                                  ready_seconds=ready)
        true_slowdown = float(rng.uniform(1.2, 10.0))
        measured = planning.predicted_exchange_time(slowed(plan, true_slowdown))
        fitted = planning.fit_overlap_slowdown(plan, measured)
        # The least slowdown on the grid (bisected within its step) whose prediction reaches the
        # measurement. The prediction is neither monotone nor continuous in the slowdown (Horovod's
        # fusion: a slower early transfer can fuse more of the later tensors), so it can land past
        # the true slowdown or past the measurement; in most plans it does neither.
        assert 1.0 <= fitted <= cm.MAX_OVERLAP_SLOWDOWN
        assert predicted(plan, fitted) >= measured
        assert all(predicted(plan, s) < measured for s in SLOWDOWN_GRID if s < fitted - 1e-4)
        explained += (fitted <= true_slowdown * SLOWDOWN_GRID[1]
                      and predicted(plan, fitted) == pytest.approx(measured, rel=1e-3))
        # An exchange no slower than predicted needs no slowdown.
        assert planning.fit_overlap_slowdown(plan, planning.predicted_exchange_time(plan) * 0.9) == 1.0
        # Beyond any slowdown: the one on the grid predicting the latest end; 1 where none predicts
        # later than 1 (nothing of the plan overlaps the backward pass).
        latest = max(predicted(plan, s) for s in SLOWDOWN_GRID)
        assert predicted(plan, planning.fit_overlap_slowdown(plan, 1e3)) == latest
        overlaps = latest > predicted(plan, 1.0)
        overlapping += overlaps
        if not overlaps:
            assert planning.fit_overlap_slowdown(plan, 1e3) == 1.0
    assert overlapping >= 10  # most random plans overlap: the greatest slowdown is checked
    assert explained >= 15
    for bad in (math.nan, -0.1, math.inf):
        with pytest.raises(ValueError, match="measured_seconds must be finite seconds >= 0"):
            planning.fit_overlap_slowdown(plan, bad)


def test_network_explaining_reproduces_the_measured_exchange_with_the_bandwidths_scaled(rng):
    explained = faster = faster_measured = 0
    for _ in range(20):
        sizes = [int(n) for n in rng.integers(2**14, 2**21, size=int(rng.integers(1, 9)))]
        backward = float(rng.uniform(0.0, 0.2))
        ready = sorted(float(t) for t in rng.uniform(0.0, backward, size=len(sizes)))
        compressor = tfcomp.DRAGONN(0.01) if rng.random() < 0.5 else tfcomp.NoCompression()
        model = cluster(workers=int(rng.integers(2, 9)), gbps=float(rng.uniform(0.5, 20)))
        plan = planning.make_plan(backprop(sizes), compressor, model, ready_seconds=ready)
        true_factor = float(np.exp(rng.uniform(-np.log(20), np.log(20))))
        truth = dataclasses.replace(model, allreduce=cm.Network(model.allreduce.latency, model.allreduce.bandwidth * true_factor),
                                    allgather=cm.Network(model.allgather.latency, model.allgather.bandwidth * true_factor))
        measured = planning.predicted_exchange_time(dataclasses.replace(plan, cluster=truth))
        network = planning.network_explaining(plan, measured)
        # The least factor (on the grid, bisected within its step) whose prediction comes down to
        # the measurement: neither monotone nor continuous (Horovod's fusion), so it can land past
        # the true factor or below the measurement; in most plans it does neither.
        found = planning.predicted_exchange_time(dataclasses.replace(plan, cluster=network))
        assert found <= measured
        explained += found == pytest.approx(measured, rel=1e-3)
        factor = network.allreduce.bandwidth / model.allreduce.bandwidth
        assert network.allgather.bandwidth / model.allgather.bandwidth == pytest.approx(factor)
        assert (network.allreduce.latency, network.encode_decode, network.workers) == \
            (model.allreduce.latency, model.encode_decode, model.workers)
        # Slower than predicted: a slower network explains it; faster: (nearly always) a faster one.
        if measured > planning.predicted_exchange_time(plan):
            assert factor < 1.0
        else:
            faster_measured += 1
            faster += factor > 1.0
        # Beyond what any factor in range explains: the nearest bound.
        assert planning.network_explaining(plan, 1e6).allreduce.bandwidth == \
            pytest.approx(model.allreduce.bandwidth / planning.NETWORK_SCALE_RANGE)
        assert planning.network_explaining(plan, 0.0).allreduce.bandwidth == \
            pytest.approx(model.allreduce.bandwidth * planning.NETWORK_SCALE_RANGE)
    assert explained >= 15 and faster >= faster_measured - 2
    for bad in (math.nan, -0.1, math.inf):
        with pytest.raises(ValueError, match="measured_seconds must be finite seconds >= 0"):
            planning.network_explaining(plan, bad)


def test_overlap_slowdown_prices_only_transfers_beside_the_backward_pass():
    sizes = [2**20] * 4
    ready = [0.0, 0.01, 0.02, 0.03]
    dense = planning.make_plan(backprop(sizes), tfcomp.NoCompression(), cluster(gbps=2.0), ready_seconds=ready)
    # The first tensors' allreduces go while the backward pass computes: slowed, they end later.
    assert planning.predicted_exchange_time(slowed(dense, 4.0)) > planning.predicted_exchange_time(dense)
    # Compressed buckets are encoded, and sent, after the backward pass: the slowdown leaves them alone.
    compressed = planning.make_plan(backprop(sizes), tfcomp.DRAGONN(0.01), cluster(gbps=0.1), ready_seconds=ready)
    assert compressed.compressed and not [b for b in compressed.buckets if b.strategy == "dense"]
    assert planning.predicted_exchange_time(slowed(compressed, 4.0)) == planning.predicted_exchange_time(compressed)
    # No slowdown explains a late exchange that overlaps nothing: the fit leaves it at 1.
    assert planning.fit_overlap_slowdown(compressed, 10.0 * planning.predicted_exchange_time(compressed)) == 1.0
    # A slowdown measured in training can make compression pay where overlap seemed to hide dense.
    model = cluster(gbps=5.0, c0=1e-3, c1=2e-9)
    ready = [0.0, 0.03, 0.06, 0.09]
    fast = planning.make_plan(backprop(sizes), tfcomp.DRAGONN(0.01), model, ready_seconds=ready)
    slow = planning.make_plan(backprop(sizes), tfcomp.DRAGONN(0.01), dataclasses.replace(model, overlap_slowdown=10.0),
                              ready_seconds=ready)
    assert not fast.compressed and slow.compressed
    assert "transfers 10.00x slower during the backward pass" in slow.table()


@pytest.mark.parametrize("strategy, field", [("partitioned", "partitioned_per_slot"), ("artopk", "artopk_per_slot")])
def test_a_strategys_per_slot_figure_prices_its_work_beside_the_allgathers(rng, strategy, field):
    """Its compression is the allgather's plus the figure times the payload's slots (signed, never
    below 0); the other strategies' compression is unchanged."""
    elements, compressor = int(rng.integers(10**5, 10**7)), tfcomp.DRAGONN(0.01)
    slots = compressor.payload_length(elements)
    base = dataclasses.replace(cluster(), workers=8, partitioned_per_slot=0.0, artopk_per_slot=0.0)
    plain = {s: st.STRATEGIES[s].time(elements, compressor, base).compression for s in ("allgather", strategy)}
    assert plain[strategy] == pytest.approx(plain["allgather"])
    per_slot = float(rng.uniform(1e-9, 1e-7))
    for sign in (1, -1):
        priced = dataclasses.replace(base, **{field: sign * per_slot})
        times = {s: s.time(elements, compressor, priced).compression for s in compressor.strategies}
        assert times[strategy] == pytest.approx(max(plain["allgather"] + sign * per_slot * slots, 0.0))
        assert {s: t for s, t in times.items() if s != strategy} == {
            s: s.time(elements, compressor, base).compression for s in times if s != strategy}
    huge_saving = dataclasses.replace(base, **{field: -1.0})
    assert st.STRATEGIES[strategy].time(elements, compressor, huge_saving).compression == 0.0


def test_a_new_plan_replaces_the_running_one_only_where_it_pays(rng):
    """pays_to_replace prices both plans with the new plan's figures and asks for min_gain of the
    part of the running plan's exchange that outlasts the backward pass."""
    sizes = [int(n) for n in rng.choice([2**16, 2**20, 2**22], int(rng.integers(2, 6)))]
    model = cluster(workers=4, gbps=1.0)
    ready = sorted(rng.uniform(0.0, 0.05, len(sizes)))
    new = planning.make_plan(backprop(sizes), tfcomp.DRAGONN(0.01, min_elements=1), model, ready_seconds=ready)
    dense = new.all_dense()
    exposed = planning.predicted_exchange_time(dense) - max(ready)
    gain = (planning.predicted_exchange_time(dense) - planning.predicted_exchange_time(new)) / exposed
    assert 0.05 < gain < 1.0  # a slow network: compressing pays
    assert planning.pays_to_replace(dense, new, 0.05)
    assert not planning.pays_to_replace(dense, new, gain + 1e-6)
    assert not planning.pays_to_replace(new, new, 0.0)  # never replaces a plan with itself
    # The running plan is priced with the new figures, not its own: made for a 100x faster network,
    # the same buckets priced on this one lose by as much as they would.
    stale = dataclasses.replace(dense, cluster=cluster(workers=4, gbps=100.0), ready={})
    assert planning.pays_to_replace(stale, new, 0.05)
    with pytest.raises(ValueError, match="min_gain"):
        planning.pays_to_replace(dense, new, 1.0)


def test_a_replacement_keeps_every_bucket_dense_once_a_trial_dropped_compression(rng):
    """planning.replacement: the new plan where it pays; after a dropped trial only its all-dense
    buckets, and those never in place of other all-dense buckets: the exchange sends each dense
    tensor as Horovod does whatever its bucket, so they price alike and a new trace gains nothing."""
    sizes = [int(n) for n in rng.integers(2**20, 2**22, 4)]
    model = cluster(workers=4, gbps=1.0)
    compressor = tfcomp.DRAGONN(0.01, min_elements=1)
    first = planning.make_plan(backprop(sizes), compressor, model)  # made before any step: no ready times
    ready = list(np.cumsum(rng.uniform(0.02, 0.05, len(sizes))) - 0.02)  # the backward pass, 40 to 130 ms
    new = planning.make_plan(backprop(sizes), compressor, model, ready_seconds=ready)
    assert new.compressed and first.compressed  # a slow network: compressing pays
    running = first.all_dense()  # what runs once the first plan's trial dropped it
    assert planning.replacement(running, new, 0.05) == new
    assert planning.replacement(running, new, 0.0, compressing=False) is None
    split = dataclasses.replace(running, buckets=tuple(
        planning._dense_bucket(planning.Bucket((p,), n, "dense", None, 0.0), compressor, model)
        for p, _, n in backprop(sizes)))
    assert split.digest() != new.all_dense().digest()
    assert planning.predicted_exchange_time(dataclasses.replace(split, ready=new.ready)) == pytest.approx(
        planning.predicted_exchange_time(new.all_dense()))
    assert planning.replacement(split, new, 0.0, compressing=False) is None

def bottom_up_partitions(tensors, ready, strategies, compressor, model, max_groups):
    """The dynamic programme as a full table, bottom-up (the search before it priced buckets lazily):
    every bucket priced, every (y, j) filled in order of y, the smallest i on ties."""
    units = planning._units([n for _, _, n in tensors])
    prefix = [0]
    for start, end in units:
        prefix.append(prefix[-1] + sum(n for _, _, n in tensors[start:end]))
    unit_ready, backward_end, count = [max(ready[a:b]) for a, b in units], max(ready), len(units)
    cost = {(i, j): planning._cheapest(prefix[j] - prefix[i], units[j - 1][1] - units[i][0], strategies, compressor,
                                       model) for i in range(count) for j in range(i + 1, count + 1)}
    groups = min(max_groups, count)
    finish = [[math.inf] * (count + 1) for _ in range(groups + 1)]
    choice = [[None] * (count + 1) for _ in range(groups + 1)]
    finish[0][0] = 0.0
    for y in range(1, groups + 1):
        for j in range(1, count + 1):
            for i in range(y - 1, j):
                if finish[y - 1][i] < math.inf:
                    t = cm.transfer_end(max(unit_ready[j - 1], finish[y - 1][i]), cost[i, j][1].total, backward_end,
                                        model.overlap_slowdown)
                    if t < finish[y][j]:
                        finish[y][j], choice[y][j] = t, i
    partitions = {}
    for wanted in range(1, groups + 1):
        cuts, j, y = [], count, wanted
        while j > 0:
            cuts.append((choice[y][j], j))
            j, y = choice[y][j], y - 1
        partitions[wanted] = [([p for a, b in units[i:j] for p, _, _ in tensors[a:b]],) + cost[i, j]
                              for i, j in reversed(cuts)]
    return partitions


@pytest.mark.parametrize("trial", range(3))
def test_the_lazy_search_finds_the_partitions_of_the_full_table(rng, trial):
    """`_best_partitions` prices a bucket only when its top-down programme reaches it; every
    partition it gives is the full bottom-up table's (buckets, strategies and prices), on lists
    longer than `_MAX_UNITS` too, with ready times and a slowdown during the backward pass."""
    count = int(rng.choice([3, 12, 40, 150]))
    sizes = [int(n) for n in rng.choice([8, 300, 5000, 2**16, 2**20], count)]
    model = dataclasses.replace(cluster(workers=int(rng.integers(2, 17)), gbps=float(rng.choice([0.5, 5, 100])),
                                        c0=float(rng.uniform(1e-5, 1e-3)), c1=float(rng.uniform(1e-10, 1e-8))),
                                overlap_slowdown=float(rng.uniform(1.0, 3.0)))
    compressor = tfcomp.DRAGONN(0.01, min_elements=1)
    tensors = backprop(sizes)
    ready = sorted(float(t) for t in rng.uniform(0.0, 0.05, count))
    lazy = planning._best_partitions(tensors, ready, compressor.strategies, compressor, model, 8)
    full = bottom_up_partitions(tensors, ready, compressor.strategies, compressor, model, 8)
    assert sorted(lazy) == sorted(full) == list(range(1, min(8, count, planning._MAX_UNITS) + 1))
    for y in (2, 1, *range(3, len(full) + 1)):  # y = 2 first: found before the rest is priced
        assert [(list(b.positions), b.strategy, b.predicted) for b in lazy[y]] == [tuple(c) for c in full[y]], y
    with pytest.raises(KeyError):
        lazy[len(full) + 1]


def test_an_all_dense_plan_is_the_searchs_first_candidate(rng):
    """An all-dense search is not run: its partitions all merge into one bucket priced alike, so
    Algorithm 2 keeps y = 1. make_plan's all-dense plans (NoCompression's, the dense twin of a
    compressing plan) are the ones `_search` finds."""
    sizes = [int(n) for n in rng.integers(10, 2**20, size=int(rng.integers(2, 30)))]
    ready = sorted(float(t) for t in rng.uniform(0.0, 0.05, len(sizes)))
    model = cluster(workers=4, gbps=0.5, c0=1e-5, c1=1e-10)
    tensors = backprop(sizes)
    context = (tensors, {p: n for p, n, _ in tensors}, {p: t for (p, _, _), t in zip(tensors, ready)},
               {p: n for p, _, n in tensors})
    for compressor in (tfcomp.NoCompression(), tfcomp.DRAGONN(0.01, min_elements=1)):
        searched = planning._search(context, ready, (st.DENSE,), compressor, model, 8, 0.01)
        plan = planning.make_plan(tensors, compressor, model, ready_seconds=ready)
        assert len(searched.buckets) == 1
        assert (plan.all_dense() if plan.compressed else plan) == searched


@pytest.mark.parametrize("margin, message", [
    (1.0, "margin must be a fraction in [0, 1), got 1.0"), (-0.01, "margin must be a fraction in [0, 1), got -0.01"),
    (float("nan"), "margin must be a fraction in [0, 1), got nan"), ("5%", "margin must be a fraction in [0, 1)"),
    (True, "margin must be a fraction in [0, 1), got True")])
def test_a_margin_is_a_fraction(margin, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        planning.make_plan(backprop([2**20]), tfcomp.DRAGONN(0.01), cluster(), margin=margin)
    with pytest.raises(ValueError, match=re.escape(message)):
        planning.exceeds_margin(1.0, 1.0, margin)


@pytest.mark.parametrize("step", [0.0, -1.0, float("inf"), float("nan"), "1s"])
def test_a_step_is_finite_seconds_above_zero(step):
    with pytest.raises(ValueError, match=re.escape(f"step_seconds must be None or finite seconds > 0, got {step!r}")):
        planning.make_plan(backprop([2**20]), tfcomp.DRAGONN(0.01), cluster(), step_seconds=step)


def test_a_plan_compresses_only_where_its_gain_exceeds_the_margin_of_the_step(rng):
    """The best compressing plan (margin 0) is kept with a margin under its gain's fraction of the
    step and dropped for its all-dense twin above it; the step is the all-dense exchange where not
    given, `step_seconds` where given; compression_could_pay follows the same margin."""
    sizes = [int(n) for n in rng.integers(2**18, 2**22, size=int(rng.integers(2, 8)))]
    ready = sorted(float(t) for t in rng.uniform(0.0, 0.03, len(sizes)))
    model = cluster(workers=8, gbps=float(rng.uniform(0.5, 4.0)), c0=1e-4, c1=float(rng.uniform(1e-10, 2e-9)))
    compressor, untried = tfcomp.DRAGONN(0.01), tfcomp.DRAGONN(0.01, trial_steps=0)
    tensors = backprop(sizes)
    best = planning.make_plan(tensors, compressor, model, ready_seconds=ready, margin=0.0)
    assert best.compressed
    dense_only = planning.make_plan(tensors, tfcomp.DRAGONN(0.01, strategy="dense"), model, ready_seconds=ready)
    gain = planning.predicted_exchange_time(dense_only) - planning.predicted_exchange_time(best)
    assert planning.predicted_gain(best) == pytest.approx(gain, rel=1e-12) and gain > 0
    for step in (None, float(rng.uniform(1.1, 20.0)) * gain):  # a measured step, longer than the gain
        fraction = gain / (planning.predicted_exchange_time(dense_only) if step is None else step)
        for margin, kept in ((0.99 * fraction, True), (1.01 * fraction, False)):
            plan = planning.make_plan(tensors, compressor, model, ready_seconds=ready, margin=margin, step_seconds=step)
            assert plan == (best if kept else best.all_dense()), (step, margin)
            # Calibration's rule plans without ready times, with the same margin.
            after = planning.make_plan(tensors, untried, model, margin=margin, step_seconds=step)
            assert planning.compression_could_pay(tensors, untried, model, margin=margin, step_seconds=step) == bool(
                after.compressed)
    # The default margin: COMPRESSION_MARGIN of the all-dense exchange.
    default = planning.make_plan(tensors, compressor, model, ready_seconds=ready)
    assert bool(default.compressed) == (gain > planning.COMPRESSION_MARGIN * planning.all_dense_time(best))
