"""Exchange strategies: plans of the network validation's models kept byte for byte.

`test_plans_keep_their_digests` makes the plans of the four models of the network validation
(benchmarks/network_worker.py: giant, many_small, cnn, vit) at K = 2, 4, 8 on the six networks of
its grid, from fixed calibration figures (`CLUSTERS`, written out here, not measured), for the
compressors it runs and the others that reach every strategy, with no ready times and with a
fixed backward pass, and compares each plan's digest (`Plan.digest`, what the ranks compare) with
tests/data/plan_digests.json, recorded before strategies became objects.

The models' tensors (names and float32 elements, in variable order) are recorded in
tests/data/validation_models.json. To record them again (builds the models with Keras):

    PYTHONPATH=$PWD python -m tests.test_strategies --models

and to record the digests again from this checkout's planning (only where a change of the plans is
meant; say which plans changed and why in the commit):

    PYTHONPATH=$PWD python -m tests.test_strategies --digests
"""

import json
import pathlib
import sys

import tfcomp
from tfcomp import cost_model as cm
from tfcomp import planning

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


def test_plans_keep_their_digests():
    recorded = json.loads(DIGESTS_FILE.read_text())
    made = plans()
    assert sorted(made) == sorted(recorded)
    changed = {key: (recorded[key], plan_summary(plan)) for key, plan in made.items()
               if plan.digest() != recorded[key]["digest"]}
    assert not changed, f"{len(changed)} plans changed: {sorted(changed.items())[:10]}"


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
