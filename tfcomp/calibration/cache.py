"""The calibration cache: compression figures and gradients' ready times kept for later jobs.

The compression costs are a property of the hosts and the compressor, not of the network: rank 0
caches them in a JSON file (`TFCOMP_CALIBRATION_CACHE`, default `~/.cache/tfcomp/calibration.json`;
"none" turns the cache off) keyed by the machine (rank 0's host name and CPU), the world layout, the
TensorFlow and tfcomp versions, the compressor's settings and the gradients' sizes (as far as they
size the probes); a change of any of them measures again. A first stage's lower bounds are cached as
such. The same file keeps the gradients' ready times measured in training (`store_ready_times`),
keyed by the hosts and the gradients' exact sizes, so that a later job of the same model makes its
first plan with them (`cached_ready_times`, rank 0's shared through `tfcomp.collectives`), and the
verdict of a job that found compression not paying on these hosts (`store_dense_verdict`: its
calibration planned dense, or its trial dropped the plan), keyed by the hosts, the compressor's
cost settings and the gradients' sizes, with the share of the step the dense exchange left exposed
then (`cached_dense_verdict`): a later job whose exchange is no more exposed stays dense without
calibrating again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import reprlib
import time

import horovod.tensorflow as hvd
import tensorflow as tf
from absl import logging

from tfcomp.calibration.compression import cost_settings, largest_compression_probe, merge_probe
from tfcomp.calibration.network import network_probe_elements
from tfcomp.collectives import broadcast_floats
from tfcomp.cost_model import ClusterModel

__all__ = ["CACHE_ENV", "cache_key", "cache_path", "cached_dense_verdict", "cached_ready_times", "cpu_allocator",
           "read_cache", "store_dense_verdict", "store_ready_times", "write_cache"]

CACHE_ENV = "TFCOMP_CALIBRATION_CACHE"
_DEFAULT_CACHE = os.path.join("~", ".cache", "tfcomp", "calibration.json")
# In the cache key: compression probes computing alone (before: with the real collectives, less
# their modelled time, which gave lower figures).
_PROBE_METHOD = "compute alone"


def cache_key(compressor, process_set, max_elements: int, tensor_elements=()) -> str:
    """What the cached figures depend on; any change measures again: the host, its CPU, the world
    layout, TensorFlow's and tfcomp's versions, the compressor's `cost_settings`, and of `max_elements` (the
    gradients' size) and `tensor_elements` (their tensors' sizes), the probe sizes they give: these
    follow the size from 2^18 to 2^23 elements, and the merge probe is the tensors' own list
    where `merge_probe` takes it; and how the probes measure (`_PROBE_METHOD`), so that figures
    measured another way are measured again."""
    largest = largest_compression_probe(max_elements)
    probes = (*network_probe_elements(max_elements), largest, merge_probe(largest, tensor_elements))
    return _hashed_key(process_set, repr(cost_settings(compressor)), str(probes), _PROBE_METHOD)


def cpu_allocator() -> str:
    """"BFC" or "malloc": the allocator TensorFlow gives CPU tensors in this process, as
    `TF_CPU_ALLOCATOR_USE_BFC` says (TensorFlow reads it when it makes its first CPU tensor).
    Compression costs depend on it: with malloc, glibc maps every allocation over 32 MiB afresh
    and page-faults it on every step (README, "Training on CPUs")."""
    return "BFC" if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").strip().lower() in ("1", "true") else "malloc"


def _hashed_key(process_set, *parts) -> str:
    """A cache key of `parts` and what every cached figure depends on: the host, its CPU, the world
    layout, TensorFlow's and tfcomp's versions, the CPU allocator."""
    layout = [hvd.size(), hvd.local_size(), hvd.cross_size(), process_set.size()]
    parts = [platform.node(), platform.machine(), platform.processor(), str(os.cpu_count()), str(layout),
             tf.__version__, _tfcomp_version(), cpu_allocator(), *parts]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def _tfcomp_version() -> str:
    from tfcomp.version import __version__

    return __version__


def cache_path():
    setting = os.environ.get(CACHE_ENV, _DEFAULT_CACHE)
    return None if setting.strip().lower() in ("", "none", "off") else os.path.expanduser(setting)


_CACHE_FORMAT, _CACHE_VERSION = "tfcomp calibration cache", 2
# The file's sections: calibration figures by `cache_key`, gradients' ready times by `_ready_key`, the
# verdicts that compression does not pay by `_verdict_key`.
_CACHE_SECTIONS = ("entries", "ready_times", "verdicts")
_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}


def _cache_content(path) -> dict:
    """The cache file at `path` as a dict ({} where there is none); a ValueError saying what is
    wrong with a file that is not a cache of this format and version."""
    try:
        with open(path, encoding="utf-8") as f:
            content = json.load(f)
    except FileNotFoundError:
        return {}
    except OSError as error:
        raise ValueError(f"cannot be read ({error.strerror or error})") from None
    except (ValueError, RecursionError) as error:  # not JSON, not UTF-8, nested too deep
        raise ValueError(f"is not JSON ({error})") from None
    if not isinstance(content, dict):
        raise ValueError(f"holds a JSON {_JSON_TYPES.get(type(content), '?')}, not a cache object")
    format_, version = content.get("format"), content.get("version")
    if format_ != _CACHE_FORMAT or version != _CACHE_VERSION or isinstance(version, bool):
        raise ValueError(f"is not a {_CACHE_FORMAT!r} of version {_CACHE_VERSION} (format "
                         f"{reprlib.repr(format_)}, version {reprlib.repr(version)})")
    for section in _CACHE_SECTIONS:
        if not isinstance(content.get(section, {}), dict):
            raise ValueError(f"has {section} that are a JSON {_JSON_TYPES.get(type(content.get(section)), '?')}, "
                             "not an object")
    if "entries" not in content:
        raise ValueError("has entries that are a JSON null, not an object")
    return content


def _cache_entries(path) -> dict:
    """{key: entry} of the calibration figures in the cache file at `path` (see `_cache_content`)."""
    return _cache_content(path).get("entries", {})


def _cache_entry_model(entry, workers=None) -> ClusterModel:
    """The figures of a cache entry, checked (`ClusterModel.from_list`, and `workers` where given);
    a ValueError saying what is wrong otherwise."""
    if not isinstance(entry, dict) or not isinstance(entry.get("figures"), list):
        raise ValueError(f"is not an object with a list of figures: {reprlib.repr(entry)}")
    model = ClusterModel.from_list(entry["figures"])
    if workers is not None and model.workers != workers:
        raise ValueError(f"has figures for {model.workers} workers, this job has {workers}")
    return model


def _report_cache(path, problem: str) -> None:
    """One warning line (absl logging)."""
    logging.warning("%s", " ".join(f"tfcomp: calibration cache {path}: {problem}".split()))


def read_cache(path, key, workers=None):
    """(figures, complete) cached for `key` (for `workers` workers where given; `complete` False
    for the lower bounds of a first stage that found compression could not pay, and for entries
    written before that was recorded), or None: where there are none, and where the file or the
    entry is unusable (corrupt, of another format or version, of the wrong shape, absurd figures,
    another worker count), which is reported in one line on stderr; the caller measures again and
    `write_cache` replaces it."""
    try:
        entry = _cache_entries(path).get(key)
    except ValueError as error:
        _report_cache(path, f"{error}; ignored, measuring again (the file will be rewritten, this one kept as "
                            f"{path}.bad)")
        return None
    try:
        return None if entry is None else (_cache_entry_model(entry, workers), entry.get("complete") is True)
    except ValueError as error:
        _report_cache(path, f"entry {key}: {error}; ignored, measuring again")
        return None


def write_cache(path, key, model: ClusterModel, complete: bool = True) -> None:
    """Adds (or replaces) `key`'s entry (`complete`: see `read_cache`), keeping the other usable
    entries (`_rewrite_cache`)."""
    _rewrite_cache(path, "entries", key, {"figures": model.validate().to_list(), "complete": bool(complete)})


def _rewrite_cache(path, section: str, key, value: dict) -> None:
    """Sets `key` of the file's `section` to `value` (with the host and the time added), keeping
    the other usable entries of both sections. Atomic: the file is written beside the old one and
    renamed over it, so a killed job leaves the old file or the new one. A file that is not a usable
    cache is kept as `<path>.bad`. Failures are reported, not raised (a read-only home must not stop
    training)."""
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        try:
            content, unusable = _cache_content(path), False
        except ValueError:
            content, unusable = {}, True
        kept = {"entries": {}, "ready_times": {}, "verdicts": {}}
        for other, entry in content.get("entries", {}).items():
            with contextlib.suppress(ValueError):
                _cache_entry_model(entry)
                kept["entries"][other] = entry
        for other, entry in content.get("ready_times", {}).items():
            with contextlib.suppress(ValueError):
                _ready_entry_seconds(entry)
                kept["ready_times"][other] = entry
        for other, entry in content.get("verdicts", {}).items():
            with contextlib.suppress(ValueError):
                _verdict_gain(entry)
                kept["verdicts"][other] = entry
        kept[section][key] = {**value, "host": platform.node(), "time": time.time()}
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump({"format": _CACHE_FORMAT, "version": _CACHE_VERSION, **kept}, f, indent=1, allow_nan=False)
            f.flush()
            os.fsync(f.fileno())
        if unusable and os.path.isfile(path):
            os.replace(path, f"{path}.bad")
        os.replace(temporary, path)
    except (OSError, ValueError) as error:
        _report_cache(path, f"could not be written: {error}")
    finally:
        with contextlib.suppress(OSError):
            os.remove(temporary)


def _ready_key(process_set, tensor_elements) -> str:
    """What cached ready times depend on: the host, its CPU, the world layout, TensorFlow's and
    tfcomp's versions, and the gradients' exact sizes in backprop order (the model)."""
    return _hashed_key(process_set, str([int(n) for n in tensor_elements]))


def _ready_entry_seconds(entry, count=None) -> list:
    """The ready times of a cache entry (floats in [0, 1 hour), `count` of them where given); a
    ValueError saying what is wrong otherwise."""
    seconds = entry.get("seconds") if isinstance(entry, dict) else None
    if not isinstance(seconds, list) or not all(
            isinstance(t, (int, float)) and not isinstance(t, bool) and 0.0 <= t < 3600.0 for t in seconds):
        raise ValueError(f"is not an object with a list of ready times in seconds: {reprlib.repr(entry)}")
    if count is not None and len(seconds) != count:
        raise ValueError(f"has {len(seconds)} ready times for {count} gradients")
    return [float(t) for t in seconds]


def cached_ready_times(process_set, tensor_elements):
    """The gradients' ready times (seconds from the first, one per tensor of `tensor_elements`, in
    backprop order) that `store_ready_times` kept from an earlier job of the same model on the same
    hosts, rank 0's on every rank; None where there are none (or the cache is off). Every rank of
    `process_set` must call it at the same point (one broadcast). An unusable entry is reported in
    one line and ignored."""
    count = len(tensor_elements)
    path = cache_path()
    seconds = None
    if path and process_set.rank() == 0 and count:
        key = _ready_key(process_set, tensor_elements)
        try:
            entry = _cache_content(path).get("ready_times", {}).get(key)
            seconds = None if entry is None else _ready_entry_seconds(entry, count)
        except ValueError as error:
            _report_cache(path, f"ready times {key}: {error}; ignored")
    if process_set.size() > 1:
        shared = broadcast_floats([0.0 if seconds is None else 1.0] + (seconds or [0.0] * count), process_set,
                                  "tfcomp_cached_ready_times")
        seconds = [float(t) for t in shared[1:]] if shared[0] == 1.0 else None
    return seconds


def store_ready_times(process_set, tensor_elements, ready_seconds) -> None:
    """Keeps `ready_seconds` (one per tensor of `tensor_elements`, backprop order; measured in
    training, the same on every rank) for later jobs of the same model on the same hosts
    (`cached_ready_times`); rank 0 writes, the others do nothing. Nothing where the cache is off."""
    seconds = _ready_entry_seconds({"seconds": [float(t) for t in ready_seconds]}, len(tensor_elements))
    path = cache_path()
    if path and process_set.rank() == 0:
        _rewrite_cache(path, "ready_times", _ready_key(process_set, tensor_elements), {"seconds": seconds})


def _verdict_key(process_set, compressor, tensor_elements) -> str:
    """What a cached verdict depends on: the host, its CPU, the world layout, TensorFlow's and
    tfcomp's versions, the compressor's `cost_settings` and the gradients' exact sizes (the model)."""
    return _hashed_key(process_set, "verdict", repr(cost_settings(compressor)), str([int(n) for n in tensor_elements]))


