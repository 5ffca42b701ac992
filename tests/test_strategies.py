"""Exchange strategies: plans of the network validation's models kept byte for byte.

`test_plans_keep_their_digests` makes the plans of the four models of the network validation
(benchmarks/network_worker.py: giant, many_small, cnn, vit) at K = 2, 4, 8 on the six networks of
its grid, from fixed calibration figures (`CLUSTERS`, written out here, not measured), for the
compressors it runs and the others that reach every strategy, with no ready times and with a
fixed backward pass, and compares each plan's digest (`Plan.digest`, what the ranks compare) with
tests/data/plan_digests.json, recorded before strategies became objects (at 5e3399d): only the
plans of `CHANGED` differ, each for the reason given there. The four plans of `MARGIN_DENSE`, whose
compressing plan gains less than `tfcomp.planning.COMPRESSION_MARGIN`, were recorded again (all
dense) when make_plan got its margin (issue 44); with margin 0 they are made as recorded before.

The models' tensors (names and float32 elements, in variable order) are recorded in
tests/data/validation_models.json. To record them again (builds the models with Keras):

    PYTHONPATH=$PWD python -m tests.test_strategies --models

and to record the digests again from this checkout's planning (only where a change of the plans is
meant; say which plans changed and why in the commit):

    PYTHONPATH=$PWD python -m tests.test_strategies --digests
"""

import json
import pathlib
import re
import sys

import pytest

import tfcomp
from tfcomp import cost_model as cm
from tfcomp import planning
from tfcomp import strategies as st

DATA = pathlib.Path(__file__).parent / "data"
MODELS_FILE = DATA / "validation_models.json"
DIGESTS_FILE = DATA / "plan_digests.json"

WORKERS = (2, 4, 8)
# The network validation's grid (benchmarks/network_validation.py --settings): per network, the
# allreduce's and the allgather's (latency s, bandwidth bytes/s) as calibration might fit them.
NETWORKS = {
    "unshaped": ((45e-6, 1.9e9), (60e-6, 1.5e9)),
    "500mbit": ((180e-6, 58e6), (210e-6, 55e6)),
    "1gbit": ((150e-6, 117e6), (170e-6, 110e6)),
    "2gbit": ((120e-6, 232e6), (140e-6, 220e6)),
    "5gbit": ((100e-6, 560e6), (115e-6, 530e6)),
    "10gbit": ((80e-6, 1.05e9), (95e-6, 0.98e9)),
}
# The compressor's side, the same on every network: encode + decode, per tensor, merge, once per
# exchange, and the per-slot figures of the partitioned allreduce and AR-Topk.
ENCODE_DECODE = cm.AffineCost(3e-4, 4e-9)
PER_TENSOR, COMPRESSION_PER_TENSOR, MERGE_PER_ELEMENT, COMPRESSION_FIXED = 40e-6, 30e-6, 2e-10, 6e-4
PARTITIONED_PER_SLOT, ARTOPK_PER_SLOT = 2e-8, -1e-8
BACKWARD_SECONDS = 0.03  # the fixed backward pass: gradients ready in proportion to the elements before them


def clusters():
    """{(network, K): ClusterModel}: the fixed calibration figures."""
    return {(network, k): cm.ClusterModel(k, cm.Network(*allreduce), cm.Network(*allgather), ENCODE_DECODE,
                                          PER_TENSOR, COMPRESSION_PER_TENSOR, MERGE_PER_ELEMENT, COMPRESSION_FIXED,
                                          partitioned_per_slot=PARTITIONED_PER_SLOT, artopk_per_slot=ARTOPK_PER_SLOT)
            for network, (allreduce, allgather) in NETWORKS.items() for k in WORKERS}


def compressors():
    """{label: compressor}: the network validation's (DRAGONN(0.001) planned, forced to allgather,
    and planning="off"), IntQuant, RandomK, and DRAGONN forced to AR-Topk and to the partitioned
    allreduce, so that every strategy is in some plan."""
    return {"dragonn": tfcomp.DRAGONN(0.001), "dragonn_allgather": tfcomp.DRAGONN(0.001, strategy="allgather"),
            "dragonn_off": tfcomp.DRAGONN(0.001, planning="off"), "intquant": tfcomp.IntQuant(),
            "randomk": tfcomp.RandomK(0.01), "dragonn_artopk": tfcomp.DRAGONN(0.001, strategy="artopk"),
            "dragonn_partitioned": tfcomp.DRAGONN(0.001, strategy="partitioned")}


