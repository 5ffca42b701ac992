"""The papers' published comparisons on the cost model (benchmarks.paper_verdicts): how many agree
now, and every one that does not as a strict xfail saying why, so the suite flips when the model does."""

import pytest

from benchmarks import paper_verdicts as pv
from tfcomp import compressors, planning
from tfcomp import cost_model as cm
from tfcomp import strategies as st

VERDICTS = pv.verdicts()

_ALPHA_000 = ("dense's four 25 MB buckets pay 8 (K-1) alpha of latency (25 ms at 64 GPUs with the assumed alpha of "
              "50 us, which 000 does not give); with alpha <= 10 us dense wins")
_ALLGATHER_LATENCY = ("tfcomp's ring_allgather pays (K-1) alpha = 7 ms of latency on 8 workers; 003 Table I (and its "
                      "measurements) alpha log2 K = 3 ms, which makes AG the fastest")
_FLAT_RING = ("the flat 16-GPU ring charges each server's link 2S(K-1)/K; 2 servers of 8 NVLinked GPUs moved less "
              "over the wire (priced as a 2-worker ring: 0.107 at 1 Gbit/s, 0.78 at 10)")
_CYCLE_TICK = ("horovod_dense_finish starts the last fusion at the 5 ms cycle tick after the backward pass (65 ms for "
               "61), where 002's simulator sends the rest when it ends; with cycle 0 it is 0.999")
MISSES = {
    "000/resnet50/8gpu/signsgd": (
        "a near tie (156.6 against 164.3 ms): Table 3's encode-decode leaves out gathering the gradients into one "
        "buffer and copying them back (000 App. C), and the ring allgather is priced at the full link rate (App. C "
        "saw allgather up to 19.1 % slower: incast); with gamma 1.0 dense wins"),
    "000/resnet50/64gpu/powersgd4": _ALPHA_000,
    "000/resnet50/96gpu/powersgd4": _ALPHA_000,
    "000/resnet50/crossover": (
        "near 9 Gbit/s the model's dense exchange is communication-bound (97.5 MiB ring-allreduced over 64 GPUs takes "
        "179 ms at 9 Gbit/s, more than PowerSGD-4's 122 + 45 + 2 ms): they tie at 9.5 Gbit/s even with alpha 0"),
    "002/resnet50/16gpu/1gbit": _FLAT_RING,
    "002/resnet50/16gpu/10gbit": _FLAT_RING,
    "002/resnet50/16gpu/100gbit": _CYCLE_TICK,
    "002/resnet50/32gpu/100gbit": _CYCLE_TICK,
    "002/resnet50/64gpu/100gbit": _CYCLE_TICK,
    "003/resnet18/5gbit/cr0.01": _ALLGATHER_LATENCY,
    "003/resnet50/10gbit/cr0.01": _ALLGATHER_LATENCY,
    "003/resnet50/1gbit/cr0.001": _ALLGATHER_LATENCY,
    "003/vit/10gbit/cr0.001": _ALLGATHER_LATENCY,
    "003/vit/5gbit/cr0.001": _ALLGATHER_LATENCY,
}


def _case(verdict):
    reason = MISSES.get(verdict.key)
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(verdict, id=verdict.key, marks=marks)


@pytest.mark.parametrize("verdict", [_case(v) for v in VERDICTS])
def test_published_outcome_is_predicted(verdict):
    assert verdict.agree, f"{verdict.comparison}: published {verdict.published}, predicted {verdict.predicted}"


def test_agreements_per_paper():
    assert pv.counts(VERDICTS) == {"000": (22, 26), "001": (3, 3), "002": (1, 6), "003": (31, 36)}
    assert len({v.key for v in VERDICTS}) == len(VERDICTS)
    assert set(MISSES) <= {v.key for v in VERDICTS}


def test_003_misses_are_all_allgather_priced_above_tree():
    missed = [v for v in pv.paper_003() if not v.agree]
    assert missed and all(v.published.startswith("AG ") and v.predicted.startswith("ART-Tree ") for v in missed)


def test_003_with_log2_allgather_latency_all_36_agree():
    assert pv.counts(pv.paper_003(pv.allgather_log2_latency)) == {"003": (36, 36)}


