"""Write the rebased patch (a unified diff against onto) and prove it applies exactly.

The proof uses the same engine run.sh uses: every hunk must locate `exact` on onto and the
result must be byte-identical to the merged file. A patch that fails the proof is never
handed out.
"""

from __future__ import annotations

from difflib import SequenceMatcher
from typing import Callable, Dict, List, Optional, Sequence

from sparkmods.runtime.engine import EXACT, OK, plan
from sparkmods.runtime.udiff import parse_patch

__all__ = ["file_diff", "verify"]

CONTEXT = 3


def _body(tag: str, lines: Sequence[str]) -> List[str]:
    out = []
    for line in lines:
        text = line[:-2] if line.endswith("\r\n") else line[:-1] if line.endswith("\n") else line
        out.append(f"{tag}{text}\n")
        if not line.endswith("\n"):
            out.append("\\ No newline at end of file\n")
    return out


def _range(start: int, length: int) -> str:
    if length == 0:
        return f"{start},0"
    return f"{start + 1}" if length == 1 else f"{start + 1},{length}"


def file_diff(path: str, old: Optional[Sequence[str]], new: Optional[Sequence[str]]) -> str:
    """Unified diff of one file (old None: created, new None: deleted); "" when equal."""
    a = list(old or [])
    b = list(new or [])
    if old is not None and new is not None and a == b:
        return ""
    head = [f"--- {'a/' + path if old is not None else '/dev/null'}\n",
            f"+++ {'b/' + path if new is not None else '/dev/null'}\n"]
    out = list(head)
    if not a or not b:
        out.append(f"@@ -{_range(0, len(a))} +{_range(0, len(b))} @@\n")
        out += _body("-", a) + _body("+", b)
        return "".join(out)
    for group in SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(CONTEXT):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        out.append(f"@@ -{_range(i1, i2 - i1)} +{_range(j1, j2 - j1)} @@\n")
        for tag, x1, x2, y1, y2 in group:
            if tag == "equal":
                out += _body(" ", a[x1:x2])
                continue
            out += _body("-", a[x1:x2])
            out += _body("+", b[y1:y2])
    return "".join(out)


def verify(text: str, read: Callable[[str], Optional[bytes]], wanted: Dict[str, Optional[bytes]]) -> Optional[str]:
    """None when every hunk of text applies `exact` to `read` and yields `wanted`; else why."""
    try:
        patches = parse_patch(text)
    except ValueError as exc:
        return f"the regenerated patch does not parse: {exc}"
    for res in plan(patches, read):
        if res.status != OK or any(h.outcome != EXACT for h in res.hunks):
            return f"{res.path}: the regenerated patch is not exact on onto ({res.status}: {res.reason})"
        if res.after != wanted.get(res.path, b"\0missing"):
            return f"{res.path}: the regenerated patch does not produce the merged file"
    if {p.path for p in patches} != set(wanted):
        return "the regenerated patch does not cover exactly the merged files"
    return None

