"""A file patch as edits on its base file: (base lines base_start:base_end) -> new lines.

The patch is first applied to the base with the engine (exact or offset, never fuzz), so the
edits are located where the engine located them; each run of removed/added lines inside a
hunk is one edit. Lines keep their end-of-line, so the edits rebuild the patched file byte
for byte (checked).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Sequence, Tuple

from sparkmods.runtime.engine import OK, OK_OFFSET, plan_file
from sparkmods.runtime.udiff import FilePatch

__all__ = ["Edit", "BaseMismatch", "split_lines", "join_lines", "extract_edits", "apply_edits"]

_LINE = re.compile(r"[^\n]*\n|[^\n]+")


class BaseMismatch(ValueError):
    """The patch does not apply to the base it is said to be written against."""


@dataclass(frozen=True)
class Edit:
    hunk: int  # 1-based hunk number in its file patch
    base_start: int  # base lines [base_start, base_end) are replaced; equal bounds insert before base_start
    base_end: int
    new: Tuple[str, ...]


def split_lines(data: bytes) -> List[str]:
    """Lines with their end-of-line ("\\n" ends a line; "\\r\\n" keeps its "\\r")."""
    return _LINE.findall(data.decode("utf-8", "surrogateescape"))


def join_lines(lines: Sequence[str]) -> bytes:
    return "".join(lines).encode("utf-8", "surrogateescape")


def apply_edits(lines: Sequence[str], edits: Sequence[Tuple[int, int, Sequence[str]]]) -> List[str]:
    """lines with each (start, end, new) applied; edits sorted and not overlapping."""
    out: List[str] = []
    cursor = 0
    for start, end, new in edits:
        out.extend(lines[cursor:start])
        out.extend(new)
        cursor = end
    out.extend(lines[cursor:])
    return fix_eol(out)


def fix_eol(lines: List[str]) -> List[str]:
    """Give every line but the last an end-of-line (an edit placed after a last line
    that had none would otherwise glue two lines together)."""
    eol = "\r\n" if sum(1 for x in lines if x.endswith("\r\n")) * 2 > len(lines) else "\n"
    return [x if x.endswith("\n") or i == len(lines) - 1 else x + eol for i, x in enumerate(lines)]


def extract_edits(fp: FilePatch, base: bytes, label: str) -> Tuple[List[str], List[str], List[Edit]]:
    """(base lines, patched lines, edits); BaseMismatch when the patch does not apply to base."""
    res = plan_file(fp, base)
    if res.status not in (OK, OK_OFFSET) or res.after is None:
        detail = next((f"hunk {h.index}: {h.reason}" for h in res.hunks if h.outcome not in ("exact", "offset")),
                      res.reason or res.status)
        raise BaseMismatch(f"{fp.path}: the patch does not apply to {label} ({res.status}: {detail})")
    base_lines, after = split_lines(base), split_lines(res.after)
    edits: List[Edit] = []
    delta = 0
    for number, (hunk, hres) in enumerate(zip(fp.hunks, res.hunks), 1):
        k = (hres.line or 1) - 1
        m = k + delta
        i = 0
        while i < len(hunk.lines):
            if hunk.lines[i][0] == " ":
                k, m, i = k + 1, m + 1, i + 1
                continue
            minus = plus = 0
            while i < len(hunk.lines) and hunk.lines[i][0] != " ":
                if hunk.lines[i][0] == "-":
                    minus += 1
                else:
                    plus += 1
                i += 1
            edits.append(Edit(number, k, k + minus, tuple(after[m:m + plus])))
            k, m = k + minus, m + plus
        delta = m - k
    rebuilt = apply_edits(base_lines, [(e.base_start, e.base_end, e.new) for e in edits])
    if rebuilt != after:
        raise BaseMismatch(f"{fp.path}: internal: the edits do not rebuild the patched file (line endings?)")
    return base_lines, after, edits