def _verdict_gain(entry) -> float:
    """The exposed share of the step a cached verdict was reached at (a float in [0, 1]); a
    ValueError saying what is wrong otherwise."""
    gain = entry.get("potential_gain") if isinstance(entry, dict) else None
    if isinstance(gain, bool) or not isinstance(gain, (int, float)) or not 0.0 <= gain <= 1.0:
        raise ValueError(f"is not an object with a potential gain in [0, 1]: {reprlib.repr(entry)}")
    return float(gain)


def cached_dense_verdict(process_set, compressor, tensor_elements):
    """The share of the step (E / step, a float in [0, 1]) that the dense exchange left exposed when
    an earlier job of the same model and compressor on the same hosts found compressing not paying
    (`store_dense_verdict`), rank 0's on every rank; None where there is none (or the cache is off).
    Every rank of `process_set` must call it at the same point (one broadcast). An unusable entry is
    reported in one line and ignored."""
    path = cache_path()
    gain = None
    if path and process_set.rank() == 0:
        key = _verdict_key(process_set, compressor, tensor_elements)
        try:
            entry = _cache_content(path).get("verdicts", {}).get(key)
            gain = None if entry is None else _verdict_gain(entry)
        except ValueError as error:
            _report_cache(path, f"verdict {key}: {error}; ignored")
    if process_set.size() > 1:
        shared = broadcast_floats([-1.0 if gain is None else gain], process_set, "tfcomp_cached_verdict")
        gain = None if shared[0] < 0.0 else float(shared[0])
    return gain


def store_dense_verdict(process_set, compressor, tensor_elements, potential_gain: float) -> None:
    """Keeps that compressing did not pay for this model and compressor on these hosts while the
    dense exchange left `potential_gain` (E / step, in [0, 1]) of the step exposed; rank 0 writes,
    the others do nothing. Nothing where the cache is off."""
    gain = _verdict_gain({"potential_gain": min(max(float(potential_gain), 0.0), 1.0)})
    path = cache_path()
    if path and process_set.rank() == 0:
        _rewrite_cache(path, "verdicts", _verdict_key(process_set, compressor, tensor_elements),
                       {"potential_gain": gain})
