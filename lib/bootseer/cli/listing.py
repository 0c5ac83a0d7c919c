"""Listings (``deps ls``, ``image ls``, ``ckpt ls``): one row per line, always.

Columns are as wide as their widest cell and two spaces apart; the last column holds
the one long value (a name, a path) and is shortened from the left (``…`` and its end,
which names the file) where the row would not fit the terminal, so no row wraps. Only
on a terminal, or where ``$COLUMNS`` says how wide: a listing into a file or a pipe
keeps every value whole. No colour, so ``NO_COLOR`` and files read the same.

    >>> rows = [["1.0 KiB", "a"], ["12.0 MiB", "b/c"]]
    >>> print(format_table(["SIZE", "NAME"], rows, right={0}, width=80))
        SIZE  NAME
     1.0 KiB  a
    12.0 MiB  b/c
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence

GAP = "  "


def terminal_width() -> int | None:
    """The width to fit, or None where output is not for a terminal."""
    if os.environ.get("COLUMNS") or sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def format_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    right: set[int] | frozenset[int] = frozenset(),
    width: int | None = None,
) -> str:
    cols = len(headers)
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(cols - 1)]
    lines = []
    for row in [headers, *rows]:
        cells = [
            str(row[i]).rjust(widths[i]) if i in right else str(row[i]).ljust(widths[i])
            for i in range(cols - 1)
        ]
        lead = GAP.join(cells) + (GAP if cells else "")
        last = str(row[-1])
        if width is not None and len(lead) + len(last) > width:
            room = max(1, width - len(lead) - 1)
            last = "…" + last[-room:]
        lines.append((lead + last).rstrip())
    return "\n".join(lines)


def print_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    right: set[int] | frozenset[int] = frozenset(),
) -> None:
    print(format_table(headers, rows, right, terminal_width()))