def test_003_prices_are_what_the_strategies_price(rng):
    """The direct collectives behind the 003 verdicts are what the planner's strategies charge (but
    for the 4-byte count of non-finite values it adds to a payload)."""
    for _ in range(20):
        elements, ratio = int(rng.integers(10**5, 10**9)), float(rng.choice([0.1, 0.01, 0.001]))
        network = cm.Network(float(rng.uniform(0, 1e-2)), float(rng.uniform(1e7, 1e11)))
        cluster = cm.ClusterModel(pv.WORKERS_003, network, network, cm.AffineCost(0.0, 0.0))
        topk = compressors.TopK(ratio)
        priced = [strategy.time(elements, topk, cluster).total
                  for strategy in (st.ALLGATHER, st.ARTOPK, st.ArTopk(tree=True))]
        assert priced == pytest.approx(pv.collectives_003(elements, ratio, network), rel=1e-3)


def test_000_only_the_latency_free_misses_remain_at_alpha_10us():
    missed = {v.key for v in pv.paper_000(latency=10e-6) if not v.agree}
    assert missed == {"000/resnet50/8gpu/signsgd", "000/resnet50/crossover"}
    assert {v.key for v in pv.paper_000(latency=0.0, gamma=1.0) if not v.agree} == {"000/resnet50/crossover"}


def test_000_crossover_is_above_9_gbits_even_without_latency():
    crossover = next(v for v in pv.paper_000(latency=0.0, gamma=1.0) if v.key == "000/resnet50/crossover")
    assert 9.0 < float(crossover.predicted.split()[0]) < 10.0


def test_002_at_100_gbits_agrees_without_the_cycle_tick(monkeypatch):
    monkeypatch.setitem(pv.P002, "cycle_s", 0.0)
    assert all(v.agree for v in pv.paper_002() if v.key.endswith("/100gbit"))


def test_two_bucket_finish_overlaps_the_first_bucket_with_the_backward_pass():
    # Two gradients ready at 1 and 2 s, each bucket costs its elements in seconds: the first split
    # sends [1] at 1..2 and [1] at 2..3; the only split there is.
    assert pv.two_bucket_finish([1, 1], [1.0, 2.0], lambda elements, tensors: float(elements)) == 3.0
    # Three: [4] ready at 1 is done at 5, then [1, 1] at 5..7; [4, 1] at 2..7, then [1] at 7..8: 7 wins.
    assert pv.two_bucket_finish([4, 1, 1], [1.0, 2.0, 3.0], lambda elements, tensors: float(elements)) == 7.0


@pytest.mark.parametrize("workers", sorted(pv.P001["gains"]))
def test_planning_gains_at_least_what_two_fp16_groups_gain(workers):
    """001 Table 2: FP16 in two groups against one. The exchange sends FP16's dense tensors one
    allreduce each as they are ready, fused by Horovod, and make_plan, given the gradients' ready
    times, prices them so (Horovod's replay): at least 001's gain of two groups over one (the
    verdict itself is `two_bucket_finish`'s, paper_001)."""
    p = pv.P001
    sizes = pv._even_tensors(p["resnet101"], p["resnet101_tensors"])
    backward = p["resnet101_backward_s"]
    forward = p["forward_share"] * backward
    ready = pv._ready_in_proportion(sizes, backward)
    network = cm.Network(0.0, pv._pcie_gbits_001() * 1e9 / 8)
    cluster = cm.ClusterModel(workers, network, network, cm.AffineCost(0.0, 0.0))
    tensors = [(i, f"g{i}", n) for i, n in enumerate(sizes)]  # in backprop order, as `ready` is
    fp16 = compressors.FP16()
    one = forward + backward + st.DENSE.time(sum(sizes), fp16, cluster, tensors=len(sizes)).total

    def gain(max_groups):
        plan = planning.make_plan(tensors, fp16, cluster, ready_seconds=ready, max_groups=max_groups)
        return one / (forward + max(backward, planning.predicted_exchange_time(plan))), plan

    two, plan = gain(2)
    assert planning.predicted_exchange_time(plan) == pytest.approx(
        cm.horovod_dense_finish(sizes, ready, cluster, element_bytes=fp16.dense_element_bytes))
    assert two >= p["gains"][workers] - pv.GAIN_TOLERANCE
    assert gain(8)[0] == pytest.approx(two)


def test_main_prints_the_table_and_the_agreements(capsys):
    assert pv.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| paper | source | comparison | published | predicted | agree |")
    assert out.count("\n| 00") == len(VERDICTS)
    assert "- 003: 31 of 36 agree" in out and "- 000: 22 of 26 agree" in out
    assert pv.main(["--allgather-latency=log2"]) == 0
    assert "- 003: 36 of 36 agree" in capsys.readouterr().out