def backprop_tensors(variables):
    """[(position, name, elements)] in backprop order (the reverse of the variables'), as the exchange plans them."""
    return [(i, name, elements) for i, (name, elements) in reversed(list(enumerate(variables)))]


def fixed_ready(tensors):
    """Seconds from the first gradient to each, in proportion to the elements before it in backprop order."""
    total, before, ready = sum(n for _, _, n in tensors), 0, []
    for _, _, n in tensors:
        ready.append(BACKWARD_SECONDS * before / total)
        before += n
    return ready


def plans():
    """{key: Plan} over models, K, networks, compressors and ready times ("after": none, "during": `fixed_ready`)."""
    models = json.loads(MODELS_FILE.read_text())
    out = {}
    for model, variables in sorted(models.items()):
        tensors = backprop_tensors(variables)
        for (network, k), cluster in clusters().items():
            for label, compressor in compressors().items():
                for timing, ready in (("after", None), ("during", fixed_ready(tensors))):
                    key = f"{model}/K={k}/{network}/{label}/{timing}"
                    if compressor.planning == "off":
                        out[key] = planning.per_tensor_plan(tensors, compressor, cluster)
                    else:
                        out[key] = planning.make_plan(tensors, compressor, cluster, ready_seconds=ready)
    return out


def plan_summary(plan) -> str:
    """The plan's buckets in brief (tensors and strategy each), for a failure's message."""
    return " ".join(f"{len(b.positions)}:{b.strategy}" for b in plan.buckets)


# Plans that changed on purpose since the record, with their buckets now and why.
CHANGED = {
    # IntQuant's allreduce group now pays its scales' allgather in the plan's price too (before, only
    # the search's bucket prices had it): 3 x (170 us + 4 B / 110 MB/s) = 0.51 ms more makes the plan
    # (42 dense tensors, 40 IntQuant, 43.532 ms) slower than all dense (43.576 ms).
    "many_small/K=4/1gbit/intquant/during": "82:dense",
}


# Plans that the margin (issue 44) made all dense: the predicted gain of the compressing plan they were before, as a
# fraction of the all-dense exchange (the step make_plan takes without step_seconds), and that plan's digest. The next
# smallest gain of a compressing plan of the grid is 7.1 % (vit/K=8/10gbit/intquant/after): it stays.
MARGIN_DENSE = {
    "cnn/K=8/5gbit/dragonn/during": (0.0028, 271239232503598673),  # 16 dense, 6 allgather: 46.191 against 46.320 ms
    "many_small/K=8/2gbit/randomk/during": (0.0158, 1082156045541261688),  # 42 dense, 40 allreduce
    "many_small/K=8/2gbit/dragonn/during": (0.0357, 132854254238647162),  # 42 dense, 40 allgather
    "giant/K=4/5gbit/intquant/during": (0.0447, 527938453186092473),  # 3 allreduce, 1 dense: 90.765 against 95.012 ms
}


def test_plans_keep_their_digests():
    recorded = json.loads(DIGESTS_FILE.read_text())
    made = plans()
    assert sorted(made) == sorted(recorded)
    changed = {key: (recorded[key], plan_summary(plan)) for key, plan in made.items()
               if plan.digest() != recorded[key]["digest"]}
    assert {key: now for key, (_, now) in changed.items()} == CHANGED, f"{len(changed)} plans changed: {changed}"


def test_the_margin_turned_only_the_small_gains_dense():
    """The plans of `MARGIN_DENSE` are all dense now; with margin 0 (the rule before: compress where
    predicted no slower than dense) each is made as recorded before, compressing, for a gain under
    the margin. Every other compressing plan of the grid gains more than the margin."""
    models = json.loads(MODELS_FILE.read_text())
    figures = clusters()
    for key, (fraction, before) in MARGIN_DENSE.items():
        model, k, network, label, timing = key.split("/")
        tensors = backprop_tensors(models[model])
        ready = fixed_ready(tensors) if timing == "during" else None
        cluster, compressor = figures[network, int(k[2:])], compressors()[label]
        assert not planning.make_plan(tensors, compressor, cluster, ready_seconds=ready).compressed, key
        old = planning.make_plan(tensors, compressor, cluster, ready_seconds=ready, margin=0.0)
        assert old.compressed and old.digest() == before, key
        gain = planning.predicted_gain(old) / planning.all_dense_time(old)
        assert gain == pytest.approx(fraction, abs=5e-5) and 0 < gain < planning.COMPRESSION_MARGIN, key
    for key, plan in plans().items():
        if plan.compressed and plan.dense_buckets:  # planned, not forced nor off
            assert planning.predicted_gain(plan) > planning.COMPRESSION_MARGIN * planning.all_dense_time(plan), key


