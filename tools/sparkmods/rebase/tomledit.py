"""Minimal edits to a hand-written mod.toml: change one variant's `vllm` range, insert one
new `[[variant]]` table. Every other byte (comments, order, spacing) stays as it was.

The edit is trusted only after the result is parsed again and found equal to the intended
data; a file laid out in a way these line rules do not understand is refused, never guessed.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Sequence, Tuple

__all__ = ["TomlEditError", "render_variant", "edit_manifest", "set_verified"]

_VARIANT = re.compile(r"^\s*\[\[\s*variant\s*\]\]\s*(#.*)?$")
_HEADER = re.compile(r"^\s*\[")
_LABEL = re.compile(r"""^\s*label\s*=\s*(["'])(.*?)\1\s*(#.*)?$""")
_VERIFIED = re.compile(r"^\s*verified\s*=\s*\[[^\]]*\]\s*(#.*)?$")
_RANGE = re.compile(r"""^(\s*vllm\s*=\s*)(["'])((?:(?!\2).)*)\2(\s*(?:#.*)?)$""")


class TomlEditError(ValueError):
    """mod.toml is laid out in a way the minimal edit cannot handle safely."""


def _value(v: Any) -> str:
    """A TOML value for strings, lists and inline tables (JSON strings are TOML basic strings)."""
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_value(x)}" for k, x in v.items()) + " }"
    raise TomlEditError(f"cannot write a {type(v).__name__} value")


def render_variant(table: Dict[str, Any], comment: str) -> List[str]:
    lines = [f"# {comment}\n", "[[variant]]\n"]
    for key in ("label", "vllm", "patches", "install", "verified", "notes"):
        if key in table:
            lines.append(f"{key} = {_value(table[key])}\n")
    return lines


def _tables(lines: Sequence[str]) -> Dict[str, Tuple[int, int]]:
    """label -> (header line, end line exclusive) for every [[variant]] table."""
    heads = [i for i, line in enumerate(lines) if _HEADER.match(line)]
    out: Dict[str, Tuple[int, int]] = {}
    for n, i in enumerate(heads):
        if not _VARIANT.match(lines[i]):
            continue
        end = heads[n + 1] if n + 1 < len(heads) else len(lines)
        labels = [m.group(2) for m in (_LABEL.match(line) for line in lines[i + 1:end]) if m]
        if len(labels) != 1:
            raise TomlEditError(f"the [[variant]] table at line {i + 1} has no single plain `label = \"...\"` line")
        out[labels[0]] = (i, end)
    return out


def _insert_at(lines: Sequence[str], end: int) -> int:
    """Where a new table goes after a table ending at `end`: before the comment block that
    sits directly on top of the next header (it belongs to that table) and the blank lines."""
    i = end
    if i < len(lines):
        while i > 0 and lines[i - 1].lstrip().startswith("#"):
            i -= 1
    while i > 0 and not lines[i - 1].strip():
        i -= 1
    return i


def edit_manifest(text: str, cuts: Dict[str, str], after_label: str, block: List[str]) -> str:
    """text with each cut variant's range replaced and `block` inserted after `after_label`'s table."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    tables = _tables(lines)
    for label, new_range in cuts.items():
        if label not in tables:
            raise TomlEditError(f"no [[variant]] table with label {label!r}")
        start, end = tables[label]
        hits = [i for i in range(start + 1, end) if _RANGE.match(lines[i])]
        if len(hits) != 1:
            raise TomlEditError(f"variant {label!r}: no single one-line `vllm = \"...\"` to change")
        m = _RANGE.match(lines[hits[0]])
        assert m is not None
        eol = "\n" if lines[hits[0]].endswith("\n") else ""
        rest = m.group(4).rstrip("\r\n")
        lines[hits[0]] = f'{m.group(1)}{m.group(2)}{new_range}{m.group(2)}{rest}{eol}'
    if after_label not in tables:
        raise TomlEditError(f"no [[variant]] table with label {after_label!r}")
    at = _insert_at(lines, tables[after_label][1])
    following = lines[at:]
    insert = ["\n"] + list(block) + (["\n"] if following and following[0].strip() else [])
    return "".join(lines[:at] + insert + following)


def set_verified(text: str, label: str, versions: List[str], comment: str) -> str:
    """text with variant `label`'s one-line `verified = [...]` replaced by versions and the
    comment line directly above its header (the one `render_variant` wrote) by comment."""
    lines = text.splitlines(keepends=True)
    tables = _tables(lines)
    if label not in tables:
        raise TomlEditError(f"no [[variant]] table with label {label!r}")
    start, end = tables[label]
    hits = [i for i in range(start + 1, end) if _VERIFIED.match(lines[i])]
    if len(hits) != 1:
        raise TomlEditError(f"variant {label!r}: no single one-line `verified = [...]` to change")
    lines[hits[0]] = f"verified = {_value(versions)}\n"
    if start > 0 and lines[start - 1].lstrip().startswith("#"):
        lines[start - 1] = f"# {comment}\n"
    return "".join(lines)
