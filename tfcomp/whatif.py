"""What-if: the cost model's prediction of a training step on a cluster you do not have.

    python -m tfcomp.whatif --params 25.6M --tensors 161 --workers 8 --latency 1ms --bandwidth 10Gbit/s \\
        --compressor DRAGONN --ratio 0.001 --encode-ms 9 --decode-ms 3 --forward-ms 30 --backward-ms 60
    python -m tfcomp.whatif --profile model_profile.json ...   # see save_profile()

It prices one step (forward, backward and the gradient exchange) four ways: stock Horovod's dense
allreduce overlapping the backward pass (its fusion buffer replayed over the gradients' ready
times, `tfcomp.cost_model.horovod_dense_finish`); every strategy the compressor has, all gradients
in one bucket after the backward pass (dense ring allreduce, the compressor's allgather or
allreduce, AR-Topk with ring and with tree reduction, which tfcomp itself does not run); and the
plan tfcomp would make (`tfcomp.planning.make_plan` with the gradients' ready times), priced as
tfcomp's exchange runs it: its dense buckets overlap the backward pass. The choice it prints is that plan, with its speed-up over stock Horovod.

What compression costs is never measured behind your back: give --encode-ms (and --decode-ms), the
milliseconds to encode and decode all the gradients once (priced per element for buckets of part of
them), --device h100 for the op library's CUDA kernels as measured on that GPU (tfcomp.device_costs,
priced per bucket), or --measure-here to time it now on this machine's CPU with the op library (a
few seconds; that CPU is not your cluster's GPU). Every figure the prediction assumes is printed with it. A profile
may carry the forward and backward times and each gradient's ready time, measured on a machine of
yours (`save_profile(model, path, batch=(x, y), loss=...)`, by `measure_step_times`); without ready
times the gradients are assumed ready in backprop order in proportion to their elements over
--backward-ms. --overlap-slowdown says how many times slower a transfer runs while the backward
pass computes beside it (1 by default; tfcomp fits it in training, and on this project's emulated
hosts, which share two CPU cores, it came out 1.9 to 2.9); it slows stock Horovod's overlapped
allreduce and the plan's dense buckets alike.

--json prints {"inputs", "assumptions", "strategies": [{"name", "communication_s", "compression_s",
"total_s", "runs_in_tfcomp"}], "horovod_total_s", "plan": {"buckets", "exchange_s", "total_s"},
"choice", "speedup_over_horovod"}; --plot draws the predicted step time of each against bandwidth
(0.1 to 100 Gbit/s) with the asked bandwidth marked. Only --measure-here imports TensorFlow. Bad
arguments exit with status 2 and a one-line message.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys

from tfcomp import cost_model as cm
from tfcomp import device_costs
from tfcomp import planning

__all__ = ["main", "measure_step_times", "predict", "save_profile"]

_COMPRESSORS = {"dragonn": "DRAGONN", "dgc": "DGC", "topk": "TopK", "randomk": "RandomK", "efsignsgd": "EFSignSGD",
                "qsgd": "QSGD", "intquant": "IntQuant"}
_SPARSIFIERS = ("dragonn", "dgc", "topk", "randomk")


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not the usage block
        raise _UsageError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m tfcomp.whatif", description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--params", help="float32 gradient elements, e.g. 126000000, 1.2e8 or 25.6M")
    source.add_argument("--profile", help="JSON profile of a Keras model (tfcomp.whatif.save_profile)")
    parser.add_argument("--tensors", type=int, default=1,
                        help="with --params: that many tensors of equal size, e.g. 161 for ResNet-50 (default 1)")
    parser.add_argument("--workers", type=int, default=8, help="number of workers (default 8)")
    parser.add_argument("--latency", default="50us", help="one-way latency, e.g. 1ms, 50us (default 50us)")
    parser.add_argument("--bandwidth", default="10Gbit/s",
                        help="per-worker bandwidth, e.g. 10Gbit/s, 10Gbps, 400Mbps, 1.25GB/s (default 10Gbit/s)")
    parser.add_argument("--compressor", default="dragonn",
                        help=f"one of {', '.join(_COMPRESSORS)}, any case (default dragonn)")
    parser.add_argument("--ratio", type=float, default=0.001,
                        help=f"fraction sent by the sparsifiers ({', '.join(_SPARSIFIERS)}; default 0.001)")
    costs = parser.add_mutually_exclusive_group()
    costs.add_argument("--encode-ms", type=float, help="milliseconds to encode all the gradients once, on your devices")
    costs.add_argument("--measure-here", action="store_true",
                       help="time encode and decode now on this machine's CPU (imports TensorFlow; a few seconds)")
    costs.add_argument("--device", help=f"use the encode and decode times measured on a GPU: "
                                        f"{', '.join(device_costs.MEASURED)} (tfcomp.device_costs)")
    parser.add_argument("--decode-ms", type=float, default=0.0,
                        help="milliseconds to decode all workers' payloads once, with --encode-ms (default 0)")
    parser.add_argument("--forward-ms", type=float,
                        help="forward pass milliseconds per step (default: the profile's, else 0)")
    parser.add_argument("--backward-ms", type=float,
                        help="backward pass milliseconds per step, which stock Horovod's allreduce overlaps "
                             "(default: the profile's, else 0)")
    parser.add_argument("--overlap-slowdown", type=float, default=1.0,
                        help="how many times slower a transfer runs while the backward pass computes beside it "
                             "(tfcomp fits it in training: exchange.plan.cluster.overlap_slowdown; default 1)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--plot", metavar="FILE.png", help="draw predicted step time against bandwidth")
    return parser


def _make_compressor(name: str, ratio: float):
    from tfcomp import compressors  # settings and payload sizes only: TensorFlow stays unloaded

    key = name.lower()
    if key not in _COMPRESSORS:
        raise _UsageError(f"--compressor must be one of {', '.join(_COMPRESSORS)}, got {name!r}")
    cls = getattr(compressors, _COMPRESSORS[key])
    try:
        return cls(ratio) if key in _SPARSIFIERS else cls()
    except ValueError as error:
        raise _UsageError(f"--ratio: {error}") from None


def measure_step_times(model, batch, loss, steps: int = 10) -> dict:
    """When a training step's parts end on this machine: {"forward_ms": float, "backward_ms":
    float, "ready_ms": [float or None per trainable variable, in order]}, medians over `steps`
    steps after one untimed one. `batch` = (x, y) as the model trains on them; `loss(y,
    predictions)` a scalar. Forward: from the step's start until the loss is computed; each
    gradient's ready time and the backward pass from then (None: the variable gets no gradient).
    Every step is one graph with a timestamp taken once each gradient is computed
    (`tfcomp.counters.stamp`: it waits for the gradient as a data input, and for nothing else)."""
    import numpy as np
    import tensorflow as tf

    from tfcomp.counters import stamp

    if not (isinstance(steps, int) and steps >= 1):
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    x, y = batch
    variables = model.trainable_variables

    def step():
        start = tf.timestamp()
        with tf.GradientTape() as tape:
            with tf.control_dependencies([start]):
                predictions = model(x, training=True)
            value = loss(y, predictions)
        forward_end = stamp([value])
        grads = tape.gradient(value, variables)
        stamps = [tf.constant(float("nan"), tf.float64) if grad is None else
                  stamp([grad.values if isinstance(grad, tf.IndexedSlices) else grad]) for grad in grads]
        return forward_end - start, tf.stack(stamps) - forward_end

    graph = tf.function(step, autograph=False)
    graph()
    runs = [graph() for _ in range(steps)]
    forward = float(np.median([f.numpy() for f, _ in runs]))
    ready = np.median(np.stack([r.numpy() for _, r in runs]), axis=0)
    # The loss's last reduction can end after the first gradients (its fused cross-entropy op gives the
    # logits' gradient with the loss): a gradient ready before the forward pass's end counts as at 0.
    ready_ms = [None if np.isnan(t) else 1e3 * max(float(t), 0.0) for t in ready]
    return {"forward_ms": 1e3 * forward, "backward_ms": max([t for t in ready_ms if t is not None], default=0.0),
            "ready_ms": ready_ms}


def save_profile(model, path: str, batch=None, loss=None, steps: int = 10) -> None:
    """Writes {"tensors": [{"name", "elements"}]} for the model's trainable variables, in order.
    With `batch` and `loss` (see `measure_step_times`), also "forward_ms", "backward_ms" and each
    tensor's "ready_ms" (from the start of the backward pass) as measured on this machine; the
    what-if then takes them for --forward-ms, --backward-ms and the ready times."""
    tensors = [{"name": v.name, "elements": int(v.shape.num_elements())} for v in model.trainable_variables]
    profile = {"tensors": tensors}
    if batch is not None:
        if loss is None:
            raise ValueError("loss: give the loss function (y, predictions) -> scalar to time a step on batch")
        times = measure_step_times(model, batch, loss, steps)
        for tensor, ready in zip(tensors, times["ready_ms"]):
            tensor["ready_ms"] = 0.0 if ready is None else ready
        profile.update(forward_ms=times["forward_ms"], backward_ms=times["backward_ms"])
    with open(path, "w") as f:
        json.dump(profile, f, indent=1)


def _load_profile(path: str) -> tuple:
    """([(name, elements)] in variable order, [ready seconds] in the same order or None, {"forward_ms",
    "backward_ms"}: those the profile gives)."""
    try:
        with open(path) as f:
            profile = json.load(f)
        tensors = profile["tensors"]
        sizes = [(str(t["name"]), int(t["elements"])) for t in tensors]
        ready = [float(t["ready_ms"]) / 1e3 for t in tensors] if all("ready_ms" in t for t in tensors) else None
        times = {k: float(profile[k]) for k in ("forward_ms", "backward_ms") if k in profile}
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise _UsageError(f"--profile {path!r} is not a readable profile ({error})") from None
    if not sizes or any(n <= 0 for _, n in sizes):
        raise _UsageError(f"--profile {path!r} must list tensors with elements > 0")
    if ready is not None and not all(math.isfinite(t) and t >= 0 for t in ready):
        raise _UsageError(f"--profile {path!r}: ready_ms must be numbers of milliseconds >= 0")
    if not all(math.isfinite(t) and t >= 0 for t in times.values()):
        raise _UsageError(f"--profile {path!r}: forward_ms and backward_ms must be numbers of milliseconds >= 0")
    return sizes, ready, times


def predict(elements: int, compressor, cluster: cm.ClusterModel, compute_seconds: float = 0.0,
            tensors: int = 1) -> dict:
    """{"strategies": [{"name", "communication_s", "compression_s", "total_s", "runs_in_tfcomp"}]}
    for one bucket of `tensors` gradients, `elements` float32, exchanged after `compute_seconds`,
    with every strategy the compressor has (`Strategy.variants`: AR-Topk with ring and tree
    reduction), priced by `Strategy.time` as the plan's search prices a bucket."""
    rows = []
    for name, strategy in (variant for s in compressor.strategies for variant in s.variants()):
        t = strategy.time(elements, compressor, cluster, tensors=tensors)
        rows.append({"name": name, "communication_s": t.communication, "compression_s": t.compression,
                     "total_s": compute_seconds + t.total, "runs_in_tfcomp": strategy.runs_in_tfcomp})
    return {"strategies": rows}


