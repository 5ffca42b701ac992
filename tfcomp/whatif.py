"""What-if: the cost model's prediction of a training step on a cluster you do not have.

    python -m tfcomp.whatif --params 25.6M --workers 8 --latency 1ms --bandwidth 10Gbit/s \\
        --compressor DRAGONN --ratio 0.001 --encode-ms 9 --decode-ms 3 --forward-ms 30 --backward-ms 60
    python -m tfcomp.whatif --profile model_profile.json ...   # see save_profile()

It prices one training step (the forward pass, then the backward pass and the part of the gradient
exchange that outlasts it) four ways: stock Horovod's dense allreduce overlapping the backward pass
(its fusion buffer replayed over the gradients' ready times, `tfcomp.cost_model.horovod_dense_finish`);
every strategy the compressor has, all gradients in one bucket after the backward pass (dense ring
allreduce, the compressor's allgather or allreduce, AR-Topk with ring and with tree reduction, which
tfcomp itself does not run); and the plan tfcomp would make (`tfcomp.planning.make_plan` with the
gradients' ready times), priced as tfcomp's exchange runs it: its dense buckets overlap the backward
pass. The best compressing plan is recommended only where its step is predicted shorter than the
all-dense plan's (stock Horovod's, priced by the same replay) by more than --margin of it
(`tfcomp.planning.COMPRESSION_MARGIN`, 5 %, by default; `tfcomp.planning.exceeds_margin`: a smaller
gain is within a measured step's noise); else the answer is "stay dense". The verdict line prints
the margin and the best compressing plan's predicted gain; the choice line compares the recommended
plan's training step with stock Horovod's and says where the compute times came from (given, the
profile's, or assumed 0 where not given; with neither pass given, only the exchanges compare, and
their ratio is said to bound the step's, not to be it).

With --params the gradients are --tensors tensors of equal size, or without --tensors ResNet-50's
161 (`resnet50_tensors`: convolution kernels of 4,096 to 2,359,296 elements, each followed by its
batch norm's two vectors, and the classifier's 2,048,000-element kernel), each scaled to --params:
how many tensors there are, and how large, decides what of a dense exchange hides under the backward
pass (one tensor of all the elements hides nothing). The output says which.

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

--json prints {"inputs", "assumptions", "tensor_spread", "compute_times": {"forward", "backward"}: "given",
"profile" or "assumed", "strategies": [{"name", "communication_s", "compression_s", "total_s",
"runs_in_tfcomp"}], "horovod_total_s", "dense_total_s", "compressing_plan": {"buckets", "exchange_s",
"total_s"} or null, "predicted_gain" (of the best compressing plan, a fraction of the all-dense step),
"margin", "compresses", "plan": {"buckets", "exchange_s", "total_s"} (the recommended one), "choice",
"speedup_over_horovod"}; --plot draws the predicted step time of each against bandwidth (`PLOT_GBITS`:
61 from 0.1 to 100 Gbit/s) with the asked bandwidth marked, in about a second (the bucket search
prices only the buckets its dynamic programme reaches). Only --measure-here imports TensorFlow. Bad
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

__all__ = ["PLOT_GBITS", "main", "measure_step_times", "predict", "resnet50_tensors", "save_profile"]

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
    parser.add_argument("--tensors", type=int,
                        help="with --params: that many tensors of equal size (default: ResNet-50's 161 tensors, "
                             "their sizes scaled to --params)")
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
    parser.add_argument("--margin", type=float, default=planning.COMPRESSION_MARGIN,
                        help="compress only where the step is predicted shorter than all dense by more than this "
                             f"fraction of it (default {planning.COMPRESSION_MARGIN:g})")
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


def resnet50_tensors() -> list:
    """[(name, elements)] of ResNet-50's 161 trainable tensors in variable order, as torchvision
    lays them out (25,557,032 elements): the 7x7 stem convolution, then 16 bottleneck blocks (3, 4,
    6, 3 per stage, widths 64 to 512, expansion 4; a 1x1 projection in each stage's first block),
    each convolution (no bias) followed by its batch norm's scale and shift, then the classifier's
    kernel (2048 x 1000) and bias: 53 kernels, 53 pairs of normalisation vectors, 2 more."""
    tensors = [("conv1.weight", 64 * 3 * 7 * 7), ("bn1.weight", 64), ("bn1.bias", 64)]
    channels = 64
    for stage, (width, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3)), start=1):
        for block in range(blocks):
            prefix = f"layer{stage}.{block}"
            # (elements of the kernel, output channels) of its 1x1, 3x3 and 1x1 convolutions
            convolutions = ((channels * width, width), (width * width * 9, width), (width * 4 * width, 4 * width))
            for index, (elements, outputs) in enumerate(convolutions, start=1):
                tensors += [(f"{prefix}.conv{index}.weight", elements), (f"{prefix}.bn{index}.weight", outputs),
                            (f"{prefix}.bn{index}.bias", outputs)]
            if block == 0:
                tensors += [(f"{prefix}.downsample.0.weight", channels * 4 * width),
                            (f"{prefix}.downsample.1.weight", 4 * width), (f"{prefix}.downsample.1.bias", 4 * width)]
            channels = 4 * width
    return tensors + [("fc.weight", channels * 1000), ("fc.bias", 1000)]


def _spread(params: int, tensors: int | None) -> tuple:
    """([(name, elements)] in variable order, the sentence saying what was assumed) for --params
    `params` elements: `tensors` tensors of equal size (their remainder one element each to the
    first); without `tensors`, ResNet-50's (`resnet50_tensors`) each scaled to `params` (one element
    each, the rest shared in proportion to ResNet-50's sizes, largest remainders first), or where
    `params` is under its 161 tensors, `params` tensors of one element."""
    if tensors is not None:
        return ([(f"params_{i}", params // tensors + (i < params % tensors)) for i in range(tensors)],
                f"{tensors} tensors of equal size (--tensors)" if tensors > 1 else "one tensor (--tensors 1)")
    layout = resnet50_tensors()
    total = sum(n for _, n in layout)
    if params < len(layout):
        return [(f"params_{i}", 1) for i in range(params)], (
            f"{params} tensors of one element (--params is under ResNet-50's {len(layout)} tensors; --tensors sets "
            "the count)")
    spare = params - len(layout)
    shares = [divmod(spare * n, total) for _, n in layout]
    left = spare - sum(q for q, _ in shares)
    extra = set(sorted(range(len(layout)), key=lambda i: (-shares[i][1], i))[:left])
    sizes = [1 + q + (i in extra) for i, (q, _) in enumerate(shares)]
    return [(name, n) for (name, _), n in zip(layout, sizes)], (
        f"the tensors of ResNet-50 (torchvision's {len(layout)}: 53 convolution kernels, each followed by its batch "
        f"norm's scale and shift, and the classifier's kernel and bias; {total:,} elements), each scaled to "
        f"{params:,} in all: give --tensors N for N tensors of equal size, or --profile for your model's")


def _ready_times(sizes: list, backward: float) -> list:
    """Seconds from the start of the backward pass at which each gradient (backprop order) is ready,
    assumed in proportion to the elements computed so far."""
    total, done, ready = sum(sizes), 0, []
    for n in sizes:
        done += n
        ready.append(backward * done / total)
    return ready


def _prediction(tensors: list, ready: list, compressor, cluster: cm.ClusterModel, forward: float,
                backward: float, margin: float) -> tuple:
    """Every figure of the output but the inputs, and the plan recommended: `tensors` [(name,
    elements)] and `ready` seconds (from the start of the backward pass) in backprop order.

    A step is the forward pass, then the backward pass and the exchange's part after it: forward +
    max(backward, the exchange's end). The best plan (`tfcomp.planning.make_plan` with margin 0)
    is recommended where it compresses and its step is shorter than the all-dense plan's by more
    than `margin` of that step (`tfcomp.planning.exceeds_margin`: what make_plan does with the
    step as `step_seconds`); else its all-dense plan is."""
    sizes = [n for _, n in tensors]
    result = predict(sum(sizes), compressor, cluster, forward + backward, tensors=len(sizes))
    horovod_finish = cm.horovod_dense_finish(sizes, ready, cluster, element_bytes=compressor.dense_element_bytes)
    best = planning.make_plan([(i, name, n) for i, (name, n) in enumerate(tensors)], compressor, cluster,
                              ready_seconds=ready, margin=0.0)
    dense = best.all_dense() if best.compressed else best

    def exchange_end(plan) -> float:
        """When the plan's exchange ends, from the start of the backward pass (its dense buckets overlap it)."""
        return max(backward, planning.predicted_exchange_time(plan))

    def summary(plan) -> dict:
        return {"buckets": [{"strategy": b.strategy.name, "elements": b.elements, "tensors": len(b.positions)}
                            for b in plan.buckets],
                "exchange_s": exchange_end(plan) - backward, "total_s": forward + exchange_end(plan)}

    dense_step, best_step = forward + exchange_end(dense), forward + exchange_end(best)
    gain = dense_step - best_step
    compresses = bool(best.compressed) and gain > 0.0 and planning.exceeds_margin(gain, dense_step, margin)
    plan = best if compresses else dense
    strategies = sorted({b.strategy.name for b in plan.buckets})
    result.update(
        horovod_total_s=forward + max(backward, horovod_finish),
        dense_total_s=dense_step,
        compressing_plan=summary(best) if best.compressed else None,
        predicted_gain=gain / dense_step if best.compressed and gain > 0.0 else 0.0,
        margin=margin,
        compresses=compresses,
        plan=summary(plan),
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


PLOT_GBITS = tuple(10 ** (e / 20) for e in range(-20, 41))  # the bandwidths --plot predicts at: 0.1 ... 100 Gbit/s


def _plot_data(tensors: list, ready: list, compressor, cluster: cm.ClusterModel, forward: float, backward: float,
               margin: float) -> dict:
    """{curve name: [predicted step ms at each of `PLOT_GBITS`]}: stock Horovod, the recommended
    plan, and each strategy's one bucket, with both networks at that bandwidth (their latency kept)."""
    curves = {}
    for g in PLOT_GBITS:
        net = cm.Network(cluster.allreduce.latency, g * 1e9 / 8)
        result, _ = _prediction(tensors, ready, compressor, dataclasses.replace(cluster, allreduce=net, allgather=net),
                                forward, backward, margin)
        curves.setdefault("stock Horovod (overlapped)", []).append(1e3 * result["horovod_total_s"])
        curves.setdefault("tfcomp plan", []).append(1e3 * result["plan"]["total_s"])
        for row in result["strategies"]:
            curves.setdefault(f"one bucket, {row['name']}", []).append(1e3 * row["total_s"])
    return curves


def _plot(path: str, curves: dict, title: str, asked: float) -> None:
    """Draws `curves` (`_plot_data`) against bandwidth with the `asked` one (bytes/s) marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for name, ms in curves.items():
        ax.plot(PLOT_GBITS, ms, label=name, linewidth=2.5 if name == "tfcomp plan" else 1.2,
                linestyle="--" if name.startswith("one bucket") else "-")
    ax.axvline(asked * 8 / 1e9, color="grey", linestyle=":", label=f"asked: {asked * 8 / 1e9:g} Gbit/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("per-worker bandwidth (Gbit/s)")
    ax.set_ylabel("predicted step time (ms)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


_VALUE_FLAGS = ("--params", "--tensors", "--workers", "--latency", "--bandwidth", "--ratio", "--encode-ms", "--decode-ms",
                "--forward-ms", "--backward-ms", "--margin")


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


_SOURCE_WORDS = {"given": "given", "profile": "the profile's", "assumed": "assumed: not given"}


def _compute_words(args, sources: dict) -> str:
    """What a step is made of, and where its compute times came from (`sources`: "given",
    "profile" or "assumed" for "forward_ms" and "backward_ms")."""
    return (f"forward {args.forward_ms:g} ms ({_SOURCE_WORDS[sources['forward_ms']]}) + backward "
            f"{args.backward_ms:g} ms ({_SOURCE_WORDS[sources['backward_ms']]}) + the exchange's part after the "
            "backward pass")


def _headline(result: dict, compute: str, computes: bool) -> str:
    """The choice and its training step against stock Horovod's (`computes`: the step has a forward
    or backward pass; without, only the exchanges compare, and their ratio bounds the step's)."""
    plan_ms, horovod_ms = 1e3 * result["plan"]["total_s"], 1e3 * result["horovod_total_s"]
    if computes:
        return (f"choice: {result['choice']}: a training step of {plan_ms:.3f} ms against stock Horovod's "
                f"{horovod_ms:.3f} ms, {result['speedup_over_horovod']:.2f}x its speed (a step: {compute})")
    return (f"choice: {result['choice']}: its exchange takes {plan_ms:.3f} ms against stock Horovod's {horovod_ms:.3f} "
            "ms, but with no compute times (--forward-ms, --backward-ms or a profile's) there is no training step to "
            f"compare: a step gains less than {result['speedup_over_horovod']:.2f}x")


def _verdict(result: dict) -> str:
    """Whether to compress, the best compressing plan's predicted gain and the margin, in words."""
    margin, dense, best = result["margin"], result["dense_total_s"], result["compressing_plan"]
    rule = f"the {100 * margin:g} % margin ({1e3 * margin * dense:.3f} ms)"
    if best is None or result["predicted_gain"] <= 0.0:
        return (f"verdict: stay dense: no compressing plan is predicted to shorten the step (a plan must beat {rule} "
                "to be recommended)")
    gain = (f"{100 * result['predicted_gain']:.2f} % shorter than all dense ({1e3 * best['total_s']:.3f} against "
            f"{1e3 * dense:.3f} ms)")
    if result["compresses"]:
        return f"verdict: compress: the plan's step is predicted {gain}, beyond {rule}"
    return f"verdict: stay dense: the best compressing plan's step is predicted {gain}, inside {rule}"


def _text(args, tensors: list, compressor, assumptions: list, result: dict, plan, compute: str) -> str:
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
    if result["compressing_plan"] is not None and not result["compresses"]:
        lines.append(f"{'best compressing plan, overlapping the backward pass':73s} "
                     f"{1e3 * result['compressing_plan']['total_s']:10.3f}")
    lines.append(f"{'tfcomp plan (below), overlapping the backward pass':73s} {1e3 * result['plan']['total_s']:10.3f}")
    lines.append(_verdict(result))
    lines.append(_headline(result, compute, bool(args.forward_ms or args.backward_ms)))
    lines.append(plan.table())
    return "\n".join(lines)


def _run(argv) -> int:
    args = _parser().parse_args(_attach_values(argv))
    try:
        network = cm.Network(cm.parse_latency(args.latency), cm.parse_bandwidth(args.bandwidth))
        params = None if args.params is None else cm.parse_count(args.params, "--params")
        planning.check_margin(args.margin)
    except ValueError as error:
        raise _UsageError(str(error).replace("margin must", "--margin must")) from None
    if args.workers < 1:
        raise _UsageError(f"--workers must be an integer >= 1, got {args.workers}")
    if not 1.0 <= args.overlap_slowdown <= cm.MAX_OVERLAP_SLOWDOWN:
        raise _UsageError(f"--overlap-slowdown must be a number from 1 to {cm.MAX_OVERLAP_SLOWDOWN:g}, got "
                          f"{args.overlap_slowdown!r}")
    if args.decode_ms and args.encode_ms is None:
        raise _UsageError("--decode-ms goes with --encode-ms")
    if args.tensors is not None and (args.tensors < 1 or (params is not None and args.tensors > params)):
        raise _UsageError(f"--tensors must be an integer from 1 to --params, got {args.tensors}")
    if params is not None:
        (named, spread), ready, profiled = _spread(params, args.tensors), None, {}
    else:
        (named, ready, profiled), spread = _load_profile(args.profile), "the profile's"
    sources = {name: "given" if getattr(args, name) is not None else "profile" if name in profiled else "assumed"
               for name in ("forward_ms", "backward_ms")}
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
        result, plan = _prediction(tensors, ready, compressor, cluster, forward, backward, args.margin)
    except ValueError as error:  # figures beyond what a cluster model accepts (cost_model.CLUSTER_LIMITS)
        raise _UsageError(str(error)) from None
    assumptions.insert(0, compression)
    if params is not None:
        assumptions.insert(1, f"tensors: {spread}")
    assumptions.append(f"stock Horovod fuses up to {cm.HOROVOD_FUSION_BYTES // 2**20} MiB every "
                       f"{1e3 * cm.HOROVOD_CYCLE_SECONDS:g} ms; the network is the asked one for every collective")
    assumptions.append(f"transfers during the backward pass {args.overlap_slowdown:g}x slower than after it "
                       "(--overlap-slowdown)")
    compute = _compute_words(args, sources)
    if "assumed" in sources.values():
        assumptions.append(f"a step: {compute}")
    if args.json:
        inputs = {"elements": sum(n for _, n in tensors), "tensors": len(tensors), "workers": args.workers,
                  "latency_s": network.latency, "bandwidth_bytes_per_s": network.bandwidth,
                  "compressor": repr(compressor), "forward_s": forward, "backward_s": backward,
                  "encode_ms": args.encode_ms, "decode_ms": args.decode_ms, "measure_here": args.measure_here,
                  "device": args.device, "overlap_slowdown": args.overlap_slowdown, "margin": args.margin}
        print(json.dumps({"inputs": inputs, "assumptions": assumptions, "tensor_spread": spread,
                          "compute_times": {name.replace("_ms", ""): source for name, source in sources.items()},
                          **result}))
    else:
        print(_text(args, named, compressor, assumptions, result, plan, compute))
    if args.plot:
        curves = _plot_data(tensors, ready, compressor, cluster, forward, backward, args.margin)
        _plot(args.plot, curves, f"{sum(n for _, n in tensors):,} gradients in {len(tensors)} tensors, "
              f"{cluster.workers} workers, {type(compressor).__name__}, compute {1e3 * (forward + backward):g} ms"
              + (" (assumed)" if "assumed" in sources.values() else ""), network.bandwidth)
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
