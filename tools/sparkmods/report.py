"""Human and machine output for check results: a compact table, or one JSON document."""

from __future__ import annotations

import json
import os
import sys
from typing import List, Optional, Sequence

from rich.console import Console
from rich.table import Table

from sparkmods.check import CheckRow
from sparkmods.runtime.modcheck import GREEN

STYLE = {"ok": "green", "ok-offset": "green", "applied": "cyan", "upstream": "blue",
         "no-variant": "yellow", "conflict": "red", "missing-file": "red", "drift": "magenta"}


def detail(row: CheckRow) -> str:
    """One short line: why a cell is not green (the first conflicting hunk), or offsets."""
    res = row.result
    for f in res.files:
        for h in f.hunks:
            if h.outcome == "conflict":
                where = f" near line {h.near.line}" if h.near else ""
                return f"{f.path} hunk {h.index}: {h.reason}{where}"
            if h.outcome == "offset" and res.status == "ok-offset":
                return f"{f.path} hunk {h.index} at offset {h.offset:+d}"
    return res.reason if res.status not in ("ok", "applied") else ""


def print_table(rows: Sequence[CheckRow], title: str = "") -> None:
    console = Console(stderr=False, highlight=False, soft_wrap=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 1_000  # logs and pipes: one line per row, never folded at 80 columns
    table = Table(title=title or None, box=None, pad_edge=False, header_style="bold")
    # Releases are named by their version; other targets (dir:, image:, index:) also by the spec.
    show_target = any(not r.target.startswith("pypi:") for r in rows)
    columns = ["mod", "vllm"] + (["target"] if show_target else []) + ["variant", "status", "detail"]
    for col in columns:
        table.add_column(col, overflow="fold" if col in ("detail", "target") else "ellipsis",
                         no_wrap=col not in ("detail", "target"))
    for row in rows:
        res = row.result
        cells = [res.mod, res.version] + ([row.target] if show_target else [])
        table.add_row(*cells, res.variant or "-", f"[{STYLE.get(res.status, 'white')}]{res.status}[/]", detail(row))
    with console.capture() as captured:
        console.print(table)
    # rich pads every cell to its column's width; padding at the end of a line is noise in logs
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


def summary_line(rows: Sequence[CheckRow]) -> str:
    bad = sum(1 for r in rows if r.result.status not in GREEN)
    return f"{len(rows)} checked, {len(rows) - bad} green, {bad} not"


def print_json(rows: Sequence[CheckRow], fetch: dict, result_cache: Optional[dict] = None) -> None:
    doc = {"results": [r.to_dict() for r in rows], "fetch": fetch}
    if result_cache is not None:
        doc["result_cache"] = result_cache  # rows reused from stored results vs checked now
    json.dump(doc, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")


def exit_code(rows: List[CheckRow]) -> int:
    return 0 if all(r.result.status in GREEN for r in rows) else 1
