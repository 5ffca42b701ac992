"""Where a job's collectives spend their time, read from a Horovod timeline.

    HOROVOD_TIMELINE=/tmp/timeline.json horovodrun ... python train.py
    python -m research.horovod_timeline /tmp/timeline.json [--skip=PREFIX,...] [--markdown_out=FILE]

Horovod's timeline is rank 0's view, one track per tensor: NEGOTIATE_<OP> runs from rank 0
submitting the tensor to every rank having submitted it (so it holds the ranks' skew and the wait
for the background loop's next cycle), then <OP> with its parts (GLOO_<OP>: the collective itself;
MEMCPY_IN/OUT_FUSION_BUFFER; ALLOCATE_OUTPUT). Tensors are grouped by name with every run of digits
replaced by '#' (a model's layers, a bucket's parts), names starting with a --skip prefix left out.
For each group and phase: the count of spans and the median, mean and 90th percentile
milliseconds. A fused collective shows once per tensor it carries, all with its duration.
"""

from __future__ import annotations

import collections
import json
import re
import statistics

from absl import app, flags

__all__ = ["phase_spans", "read_timeline", "summarise"]

FLAGS = flags.FLAGS


def read_timeline(path: str) -> list:
    """The events of a Horovod timeline file: a JSON list that a running (or killed) job may not
    have closed."""
    with open(path) as f:
        text = f.read().rstrip().rstrip(",")
    if not text.startswith("["):
        raise ValueError(f"{path}: not a Horovod timeline (a JSON list of trace events)")
    return json.loads(text if text.endswith("]") else text + "]")


def phase_spans(events: list) -> list:
    """[(tensor name, phase, start microseconds, duration microseconds, depth)] of every
    begin/end pair, depth 0 for a tensor's top-level phases. A begin left open is left out."""
    names = {e["pid"]: e["args"]["name"].rsplit("/", 1)[-1] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name" and "name" in e.get("args", {})}
    open_spans = collections.defaultdict(list)
    spans = []
    for event in events:
        if event.get("ph") == "B":
            open_spans[event["pid"]].append((event["name"], event["ts"]))
        elif event.get("ph") == "E" and open_spans[event["pid"]]:
            phase, start = open_spans[event["pid"]].pop()
            spans.append((names.get(event["pid"], "?"), phase, start, event["ts"] - start, len(open_spans[event["pid"]])))
    return spans


def _group(name: str) -> str:
    return re.sub(r"\d+", "#", name)


def summarise(spans: list, skip=()) -> str:
    """Markdown: one row per tensor group and phase (top-level phases first)."""
    durations = collections.defaultdict(list)
    for name, phase, _, duration, depth in spans:
        if not name.startswith(tuple(skip)):
            durations[_group(name), depth, phase].append(duration / 1e3)
    lines = ["| tensors | phase | spans | median ms | mean ms | p90 ms |", "|---|---|---:|---:|---:|---:|"]
    for (group, depth, phase), values in sorted(durations.items()):
        values.sort()
        lines.append(f"| {group} | {'  ' * depth}{phase} | {len(values)} | {statistics.median(values):.2f} | "
                     f"{statistics.fmean(values):.2f} | {values[int(0.9 * (len(values) - 1))]:.2f} |")
    return "\n".join(lines)


def main(argv):
    if len(argv) != 2:
        raise app.UsageError("give one Horovod timeline file")
    text = summarise(phase_spans(read_timeline(argv[1])), FLAGS.skip)
    print(text)
    if FLAGS.markdown_out:
        with open(FLAGS.markdown_out, "w") as f:
            f.write(text + "\n")


def _define_flags() -> None:
    """The flags, defined when this module runs (not on import: the tests import its summary beside
    other benchmarks that define flags of the same names)."""
    flags.DEFINE_list("skip", [], "Leave out tensors whose name starts with one of these.")
    flags.DEFINE_string("markdown_out", None, "Also write the table here.")


if __name__ == "__main__":
    _define_flags()
    app.run(main)
