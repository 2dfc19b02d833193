"""Human and machine output for check results: a compact table, or one JSON document."""

from __future__ import annotations

import json
import os
import sys
from typing import List, Optional, Sequence

from sparkmods.checking.rows import CheckRow, Tally, breaks
from sparkmods.matrix.served import describe
from sparkmods.runtime.engine import OFFSET, OK_OFFSET

STYLE = {"ok": "green", "ok-offset": "green", "applied": "cyan", "upstream": "blue",
         "no-variant": "yellow", "conflict": "red", "missing-file": "red", "drift": "magenta"}


def detail(row: CheckRow) -> str:
    """One short line: why a cell is not green (the first conflicting hunk), offsets, how the
    variant was chosen, and whether a GPU run served it."""
    said = _why(row)
    if row.served is None:
        return said
    return f"{said}; {describe(row.served)}" if said else describe(row.served)


def _why(row: CheckRow) -> str:
    res = row.result
    for f, h in breaks(res.files):
        if h is not None:
            where = f" near line {h.near.line}" if h.near else ""
            return f"{f.path} hunk {h.index}: {h.reason}{where}"
    if res.status == OK_OFFSET:
        for f in res.files:
            for h in f.hunks:
                if h.outcome == OFFSET:
                    return f"{f.path} hunk {h.index} at offset {h.offset:+d}"
    if res.how and res.green:
        return res.how  # a build whose variant its files chose (modcheck)
    return res.reason if res.status not in ("ok", "applied") else ""


def print_table(rows: Sequence[CheckRow], title: str = "") -> None:
    # Releases are named by their version; other targets (dir:, image:, index:) also by the spec.
    show_target = any(not r.target.startswith("pypi:") for r in rows)
    columns = ["mod", "vllm"] + (["target"] if show_target else []) + ["variant", "status", "detail"]
    cells = [[r.result.mod, r.result.version] + ([r.target] if show_target else [])
             + [r.result.variant or "-", r.result.status, detail(r)] for r in rows]
    plain = None if title else _plain_table(columns, cells)
    if plain is not None:
        sys.stdout.write(plain)
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=False, highlight=False, soft_wrap=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = _PIPE_WIDTH  # logs and pipes: one line per row, never folded at 80 columns
    table = Table(title=title or None, box=None, pad_edge=False, header_style="bold")
    for col in columns:
        table.add_column(col, overflow="fold" if col in ("detail", "target") else "ellipsis",
                         no_wrap=col not in ("detail", "target"))
    status = columns.index("status")
    for row in cells:
        row[status] = f"[{STYLE.get(row[status], 'white')}]{row[status]}[/]"
        table.add_row(*row)
    with console.capture() as captured:
        console.print(table)
    # rich pads every cell to its column's width; padding at the end of a line is noise in logs
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


_PIPE_WIDTH = 1_000
# Environment that makes rich treat a pipe as a terminal or set a width: then rich lays out.
_RICH_ENV = ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "JUPYTER_COLUMNS")


def _plain_table(columns: List[str], cells: List[List[str]]) -> Optional[str]:
    """The table exactly as rich lays it out for a pipe (no colour, nothing folded: columns as
    wide as their widest cell, two spaces apart, line ends trimmed), written without loading
    rich (which costs more than the table); None when rich could lay it out otherwise:
    a terminal, a set width, text rich would read as markup or emoji codes, or a line that
    would not fit."""
    if sys.stdout.isatty() or any(name in os.environ for name in _RICH_ENV):
        return None
    table = [columns] + cells
    texts = {c for row in cells for c in row}
    if any(not c.isascii() or not c.isprintable() or "[" in c for c in texts):
        return None
    if any(":" in c for c in texts):
        from rich._emoji_replace import _emoji_replace

        if any(_emoji_replace(c) != c for c in texts if ":" in c):
            return None
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    if sum(widths) + 2 * (len(widths) - 1) > _PIPE_WIDTH:
        return None
    return "".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() + "\n" for row in table)


def summary_line(rows: Sequence[CheckRow]) -> str:
    tally = Tally.of(r.result.status for r in rows)
    return f"{tally.total} checked, {tally.green} green, {tally.not_green} not"


def print_json(rows: Sequence[CheckRow], fetch: dict, result_cache: Optional[dict] = None) -> None:
    doc = {"results": [r.to_dict() for r in rows], "fetch": fetch}
    if result_cache is not None:
        doc["result_cache"] = result_cache  # rows reused from stored results vs checked now
    # One write: json.dump writes token by token, and where stdout is unbuffered
    # (PYTHONUNBUFFERED, common in containers and CI) every token is a system call.
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False) + "\n")


def exit_code(rows: Sequence[CheckRow]) -> int:
    return 0 if Tally.of(r.result.status for r in rows).not_green == 0 else 1
