"""What-if: the cost model's prediction of one step's gradient exchange, without a cluster.

    python -m tfcomp.whatif --params 126000000 --workers 8 --latency 1ms --bandwidth 10Gbps \\
        --compressor dragonn --ratio 0.001 [--encode-ms 12] [--compute-ms 80] [--json] [--plot out.png]
    python -m tfcomp.whatif --profile model_profile.json ...   # see save_profile()

For each strategy (dense ring allreduce, the compressor's allgather (or RandomK's allreduce), AR-Topk
with ring and with tree reduction for the index-value sparsifiers) it prints the predicted
communication, compression (encode + decode) and total time per step, all gradients merged into one
bucket as MergeComp does (with a profile, the per-tensor costs of its tensors count), and the strategy it would choose. total = compute (--compute-ms, default
0) + compression + communication. Without --encode-ms, the encode+decode time is measured here, on
this machine, by the same pipeline calibration times (a few seconds; needs the op library).
--json prints {"strategies": [{"name", "communication_s", "compression_s", "total_s"}], "choice":
name}; --plot draws the predicted step time of each strategy against bandwidth (0.1 to 100 Gbit/s).
With --profile, the text output also shows the plan tfcomp would make for the model's tensors.
Bad arguments exit with status 2 and a one-line message.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys

from tfcomp import cost_model as cm

__all__ = ["main", "predict", "save_profile"]

_COMPRESSORS = ("dragonn", "dgc", "topk", "randomk", "efsignsgd", "qsgd")


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not the usage block
        raise _UsageError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m tfcomp.whatif", description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--params", type=int, help="number of float32 gradient elements")
    source.add_argument("--profile", help="JSON profile of a Keras model (tfcomp.whatif.save_profile)")
    parser.add_argument("--workers", type=int, default=8, help="number of workers (default 8)")
    parser.add_argument("--latency", default="50us", help="one-way latency, e.g. 1ms, 50us (default 50us)")
    parser.add_argument("--bandwidth", default="10Gbps", help="bandwidth, e.g. 10Gbps, 400Mbps, 1.25GB/s (default 10Gbps)")
    parser.add_argument("--compressor", default="dragonn", help=f"one of {', '.join(_COMPRESSORS)} (default dragonn)")
    parser.add_argument("--ratio", type=float, default=0.001, help="fraction sent by the sparsifiers (default 0.001)")
    parser.add_argument("--encode-ms", type=float, default=None,
                        help="encode+decode milliseconds per step (default: measured on this machine); 0 allowed")
    parser.add_argument("--compute-ms", type=float, default=0.0, help="forward+backward milliseconds per step (default 0)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--plot", metavar="FILE.png", help="draw predicted step time against bandwidth")
    return parser


def _make_compressor(name: str, ratio: float):
    import tfcomp

    if name not in _COMPRESSORS:
        raise _UsageError(f"--compressor must be one of {', '.join(_COMPRESSORS)}, got {name!r}")
    if name in ("efsignsgd", "qsgd"):
        return {"efsignsgd": tfcomp.EFSignSGD, "qsgd": tfcomp.QSGD}[name]()
    classes = {"dragonn": tfcomp.DRAGONN, "dgc": tfcomp.DGC, "topk": tfcomp.TopK, "randomk": tfcomp.RandomK}
    try:
        return classes[name](ratio)
    except ValueError as error:
        raise _UsageError(f"--ratio: {error}") from None


def save_profile(model, path: str) -> None:
    """Writes {"tensors": [{"name", "elements"}]} for the model's trainable variables, in order."""
    tensors = [{"name": v.name, "elements": int(v.shape.num_elements())} for v in model.trainable_variables]
    with open(path, "w") as f:
        json.dump({"tensors": tensors}, f, indent=1)


def _load_profile(path: str) -> list:
    try:
        with open(path) as f:
            tensors = json.load(f)["tensors"]
        sizes = [(str(t["name"]), int(t["elements"])) for t in tensors]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise _UsageError(f"--profile {path!r} is not a readable profile ({error})") from None
    if not sizes or any(n <= 0 for _, n in sizes):
        raise _UsageError(f"--profile {path!r} must list tensors with elements > 0")
    return sizes


def _strategies(compressor) -> list:
    """(name, strategy, tree) of the strategies this compressor can run."""
    available = cm.available_strategies(compressor)
    rows = [("dense_ring_allreduce", "dense", False)]
    if "allgather" in available:
        rows.append(("allgather", "allgather", False))
    if "allreduce" in available:
        rows.append(("allreduce", "allreduce", False))
    if "artopk" in available:
        rows += [("artopk_ring", "artopk", False), ("artopk_tree", "artopk", True)]
    return rows


def predict(elements: int, compressor, cluster: cm.ClusterModel, compute_seconds: float = 0.0,
            tensors: int = 1) -> dict:
    """{"strategies": [...], "choice": name} for one bucket of `tensors` gradients, `elements` float32."""
    rows = []
    for name, strategy, tree in _strategies(compressor):
        t = cm.strategy_time(strategy, elements, compressor, cluster, tree=tree, tensors=tensors)
        rows.append({"name": name, "communication_s": t.communication, "compression_s": t.compression,
                     "total_s": compute_seconds + t.total})
    choice = min(rows, key=lambda r: r["total_s"])["name"]  # the first (dense) on ties
    return {"strategies": rows, "choice": choice}


