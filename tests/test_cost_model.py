"""The alpha-beta formulas against hand-computed values, the 004 Eq. 1 decision, affine fits, parsing."""

import dataclasses
import math
import re
import sys

import numpy as np
import pytest

from tfcomp import cost_model as cm

NET = cm.Network(latency=1e-3, bandwidth=1.25e9)  # 1 ms, 10 Gbit/s


def test_collective_formulas(rng):
    s = float(rng.uniform(1e3, 1e9))
    k = int(rng.integers(2, 64))
    a, b = NET.latency, NET.bandwidth
    assert cm.ring_allreduce(s, k, NET) == pytest.approx(2 * (k - 1) * (a + s / (k * b)))
    assert cm.tree_allreduce(s, k, NET) == pytest.approx(2 * math.log2(k) * (a + s / b))
    assert cm.broadcast(s, k, NET) == pytest.approx(math.log2(k) * (a + s / b))
    assert cm.ring_allgather(s, k, NET) == pytest.approx((k - 1) * (a + s / b))
    # 003 Eq. 4a / 4b with M c = s: alpha [2 (N-1) + log N] + M c beta [2 (N-1) / N + log N]; 3 alpha log N + 3 M c beta log N
    assert cm.artopk_ring(s, s, k, NET) == pytest.approx(a * (2 * (k - 1) + math.log2(k)) + s / b * (2 * (k - 1) / k + math.log2(k)))
    assert cm.artopk_tree(s, s, k, NET) == pytest.approx(3 * a * math.log2(k) + 3 * s / b * math.log2(k))


def test_one_worker_communicates_for_free():
    for collective in (cm.ring_allreduce, cm.tree_allreduce, cm.broadcast, cm.ring_allgather):
        assert collective(1e6, 1, NET) == 0.0


def test_eq1_compresses_big_tensors_on_slow_links_only():
    dense = 4 * 2**24  # 16 Mi float32
    payload = 8 * round(0.001 * 2**24)
    slow = cm.Network(1e-4, cm.parse_bandwidth("1Gbps"))
    fast = cm.Network(1e-6, cm.parse_bandwidth("400Gbps"))
    assert cm.compression_pays(dense, payload, 8, slow, encode_decode_seconds=0.01)
    assert not cm.compression_pays(dense, payload, 8, fast, encode_decode_seconds=0.01)
    # A small tensor: allgather even saves latency terms ((K-1) alpha against 2 (K-1) alpha), but not
    # more than a fixed per-op encode/decode overhead of 1 ms costs.
    assert not cm.compression_pays(4 * 1024, 8, 8, slow, encode_decode_seconds=1e-3)


def test_affine_fit_recovers_the_line(rng):
    c0, c1 = float(rng.uniform(1e-5, 1e-3)), float(rng.uniform(1e-10, 1e-8))
    sizes = np.array([2**p for p in range(10, 26, 2)], dtype=float)
    times = c0 + c1 * sizes + rng.normal(0, c0 * 0.01, sizes.size)
    fitted = cm.AffineCost.fit(sizes, times)
    assert fitted.c1 == pytest.approx(c1, rel=0.05)
    assert fitted(2**20) == pytest.approx(c0 + c1 * 2**20, rel=0.05)
    with pytest.raises(ValueError, match="at least two distinct sizes"):
        cm.AffineCost.fit([5, 5], [1.0, 2.0])


@pytest.mark.parametrize("text, seconds", [("1ms", 1e-3), ("250us", 2.5e-4), ("0.5 s", 0.5), ("1e-3s", 1e-3)])
def test_parse_latency(text, seconds):
    assert cm.parse_latency(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text, bytes_per_s", [
    ("10Gbps", 1.25e9), ("100Mbps", 1.25e7), ("2GB/s", 2e9), ("10Gbit/s", 1.25e9), ("10 gbit", 1.25e9),
    ("400 Mb/s", 5e7), ("1.5e3 kbit/s", 1.875e5), ("3 TB/s", 3e12), ("8 bit/s", 1.0)])
def test_parse_bandwidth(text, bytes_per_s):
    assert cm.parse_bandwidth(text) == pytest.approx(bytes_per_s)


@pytest.mark.parametrize("call, message", [
    (lambda: cm.parse_latency("fast"), r"latency must be a number with a unit .* got 'fast'"),
    (lambda: cm.parse_bandwidth("10 parsecs"), r"bandwidth must be a number with a unit .* got '10 parsecs'"),
    (lambda: cm.parse_bandwidth("10 GBPS"), r"bandwidth must be a number with a unit .* got '10 GBPS'"),
    (lambda: cm.parse_bandwidth("10"), r"bandwidth must be a number with a unit .* got '10'"),
    (lambda: cm.parse_count("25.6Q", "--params"), r"--params must be a number of elements, .* got '25.6Q'"),
    (lambda: cm.parse_count("1.0001k", "--params"), r"--params must be a whole number of elements >= 1, got '1.0001k'"),
    (lambda: cm.Network(-1.0, 1e9), r"latency must be a finite number of seconds >= 0, got -1.0"),
    (lambda: cm.Network(1e-3, 0), r"bandwidth must be a finite number of bytes per second > 0, got 0"),
    (lambda: cm.ring_allreduce(1e6, 0, NET), r"workers must be an integer >= 1, got 0"),
])
def test_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("text, count", [("126000000", 126000000), ("25.6M", 25600000), ("1.2e8", 120000000),
                                         ("3k", 3000), ("2 G", 2 * 10**9), ("1B", 10**9)])
