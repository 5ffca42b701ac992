"""Fixed-width and Markdown tables for the benchmarks.

A table is described by columns (heading, width, cell) where cell(row) -> str; rows are whatever
the cells read (dicts here).
"""

from __future__ import annotations

__all__ = ["markdown_table", "text_table"]


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