def _ready_times(sizes: list, backward: float) -> list:
    """Seconds from the start of the backward pass at which each gradient (backprop order) is ready,
    assumed in proportion to the elements computed so far."""
    total, done, ready = sum(sizes), 0, []
    for n in sizes:
        done += n
        ready.append(backward * done / total)
    return ready


def _prediction(tensors: list, ready: list, compressor, cluster: cm.ClusterModel, forward: float,
                backward: float) -> dict:
    """Every figure of the output but the inputs: `tensors` [(name, elements)] and `ready` seconds
    in backprop order."""
    sizes = [n for _, n in tensors]
    result = predict(sum(sizes), compressor, cluster, forward + backward, tensors=len(sizes))
    horovod_finish = cm.horovod_dense_finish(sizes, ready, cluster, element_bytes=compressor.dense_element_bytes)
    plan = planning.make_plan([(i, name, n) for i, (name, n) in enumerate(tensors)], compressor, cluster,
                              ready_seconds=ready)
    # The plan's exchange ends this long after the start of the backward pass (its dense buckets overlap it).
    exchange_end = max(backward, planning.predicted_exchange_time(plan))
    strategies = sorted({b.strategy.name for b in plan.buckets})
    result.update(
        horovod_total_s=forward + max(backward, horovod_finish),
        plan={"buckets": [{"strategy": b.strategy.name, "elements": b.elements, "tensors": len(b.positions)}
                          for b in plan.buckets],
              "exchange_s": exchange_end - backward, "total_s": forward + exchange_end},
        choice=strategies[0] if len(strategies) == 1 else "mixed: " + "+".join(strategies))
    result["speedup_over_horovod"] = result["horovod_total_s"] / result["plan"]["total_s"]
    return result, plan


