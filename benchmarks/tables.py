"""Fixed-width and Markdown tables for the benchmarks, and the machine line printed above them.

A table is described by columns (heading, width, cell) where cell(row) -> str; rows are whatever
the cells read (dicts here).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path

__all__ = ["machine_header", "markdown_table", "text_table", "write_results"]


def machine_header() -> str:
    """CPU model, usable CPUs, TensorFlow's version, intra-op threads and CPU allocator, and
    today's date, for the line above a table of timings (imports TensorFlow)."""
    import tensorflow as tf

    from tfcomp.calibration import cpu_allocator

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            cpu = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    cpus = len(os.sched_getaffinity(0))
    threads = tf.config.threading.get_intra_op_parallelism_threads()
    threads_text = str(threads) if threads else f"default ({cpus})"
    return (
        f"CPU: {cpu or 'unknown'}, nproc {cpus}; TensorFlow {tf.__version__}; "
        f"intra-op threads {threads_text}; CPU allocator {cpu_allocator()}; {datetime.date.today().isoformat()}"
    )


def _align(text: str, width: int, left: bool) -> str:
    return text.ljust(width) if left else text.rjust(width)


def text_table(columns: list, rows: list, first_left: bool = False, separator: str = " ") -> str:
    """One line per row, cells right-aligned (the first left-aligned when first_left)."""
    def line(cells):
        return separator.join(_align(c, w, first_left and i == 0) for i, (c, (_, w, _)) in enumerate(zip(cells, columns)))

    lines = [line([h for h, _, _ in columns])]
    lines += [line([cell(r) for _, _, cell in columns]) for r in rows]
    return "\n".join(lines)


def markdown_table(columns: list, rows: list, first_left: bool = False) -> str:
    """The same table in Markdown, numeric columns right-aligned."""
    alignments = ["---" if first_left and i == 0 else "---:" for i in range(len(columns))]
    lines = ["| " + " | ".join(h for h, _, _ in columns) + " |", "|" + "|".join(alignments) + "|"]
    lines += ["| " + " | ".join(cell(r) for _, _, cell in columns) + " |" for r in rows]
    return "\n".join(lines)


def print_table(header: str, columns: list, rows: list, markdown_out=None) -> None:
    """Prints `header` and the text table; with `markdown_out` (a path), also writes both there as
    Markdown (the kernel benchmarks' ending)."""
    print(header)
    print(text_table(columns, rows))
    if markdown_out:
        with open(markdown_out, "w") as out:
            out.write(f"{header}\n\n{markdown_table(columns, rows)}\n")


def write_results(out_dir, name: str, record: dict, text: str) -> None:
    """Writes `record` as `name`.json and the summary `text` as `name`.md into `out_dir` (made if it
    is missing), and prints the text."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(record, indent=1))
    (out / f"{name}.md").write_text(text + "\n")
    print(text)