def test_parse_count(text, count):
    assert cm.parse_count(text, "--params") == count


def horovod_cluster(workers, per_tensor=0.0) -> cm.ClusterModel:
    return cm.ClusterModel(workers, NET, NET, cm.AffineCost(0.0, 0.0), per_tensor=per_tensor)


def test_horovod_fuses_what_is_ready_and_overlaps_the_rest(rng):
    k, per_tensor = int(rng.integers(2, 16)), float(rng.uniform(0, 1e-4))
    cluster = horovod_cluster(k, per_tensor)
    sizes = [int(n) for n in rng.integers(1000, 10**6, 20)]
    # All ready at once: one fused allreduce (they fit in 128 MiB), started at the first cycle (0).
    fused = cm.ring_allreduce(4 * sum(sizes), k, NET) + len(sizes) * per_tensor
    assert cm.horovod_dense_finish(sizes, [0.0] * 20, cluster) == pytest.approx(fused)
    # Ready far apart: each its own allreduce right after it is ready (rounded up to a cycle).
    ready = [1.0 * (i + 1) + 0.0004 for i in range(20)]
    last = cm.ring_allreduce(4 * sizes[-1], k, NET) + per_tensor
    assert cm.horovod_dense_finish(sizes, ready, cluster) == pytest.approx(20.001 + last)
    # In any order: Horovod takes them as they become ready.
    order = rng.permutation(20)
    assert cm.horovod_dense_finish([sizes[i] for i in order], [ready[i] for i in order], cluster) == pytest.approx(
        20.001 + last)


