"""Pytest plugin for `benchmarks.horovod_compat`: tfcomp as the default compression, and a log per rank.

Loaded into every worker's pytest with `-p benchmarks.horovod_compat_shim`; configured by the
environment that `benchmarks.horovod_compat` sets:

  TFCOMP_COMPAT_COMPRESSION  "none" (patch nothing: stock Horovod) or a key of `COMPRESSORS`.
  TFCOMP_COMPAT_OUT          folder for `rank<HOROVOD_RANK>.jsonl`.

With a tfcomp compression it wraps the Horovod entry points in `WRAPPED` so that a call that passes
no `compression`, or Horovod's default `Compression.none`, gets a fresh tfcomp compressor instead;
a call with any other compression keeps it. The sparsifiers of `COMPRESSORS` keep every element
(ratio 1, so Horovod's exact expectations still hold) and are forced onto the compressed path:
`min_elements=1` (by default tensors under 8192 elements, all of Horovod's test models, go dense)
and one strategy for every bucket. A call made in TF1 graph mode, which tfcomp refuses by design
(the first half of every test that Horovod's files run with `run_all_in_graph_and_eager_modes`),
is left to Horovod as it is, so that the eager half of the test still runs with tfcomp.

The log has one JSON line per test, written when the test ends (so a run cut off by its timeout
keeps what it finished): {"test", "outcome", "message", "replaced", "explicit", "graph_mode",
"strategies"}, where outcome is pytest's passed / failed / skipped / error (a failure outside the
test's call: setup, teardown, or collection, whose "test" is then the module), message the first
line of the error or skip reason (joined with the next ones while it ends in ":"; for an error
inside a tf.function, with the error's last line), replaced and explicit the wrapped calls of the
test that got tfcomp's compressor or kept their own, graph_mode the calls left to Horovod in TF1
graph mode (a call from inside another wrapped call is not counted), and strategies
{strategy: gradients} over the tfcomp exchanges of the test's optimizers and tapes
(`tfcomp.exchange_of(...).records`, how the last list of gradients each exchanged was sent:
"TopK allgather", "allreduce", "fp16 allreduce", "sparse allgather" ...; "not run" for an exchange
that exchanged nothing). The first line is {"collected": n, "tfcomp": path or null}.
"""

import collections
import functools
import inspect
import json
import os

__all__ = ["COMPRESSORS", "WRAPPED"]

COMPRESSORS = {
    "NoCompression": lambda tfcomp: tfcomp.NoCompression(),
    "FP16": lambda tfcomp: tfcomp.FP16(),
    "TopK": lambda tfcomp: tfcomp.TopK(ratio=1.0, strategy="allgather", min_elements=1),
    "TopK-artopk": lambda tfcomp: tfcomp.TopK(ratio=1.0, strategy="artopk", min_elements=1),
}
WRAPPED = {
    "horovod.tensorflow": ["DistributedOptimizer", "DistributedGradientTape", "PartialDistributedGradientTape"],
    "horovod.tensorflow.keras": ["DistributedOptimizer", "PartialDistributedOptimizer"],
    "horovod.keras": ["DistributedOptimizer", "PartialDistributedOptimizer"],
}

_calls = {"replaced": 0, "explicit": 0, "graph_mode": 0, "depth": 0}
_built = []  # what the test's wrapped calls that got tfcomp's compressor returned
_reports = {}
_log = None
_tfcomp_path = None


def _write(record: dict) -> None:
    _log.write(json.dumps(record) + "\n")
    _log.flush()


def _tf1_graph_mode() -> bool:
    """Whether TensorFlow builds a TF1 graph here (eager execution off outside any tf.function)."""
    import tensorflow as tf

    with tf.init_scope():
        return not tf.executing_eagerly()