def _record_models() -> None:
    sys.argv = sys.argv[:1]  # network_worker's flags are not ours
    from benchmarks.network_worker import MODELS

    models = {}
    for name, (build, _, _) in MODELS.items():
        models[name] = [[v.name, int(v.shape.num_elements())] for v in build().trainable_variables]
    MODELS_FILE.write_text(json.dumps(models, indent=1) + "\n")


def _record_digests() -> None:
    DIGESTS_FILE.write_text(json.dumps({key: {"digest": plan.digest(), "buckets": plan_summary(plan)}
                                        for key, plan in sorted(plans().items())}, indent=1) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] not in (["--models"], ["--digests"]):
        sys.exit(f"usage: python -m tests.test_strategies --models | --digests\n{__doc__}")
    _record_models() if sys.argv[1] == "--models" else _record_digests()


def _random_cluster(rng, workers: int) -> cm.ClusterModel:
    """Figures drawn afresh: two networks, compression, per-tensor and per-slot costs."""
    def network():
        return cm.Network(float(rng.uniform(0, 5e-4)), float(rng.uniform(1e7, 1e10)))

    return cm.ClusterModel(workers, network(), network(), cm.AffineCost(float(rng.uniform(0, 1e-3)),
                                                                        float(rng.uniform(0, 1e-8))),
                           float(rng.uniform(0, 1e-4)), float(rng.uniform(0, 1e-4)), float(rng.uniform(0, 1e-9)),
                           float(rng.uniform(0, 1e-3)), partitioned_per_slot=float(rng.uniform(-1e-8, 1e-8)),
                           artopk_per_slot=float(rng.uniform(-1e-8, 1e-8)))


PRICED = [(tfcomp.DRAGONN(0.01, artopk_owner="var"), name) for name in ("allgather", "artopk", "partitioned")] + [
    (tfcomp.TopK(0.01), "artopk"), (tfcomp.RandomK(0.01), "allreduce"), (tfcomp.IntQuant(8), "allreduce"),
    (tfcomp.IntQuant(16), "allreduce"), (tfcomp.QSGD(), "allgather"), (tfcomp.NoCompression(), "dense"),
    (tfcomp.FP16(), "dense")]


@pytest.mark.parametrize("compressor, name", PRICED, ids=[f"{type(c).__name__}-{n}" for c, n in PRICED])
def test_a_plans_price_is_what_the_search_priced_its_bucket_at(rng, compressor, name):
    """For every strategy (IntQuant's allreduce with its scales' allgather included), the plan's
    price (`predicted_exchange_time`, the final choice) of a bucket after the backward pass is what
    the search priced it at (its `predicted`, from `Strategy.time`), plus what compressing costs once
    per exchange."""
    workers = int(rng.choice([2, 3, 4, 8]))
    cluster = _random_cluster(rng, workers)
    sizes = [int(n) for n in rng.integers(1, 10**6, size=int(rng.integers(1, 6)))]
    config = {**compressor.get_config(), "strategy": name, "min_elements": 1}
    if compressor.strategies == (st.DENSE,):
        forced = compressor
    else:
        forced = type(compressor)(**config)
    plan = planning.make_plan(backprop_tensors([[f"t{i}", n] for i, n in enumerate(sizes)]), forced, cluster,
                              max_groups=1)
    bucket, = plan.buckets
    assert bucket.strategy == name and bucket.strategy is st.named(name) and bucket.elements == sum(sizes)
    once = cluster.compression_fixed if bucket.strategy.compresses else 0.0
    priced = bucket.predicted.total + once
    assert planning.predicted_exchange_time(plan) == pytest.approx(priced, rel=1e-12)
    # The search's candidate for one bucket is the same bucket at the same price.
    search, = planning._best_partitions(
        backprop_tensors([[f"t{i}", n] for i, n in enumerate(sizes)]), [0.0] * len(sizes), (bucket.strategy,),
        forced, cluster, 1)[1]
    assert search.predicted == bucket.predicted