def test_horovod_fusion_buffer_splits_what_does_not_fit(rng):
    k = int(rng.integers(2, 16))
    sizes = [40 * 2**20 // 4] * 4  # 4 tensors of 40 MiB: 3 fit in 128 MiB, then 1
    expected = cm.ring_allreduce(3 * 40 * 2**20, k, NET) + cm.ring_allreduce(40 * 2**20, k, NET)
    assert cm.horovod_dense_finish(sizes, [0.0] * 4, horovod_cluster(k)) == pytest.approx(expected)
    assert cm.horovod_dense_finish(sizes, [0.0] * 4, horovod_cluster(k), fusion_bytes=0) == pytest.approx(
        4 * cm.ring_allreduce(40 * 2**20, k, NET))
    with pytest.raises(ValueError, match="need one ready time per gradient, got 3 for 4 gradients"):
        cm.horovod_dense_finish(sizes, [0.0] * 3, horovod_cluster(k))


def random_cluster(rng) -> cm.ClusterModel:
    return cm.ClusterModel(int(rng.integers(1, 1000)),
                           cm.Network(float(rng.uniform(0, 1e-2)), float(rng.uniform(1e6, 1e11))),
                           cm.Network(float(rng.uniform(0, 1e-2)), float(rng.uniform(1e6, 1e11))),
                           cm.AffineCost(float(rng.uniform(0, 1e-2)), float(rng.uniform(0, 1e-8))),
                           float(rng.uniform(0, 1e-4)), float(rng.uniform(0, 1e-4)), float(rng.uniform(0, 1e-9)),
                           float(rng.uniform(0, 1e-3)), partitioned_per_slot=float(rng.uniform(-1e-7, 1e-7)),
                           artopk_per_slot=float(rng.uniform(-1e-7, 1e-7)))


FIELDS = ["workers", *cm.CLUSTER_LIMITS]  # the order of to_list
ABSURD = [math.nan, math.inf, -math.inf, 1e308, -1e-9, "1e-3", None, True]


@pytest.mark.parametrize("field", FIELDS)
def test_absurd_figures_are_refused_naming_the_field(rng, field):
    good = random_cluster(rng).to_list()
    position = FIELDS.index(field)
    above = cm.CLUSTER_LIMITS[field][1] * float(rng.uniform(1.01, 1e6)) if field != "workers" else 2.0**31
    low = cm.CLUSTER_LIMITS[field][0] if field != "workers" else 1
    below = [low - 1e-9] if low == 0 else [low * float(rng.uniform(1.01, 1e6))]  # signed fields: below their least
    for bad in [b for b in ABSURD if b != -1e-9] + below + [above, 10**400] + ([0, 0.0, 2.5, -3] if field == "workers" else []):
        figures = list(good)
        figures[position] = bad
        with pytest.raises(ValueError) as caught:
            cm.ClusterModel.from_list(figures)
        message = str(caught.value)
        assert f"ClusterModel.{field} must be" in message and repr(bad) in message, message


@pytest.mark.parametrize("field", ["encode_decode.c0", "encode_decode.c1", "per_tensor", "compression_per_tensor",
                                   "merge_per_element", "compression_fixed"])
def test_constructing_a_cluster_model_validates_it(rng, field):
    """The constructor and dataclasses.replace check every figure (planning never sees a bad one)."""
    model = random_cluster(rng)
    owner, _, name = field.rpartition(".")
    for bad in (math.nan, math.inf, 1e308, -float(rng.uniform(1e-9, 1.0))):
        with pytest.raises(ValueError, match=rf"ClusterModel.{re.escape(field)} must be a finite number of .*, got"):
            if owner:
                dataclasses.replace(model, encode_decode=dataclasses.replace(model.encode_decode, **{name: bad}))
            else:
                dataclasses.replace(model, **{name: bad})


def test_networks_of_absurd_figures_are_refused_in_a_cluster_model(rng):
    """Network accepts any finite figures (the what-if's user may ask about anything); a
    ClusterModel refuses a latency of more than an hour or a bandwidth of more than 1e18 B/s."""
    model = random_cluster(rng)
    latency = float(10 ** rng.uniform(3.6, 308))
    message = rf"ClusterModel.allreduce.latency must be .* \[0, 3600\], got {re.escape(repr(latency))}"
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(model, allreduce=cm.Network(latency, 1e9))
    with pytest.raises(ValueError, match=r"ClusterModel.allgather.bandwidth must be .* \(0, 1e\+18\], got 1e\+300"):
        dataclasses.replace(model, allgather=cm.Network(0.0, 1e300))


@pytest.mark.parametrize("workers", [0, -1, 2.0, True, np.int64(0), 2**31])
def test_cluster_model_workers_must_be_an_int_of_at_least_one(workers):
    net = cm.Network(1e-4, 1e9)
    message = rf"ClusterModel.workers must be an integer in \[1, 2147483647\], got {re.escape(repr(workers))}"
    with pytest.raises(ValueError, match=message):
        cm.ClusterModel(workers, net, net, cm.AffineCost(0.0, 0.0))


def test_cluster_model_fields_must_have_their_types():
    net = cm.Network(1e-4, 1e9)
    with pytest.raises(ValueError, match=r"ClusterModel.allgather must be of type Network, got \(0.0001, 1000000000.0\)"):
        cm.ClusterModel(2, net, (1e-4, 1e9), cm.AffineCost(0.0, 0.0))
    with pytest.raises(ValueError, match=r"ClusterModel.encode_decode must be of type AffineCost, got None"):
        cm.ClusterModel(2, net, net, None)


def test_from_list_needs_thirteen_numbers_and_round_trips(rng):
    model = random_cluster(rng)
    assert cm.ClusterModel.from_list(model.to_list()) == model
    assert cm.ClusterModel.from_list(np.array(model.to_list())) == model
    assert model.validate() is model
    length = int(rng.choice([0, 1, 11, 12, 14, 40]))
    with pytest.raises(ValueError, match=rf"ClusterModel figures must be 13 numbers \(workers, .*\), got {length}"):
        cm.ClusterModel.from_list([1.0] * length)
    # The extremes still allowed: what no measurement prices (UNMEASURED), latency 0.
    assert cm.ClusterModel.unpriced(int(rng.integers(1, 2**31 - 1))).allreduce == cm.UNMEASURED


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_transfer_end_runs_slower_until_the_backward_pass_ends(rng):
    for _ in range(50):
        start, seconds = float(rng.uniform(0, 1)), float(rng.uniform(0, 1))
        busy_until, slowdown = float(rng.uniform(0, 2)), float(rng.uniform(1, 20))
        end = cm.transfer_end(start, seconds, busy_until, slowdown)
        # Reference: integrate the transfer's progress in small time steps.
        t, done, dt = start, 0.0, 1e-5
        while done < seconds:
            done += dt / slowdown if t < busy_until else dt
            t += dt
        assert end == pytest.approx(t, abs=3e-5 * slowdown)
        assert start + seconds <= end <= start + seconds * slowdown + 1e-12
    assert cm.transfer_end(0.5, 0.2, 0.4, 5.0) == 0.7   # starts after the backward pass: full speed
    assert cm.transfer_end(0.0, 0.1, 1.0, 3.0) == pytest.approx(0.3)  # all of it beside the pass
    assert cm.transfer_end(0.0, 0.3, 0.3, 3.0) == pytest.approx(0.5)  # a third beside, the rest after


def test_overlap_slowdown_is_validated_and_left_out_of_the_list(rng):
    model = random_cluster(rng)
    assert model.overlap_slowdown == 1.0
    slowed = dataclasses.replace(model, overlap_slowdown=float(rng.uniform(1, cm.MAX_OVERLAP_SLOWDOWN)))
    assert slowed.to_list() == model.to_list()  # measured in training, not by calibration
    for bad in (0.5, 0.0, -2.0, math.nan, math.inf, cm.MAX_OVERLAP_SLOWDOWN * 1.01, True, "2", None):
        with pytest.raises(ValueError, match=r"ClusterModel.overlap_slowdown must be a finite number in \[1, 20\]"):
            dataclasses.replace(model, overlap_slowdown=bad)