def _cluster(args, network: cm.Network, compressor, tensors: list) -> cm.ClusterModel:
    """The model the prediction uses: `network` for both collectives, and the compression's figures
    from --encode-ms (all of it, per bucket) or measured here on `tensors` ([(name, elements)])."""
    cluster = cm.ClusterModel(args.workers, network, network, cm.AffineCost(0.0, 0.0))
    if args.encode_ms is not None:
        if not (math.isfinite(args.encode_ms) and args.encode_ms >= 0):
            raise _UsageError(f"--encode-ms must be a number of milliseconds >= 0, got {args.encode_ms!r}")
        return dataclasses.replace(cluster, encode_decode=cm.AffineCost(args.encode_ms / 1e3, 0.0))
    from tfcomp import calibration

    sizes = [n for _, n in reversed(tensors)]  # backprop order
    return calibration.measure_compression(compressor, args.workers, sum(sizes), tensor_elements=sizes).apply(cluster)


def _plot(path: str, elements: int, tensors: int, compressor, cluster: cm.ClusterModel, compute_seconds: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gbits = [10 ** (e / 20) for e in range(-20, 41)]  # 0.1 ... 100 Gbit/s
    curves = {}
    for g in gbits:
        net = cm.Network(cluster.allreduce.latency, g * 1e9 / 8)
        shifted = dataclasses.replace(cluster, allreduce=net, allgather=net)
        for row in predict(elements, compressor, shifted, compute_seconds, tensors)["strategies"]:
            curves.setdefault(row["name"], []).append(1e3 * row["total_s"])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, ms in curves.items():
        ax.plot(gbits, ms, label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bandwidth (Gbit/s)")
    ax.set_ylabel("predicted step time (ms)")
    ax.set_title(f"{elements:,} float32 gradients, {cluster.workers} workers, {compressor.__class__.__name__}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


_VALUE_FLAGS = ("--params", "--workers", "--latency", "--bandwidth", "--ratio", "--encode-ms", "--compute-ms")


def _attach_values(argv) -> list:
    """'--bandwidth -1Gbps' -> '--bandwidth=-1Gbps', so a negative value gets its own error message
    rather than argparse taking it for an option."""
    argv, out = list(argv), []
    while argv:
        item = argv.pop(0)
        if item in _VALUE_FLAGS and argv and argv[0].startswith("-"):
            item = f"{item}={argv.pop(0)}"
        out.append(item)
    return out


def _run(argv) -> int:
    args = _parser().parse_args(_attach_values(argv))
    try:
        network = cm.Network(cm.parse_latency(args.latency), cm.parse_bandwidth(args.bandwidth))
    except ValueError as error:
        raise _UsageError(str(error)) from None
    if args.workers < 1:
        raise _UsageError(f"--workers must be an integer >= 1, got {args.workers}")
    if not (math.isfinite(args.compute_ms) and args.compute_ms >= 0):
        raise _UsageError(f"--compute-ms must be a number of milliseconds >= 0, got {args.compute_ms!r}")
    if args.params is not None and args.params <= 0:
        raise _UsageError(f"--params must be a number of elements > 0, got {args.params}")
    tensors = [("params", args.params)] if args.params is not None else _load_profile(args.profile)
    elements = sum(n for _, n in tensors)
    compressor = _make_compressor(args.compressor, args.ratio)
    try:
        cluster = _cluster(args, network, compressor, tensors)
    except ValueError as error:  # figures beyond what a cluster model accepts (cost_model.CLUSTER_LIMITS)
        raise _UsageError(str(error)) from None
    result = predict(elements, compressor, cluster, args.compute_ms / 1e3, tensors=len(tensors))
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{elements:,} float32 gradients, {args.workers} workers, {args.latency} latency, {args.bandwidth}, "
              f"{compressor!r}")
        print(f"{'strategy':22s} {'communication ms':>17s} {'compression ms':>15s} {'total ms':>10s}")
        for row in result["strategies"]:
            print(f"{row['name']:22s} {1e3 * row['communication_s']:17.3f} {1e3 * row['compression_s']:15.3f} "
                  f"{1e3 * row['total_s']:10.3f}")
        print(f"choice: {result['choice']}")
        if args.profile is not None:
            from tfcomp import planning

            backprop = [(i, name, n) for i, (name, n) in reversed(list(enumerate(tensors)))]
            print(planning.make_plan(backprop, compressor, cluster).table())
    if args.plot:
        _plot(args.plot, elements, len(tensors), compressor, cluster, args.compute_ms / 1e3)
    return 0


def main(argv=None) -> int:
    """Entry point; returns the exit status (2 with a one-line message for bad arguments)."""
    try:
        return _run(sys.argv[1:] if argv is None else argv)
    except _UsageError as error:
        print(f"whatif: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