def _compression_cluster(args, network: cm.Network, compressor, sizes: list) -> tuple:
    """The cluster model and the sentence saying what its compression costs assume."""
    cluster = cm.ClusterModel(args.workers, network, network, cm.AffineCost(0.0, 0.0),
                              overlap_slowdown=args.overlap_slowdown)
    if not any(s.compresses for s in compressor.strategies):
        return cluster, "compression: none (a dense compressor)"
    if args.measure_here:
        from tfcomp import calibration

        figures = calibration.measure_compression(compressor, args.workers, sum(sizes), tensor_elements=sizes)
        return figures.apply(cluster), (
            f"compression: measured just now on this machine's CPU, {args.workers} workers' payloads decoded: "
            f"{1e3 * figures.encode_decode.c0:.3f} ms + {1e9 * figures.encode_decode.c1:.3f} ns per element per "
            f"bucket, {1e3 * figures.per_tensor:.3f} ms per tensor, {1e3 * figures.fixed:.3f} ms per step")
    if args.device is not None:
        try:
            cost, sentence = device_costs.bucket_cost(device_costs.device(args.device), compressor, args.workers)
        except ValueError as error:
            raise _UsageError(str(error)) from None
        return dataclasses.replace(cluster, encode_decode=cost), sentence
    if args.encode_ms is None:
        raise _UsageError("say what compression costs on your devices: --encode-ms (and --decode-ms), --device "
                          "for a GPU's measured figures, or --measure-here to time it on this machine's CPU")
    seconds = _checked_ms("--encode-ms", args.encode_ms) + _checked_ms("--decode-ms", args.decode_ms)
    cluster = dataclasses.replace(cluster, encode_decode=cm.AffineCost(0.0, seconds / sum(sizes)))
    return cluster, (f"compression: {args.encode_ms:g} ms encode + {args.decode_ms:g} ms decode for all "
                     f"{sum(sizes):,} elements (--encode-ms, --decode-ms), {1e9 * seconds / sum(sizes):.3f} ns per "
                     "element in any bucket, nothing per tensor or per step")