def test_intquants_group_pays_one_allgather_of_its_scales(rng):
    """Buckets of one allreduce group: one ring allreduce of all payloads and one allgather of one
    float32 scale per bucket (as the exchange gathers them), for IntQuant; none for RandomK."""
    cluster = _random_cluster(rng, 4)
    sizes = [int(n) for n in rng.integers(10**4, 10**6, size=3)]
    for compressor, scales in ((tfcomp.IntQuant(8), True), (tfcomp.RandomK(0.01), False)):
        summed = cm.ring_allreduce(sum(compressor.payload_bytes(n) + 4 for n in sizes), 4, cluster.allreduce)
        expected = summed + (cm.ring_allgather(4 * len(sizes), 4, cluster.allgather) if scales else 0.0)
        assert st.ALLREDUCE.communication(sizes, compressor, cluster) == pytest.approx(expected, rel=1e-12)


def test_every_name_parses_to_its_registered_strategy_and_others_are_refused():
    assert st.NAMES == ("dense", "allgather", "allreduce", "artopk", "partitioned")
    for name, strategy in st.STRATEGIES.items():
        assert st.parse(name, "--strategy") is strategy and strategy.name == name == strategy
        assert st.parse(strategy, "--strategy") is strategy
    assert [s.compresses for s in st.STRATEGIES.values()] == [False, True, True, True, True]
    for bad in ("Dense", "ring", "", None, 3):
        with pytest.raises(ValueError, match=r"--strategy must be one of \('dense', 'allgather', 'allreduce', "
                                             r"'artopk', 'partitioned'\), got " + re.escape(repr(bad))):
            st.parse(bad, "--strategy")
    with pytest.raises(ValueError, match=r"strategy must be None or one of \('dense', 'allreduce'\) for RandomK"):
        tfcomp.RandomK(strategy="allgather")
    with pytest.raises(ValueError, match=r"Bucket.strategy must be one of .* got 'ring'"):
        planning.Bucket((0,), 1, "ring", None, 0.0)


def test_compressors_declare_registered_strategies_dense_first():
    for compressor in (tfcomp.DRAGONN(), tfcomp.DGC(), tfcomp.TopK(), tfcomp.RandomK(), tfcomp.EFSignSGD(),
                       tfcomp.QSGD(), tfcomp.IntQuant(), tfcomp.FP16(), tfcomp.NoCompression()):
        assert compressor.strategies[0] is st.DENSE
        assert all(st.STRATEGIES[s.name] is s for s in compressor.strategies)
        assert compressor.collective in compressor.strategies
        assert compressor.collective.compresses == (compressor.strategies != (st.DENSE,))
    forced = tfcomp.DRAGONN(strategy="partitioned")
    assert forced.strategy is st.PARTITIONED and "strategy='partitioned'" in repr(forced)


# Lines of tfcomp's modules other than tfcomp/strategies.py that quote a strategy's name, by module.
QUOTING = {
    "cost_model.py": 1,  # ClusterModel's `allreduce` and `allgather` networks: collectives, not strategies
    "exchange.py": 2,  # a gradient's kind ("dense" or "sparse") and a dense tensor's record ("allreduce")
    "planner.py": 1,  # a gradient's kind, "dense" or "sparse": not a strategy
}


def test_strategy_names_appear_only_in_the_strategies_module():
    """tfcomp's modules switch on strategy objects, never on their names: a quoted name outside
    tfcomp/strategies.py is a collective's or not a strategy's (`QUOTING`)."""
    quoted = re.compile(r"""["'](dense|allgather|allreduce|artopk|partitioned)["']""")
    package = pathlib.Path(tfcomp.__file__).parent
    found = {}
    for path in sorted(package.rglob("*.py")):
        lines = sum(bool(quoted.search(line)) for line in path.read_text().splitlines())
        if lines and path.name != "strategies.py":
            found[str(path.relative_to(package))] = lines
    assert found == QUOTING