def _with_tfcomp_default(function, make_compressor):
    from horovod.tensorflow.compression import Compression

    signature = inspect.signature(function)

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        if _calls["depth"]:  # called by another wrapped function (a Partial variant): leave it alone
            return function(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        replaced = False
        if bound.arguments.get("compression", Compression.none) is not Compression.none:
            _calls["explicit"] += 1
        elif _tf1_graph_mode():
            _calls["graph_mode"] += 1
        else:
            bound.arguments["compression"] = make_compressor()
            _calls["replaced"] += 1
            replaced = True
        _calls["depth"] += 1
        try:
            built = function(*bound.args, **bound.kwargs)
        finally:
            _calls["depth"] -= 1
        if replaced:
            _built.append(built)
        return built

    return wrapper


def _strategies() -> dict:
    """{strategy: gradients} over the exchanges behind what the test's replaced calls built."""
    import tfcomp

    counts = collections.Counter()
    exchanges = {}
    for built in _built:
        try:
            exchange = tfcomp.exchange_of(built)
        except TypeError:
            counts["no tfcomp exchange"] += 1
            continue
        exchanges[id(exchange)] = exchange
    for exchange in exchanges.values():
        counts.update([r.strategy for r in exchange.records] or ["not run"])
    return dict(counts)


def _install(compression: str) -> str:
    """Wraps the entry points in WRAPPED; returns the path of the tfcomp package it uses."""
    import importlib

    import tfcomp

    make = functools.partial(COMPRESSORS[compression], tfcomp)
    for module_name, names in WRAPPED.items():
        module = importlib.import_module(module_name)
        for name in names:
            if hasattr(module, name):
                setattr(module, name, _with_tfcomp_default(getattr(module, name), make))
    return os.path.dirname(tfcomp.__file__)


def _first_line(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        text = crash.message
    elif isinstance(report.longrepr, tuple):  # a skip: (path, line, reason)
        text = report.longrepr[2]
    else:
        text = str(report.longrepr)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0] if lines else ""
    if first.endswith("in user code:"):  # an error in a tf.function: its traceback, then the error
        return f"{first} ... {lines[-1]}"[:300]
    for line in lines[1:]:  # "...Error: Graph execution error:" says what follows
        if not first.endswith(":"):
            break
        first += " " + line
    return first[:300]


def pytest_configure(config):
    global _log, _tfcomp_path
    compression = os.environ.get("TFCOMP_COMPAT_COMPRESSION", "none")
    if compression != "none":
        _tfcomp_path = _install(compression)
    out = os.environ["TFCOMP_COMPAT_OUT"]
    _log = open(os.path.join(out, f"rank{os.environ.get('HOROVOD_RANK', '0')}.jsonl"), "w")


def pytest_collection_finish(session):
    _write({"collected": len(session.items), "tfcomp": _tfcomp_path})


def pytest_collectreport(report):
    if report.failed:
        _write({"test": report.nodeid, "outcome": "error", "message": _first_line(report), "replaced": 0,
                "explicit": 0, "graph_mode": 0, "strategies": {}})


def pytest_runtest_logstart(nodeid, location):
    _calls.update(replaced=0, explicit=0, graph_mode=0)
    _built.clear()
    _reports.clear()


def pytest_runtest_logreport(report):
    _reports[report.when] = report
    if report.when != "teardown":
        return
    setup, call = _reports.get("setup"), _reports.get("call")
    phases = [r for r in (setup, call, report) if r is not None]
    skipped = next((r for r in phases if r.skipped), None)
    if setup is not None and setup.failed:
        outcome, source = "error", setup
    elif skipped is not None:
        outcome, source = "skipped", skipped
    elif call is not None and call.failed:
        outcome, source = "failed", call
    elif report.failed:
        outcome, source = "error", report
    else:
        outcome, source = "passed", None
    _write({"test": report.nodeid, "outcome": outcome, "message": _first_line(source) if source else "",
            "replaced": _calls["replaced"], "explicit": _calls["explicit"], "graph_mode": _calls["graph_mode"],
            "strategies": _strategies()})
    _built.clear()


def pytest_unconfigure(config):
    if _log is not None:
        _log.close()