def _plot(path: str, tensors: list, ready: list, compressor, cluster: cm.ClusterModel, forward: float,
          backward: float, asked: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gbits = [10 ** (e / 20) for e in range(-20, 41)]  # 0.1 ... 100 Gbit/s
    curves = {}
    for g in gbits:
        net = cm.Network(cluster.allreduce.latency, g * 1e9 / 8)
        result, _ = _prediction(tensors, ready, compressor, dataclasses.replace(cluster, allreduce=net, allgather=net),
                                forward, backward)
        curves.setdefault("stock Horovod (overlapped)", []).append(1e3 * result["horovod_total_s"])
        curves.setdefault("tfcomp plan", []).append(1e3 * result["plan"]["total_s"])
        for row in result["strategies"]:
            curves.setdefault(f"one bucket, {row['name']}", []).append(1e3 * row["total_s"])
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for name, ms in curves.items():
        ax.plot(gbits, ms, label=name, linewidth=2.5 if name == "tfcomp plan" else 1.2,
                linestyle="--" if name.startswith("one bucket") else "-")
    ax.axvline(asked * 8 / 1e9, color="grey", linestyle=":", label=f"asked: {asked * 8 / 1e9:g} Gbit/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("per-worker bandwidth (Gbit/s)")
    ax.set_ylabel("predicted step time (ms)")
    ax.set_title(f"{sum(n for _, n in tensors):,} gradients, {cluster.workers} workers, {type(compressor).__name__}, "
                 f"compute {1e3 * (forward + backward):g} ms", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


_VALUE_FLAGS = ("--params", "--tensors", "--workers", "--latency", "--bandwidth", "--ratio", "--encode-ms", "--decode-ms",
                "--forward-ms", "--backward-ms")


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


def _checked_ms(flag: str, value: float) -> float:
    if not (math.isfinite(value) and value >= 0):
        raise _UsageError(f"{flag} must be a number of milliseconds >= 0, got {value!r}")
    return value / 1e3


def _text(args, tensors: list, compressor, assumptions: list, result: dict, plan) -> str:
    elements = sum(n for _, n in tensors)
    lines = [f"{elements:,} float32 gradients in {len(tensors)} tensors, {args.workers} workers, {args.latency} "
             f"latency, {args.bandwidth} per worker, {compressor!r}"]
    lines += [f"assumed {a}" for a in assumptions]
    lines.append(f"{'one bucket after the backward pass':40s} {'communication ms':>17s} {'compression ms':>15s} "
                 f"{'step ms':>10s}")
    for row in result["strategies"]:
        name = row["name"] + ("" if row["runs_in_tfcomp"] else " (tfcomp does not run it)")
        lines.append(f"  {name:38s} {1e3 * row['communication_s']:17.3f} {1e3 * row['compression_s']:15.3f} "
                     f"{1e3 * row['total_s']:10.3f}")
    lines.append(f"{'stock Horovod, overlapping the backward pass':73s} {1e3 * result['horovod_total_s']:10.3f}")
    lines.append(f"{'tfcomp plan (below), overlapping the backward pass':73s} {1e3 * result['plan']['total_s']:10.3f}")
    lines.append(f"choice: {result['choice']}, {result['speedup_over_horovod']:.2f}x the speed of stock Horovod")
    lines.append(plan.table())
    return "\n".join(lines)


def _run(argv) -> int:
    args = _parser().parse_args(_attach_values(argv))
    try:
        network = cm.Network(cm.parse_latency(args.latency), cm.parse_bandwidth(args.bandwidth))
        params = None if args.params is None else cm.parse_count(args.params, "--params")
    except ValueError as error:
        raise _UsageError(str(error)) from None
    if args.workers < 1:
        raise _UsageError(f"--workers must be an integer >= 1, got {args.workers}")
    if not 1.0 <= args.overlap_slowdown <= cm.MAX_OVERLAP_SLOWDOWN:
        raise _UsageError(f"--overlap-slowdown must be a number from 1 to {cm.MAX_OVERLAP_SLOWDOWN:g}, got "
                          f"{args.overlap_slowdown!r}")
    if args.decode_ms and args.encode_ms is None:
        raise _UsageError("--decode-ms goes with --encode-ms")
    if args.tensors < 1 or (params is not None and args.tensors > params):
        raise _UsageError(f"--tensors must be an integer from 1 to --params, got {args.tensors}")
    if params is not None:
        named, ready, profiled = [(f"params_{i}", params // args.tensors + (i < params % args.tensors))
                                  for i in range(args.tensors)], None, {}
    else:
        named, ready, profiled = _load_profile(args.profile)
    assumptions = [f"{name.replace('_ms', '')} pass {value:g} ms, measured in the profile" for name, value in
                   profiled.items() if getattr(args, name) is None]
    args.forward_ms = profiled.get("forward_ms", 0.0) if args.forward_ms is None else args.forward_ms
    args.backward_ms = profiled.get("backward_ms", 0.0) if args.backward_ms is None else args.backward_ms
    forward, backward = _checked_ms("--forward-ms", args.forward_ms), _checked_ms("--backward-ms", args.backward_ms)
    tensors = list(reversed(named))  # backprop order
    if ready is None:
        ready = _ready_times([n for _, n in tensors], backward)
        if backward > 0:
            assumptions.append(f"gradients ready in backprop order in proportion to their elements over the "
                               f"{args.backward_ms:g} ms backward pass")
    else:
        ready = list(reversed(ready))
        assumptions.append("gradients ready at the profile's ready_ms")
    compressor = _make_compressor(args.compressor, args.ratio)
    try:
        cluster, compression = _compression_cluster(args, network, compressor, [n for _, n in tensors])
        result, plan = _prediction(tensors, ready, compressor, cluster, forward, backward)
    except ValueError as error:  # figures beyond what a cluster model accepts (cost_model.CLUSTER_LIMITS)
        raise _UsageError(str(error)) from None
    assumptions.insert(0, compression)
    assumptions.append(f"stock Horovod fuses up to {cm.HOROVOD_FUSION_BYTES // 2**20} MiB every "
                       f"{1e3 * cm.HOROVOD_CYCLE_SECONDS:g} ms; the network is the asked one for every collective")
    assumptions.append(f"transfers during the backward pass {args.overlap_slowdown:g}x slower than after it "
                       "(--overlap-slowdown)")
    if args.json:
        inputs = {"elements": sum(n for _, n in tensors), "tensors": len(tensors), "workers": args.workers,
                  "latency_s": network.latency, "bandwidth_bytes_per_s": network.bandwidth,
                  "compressor": repr(compressor), "forward_s": forward, "backward_s": backward,
                  "encode_ms": args.encode_ms, "decode_ms": args.decode_ms, "measure_here": args.measure_here,
                  "device": args.device, "overlap_slowdown": args.overlap_slowdown}
        print(json.dumps({"inputs": inputs, "assumptions": assumptions, **result}))
    else:
        print(_text(args, named, compressor, assumptions, result, plan))
    if args.plot:
        _plot(args.plot, tensors, ready, compressor, cluster, forward, backward, network.bandwidth)
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
