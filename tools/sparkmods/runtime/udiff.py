"""Unified diff parser, stdlib only.

Understands plain `---`/`+++` headers and git-style headers (`diff --git`, `new file mode`,
`deleted file mode`, `index`, `similarity`), `/dev/null` for created and deleted files,
`\\ No newline at end of file`, and CRLF line endings inside the patch. Lines are kept
without their end-of-line so the engine can compare them against files of either style.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

__all__ = ["PatchParseError", "Hunk", "FilePatch", "parse_patch", "reverse"]

DEV_NULL = "/dev/null"


class PatchParseError(ValueError):
    """The patch text is malformed; the message names the patch line."""


@dataclass
class Hunk:
    """One hunk. `lines` are (tag, text) pairs with tag in ' ', '-', '+'."""

    old_start: int
    old_len: int
    new_start: int
    new_len: int
    section: str
    lines: List[Tuple[str, str]] = field(default_factory=list)
    old_eof_newline: bool = True  # False when the old side ends without a final newline
    new_eof_newline: bool = True

    @property
    def old_lines(self) -> List[str]:
        return [text for tag, text in self.lines if tag != "+"]

    @property
    def new_lines(self) -> List[str]:
        return [text for tag, text in self.lines if tag != "-"]


@dataclass
class FilePatch:
    """The hunks for one file. `path` is the target path after stripping."""

    old_path: Optional[str]
    new_path: Optional[str]
    hunks: List[Hunk] = field(default_factory=list)

    @property
    def is_new(self) -> bool:
        return self.old_path is None

    @property
    def is_delete(self) -> bool:
        return self.new_path is None

    @property
    def path(self) -> str:
        return self.new_path if self.new_path is not None else self.old_path  # type: ignore[return-value]  # the parser refuses a patch naming neither side


def _strip(raw: str, strip: int, lineno: int) -> Optional[str]:
    name = raw.split("\t", 1)[0].strip()
    if name.startswith('"') and name.endswith('"') and len(name) >= 2:
        name = name[1:-1]
    if name == DEV_NULL:
        return None
    if strip == 0:
        return name  # kept verbatim: an absolute path must reach check_relpath and be refused
    # GNU patch's -p N: remove the smallest prefix holding N slashes, a run of slashes counting
    # as one; so a leading "/" is a component of its own (-p1 turns /usr/x into usr/x).
    rest = name
    for _ in range(strip):
        cut = rest.find("/")
        if cut < 0:
            raise PatchParseError(f"line {lineno}: cannot strip {strip} component(s) from {name!r}")
        rest = rest[cut:].lstrip("/")
    if not rest:
        raise PatchParseError(f"line {lineno}: cannot strip {strip} component(s) from {name!r}")
    return rest


def parse_patch(text: str, strip: int = 1) -> List[FilePatch]:
    """Parse a unified diff into file patches; raises PatchParseError on malformed input."""
    lines = text.splitlines()
    files: List[FilePatch] = []
    current: Optional[FilePatch] = None
    i = 0
    while i < len(lines):
        line = lines[i].rstrip("\r")
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old = _strip(line[4:], strip, i + 1)
            new = _strip(lines[i + 1].rstrip("\r")[4:], strip, i + 2)
            if old is None and new is None:
                raise PatchParseError(f"line {i + 1}: both sides are {DEV_NULL}")
            current = FilePatch(old, new)
            files.append(current)
            i += 2
            continue
        header = _hunk_header(line)
        if header:
            if current is None:
                raise PatchParseError(f"line {i + 1}: hunk before any ---/+++ file header")
            hunk, i = _read_hunk(lines, i, Hunk(*header))
            current.hunks.append(hunk)
            continue
        if _stray_body_line(line) and current is not None and current.hunks:
            raise PatchParseError(f"line {i + 1}: hunk body longer than its @@ header says")
        i += 1
    if not files:
        raise PatchParseError("no file headers (---/+++) found: not a unified diff")
    for fp in files:
        if not fp.hunks:
            raise PatchParseError(f"file {fp.path!r}: header without hunks")
        _check_order(fp)
    return files


def _stray_body_line(line: str) -> bool:
    """A hunk-body-looking line outside any hunk (a git e-mail signature `-- ` is allowed)."""
    return line.startswith(("+", "-", " ")) and not line.startswith(("+++", "---")) and line != "-- "


_HUNK_HEADER = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)")


def _hunk_header(line: str) -> "Optional[tuple[int, int, int, int, str]]":
    """(old start, old length, new start, new length, section) of `@@ -A[,B] +C[,D] @@ section`
    (an absent length is 1); None for any other line."""
    match = _HUNK_HEADER.fullmatch(line)
    if match is None:
        return None
    a, b, c, d, section = match.groups()
    return int(a), int(b) if b is not None else 1, int(c), int(d) if d is not None else 1, section.strip()


def _read_hunk(lines: List[str], i: int, hunk: Hunk) -> "tuple[Hunk, int]":
    old_len, new_len = hunk.old_len, hunk.new_len
    header_line = i + 1
    i += 1
    old_seen = new_seen = 0
    last_tag = ""
    while old_seen < old_len or new_seen < new_len or (i < len(lines) and lines[i].startswith("\\")):
        if i >= len(lines):
            raise PatchParseError(
                f"line {header_line}: hunk ends early (expected -{old_len} +{new_len} lines, "
                f"got -{old_seen} +{new_seen})"
            )
        raw = lines[i].rstrip("\r")
        if raw.startswith("\\"):
            if not last_tag:
                raise PatchParseError(f"line {i + 1}: '\\ No newline' marker before any line")
            if last_tag in (" ", "-"):
                hunk.old_eof_newline = False
            if last_tag in (" ", "+"):
                hunk.new_eof_newline = False
            i += 1
            continue
        tag = raw[:1] if raw else " "  # some tools drop the space of empty context lines
        if tag not in (" ", "-", "+"):
            raise PatchParseError(
                f"line {i + 1}: unexpected {raw[:20]!r} inside hunk (expected ' ', '-' or '+')"
            )
        if tag != "+":
            old_seen += 1
        if tag != "-":
            new_seen += 1
        if old_seen > old_len or new_seen > new_len:
            raise PatchParseError(f"line {i + 1}: hunk body longer than its @@ header at line {header_line}")
        hunk.lines.append((tag, raw[1:]))
        last_tag = tag
        i += 1
    return hunk, i


def _check_order(fp: FilePatch) -> None:
    end = 0
    for hunk in fp.hunks:
        start = hunk.old_start - (1 if hunk.old_len else 0)
        if start < end:
            raise PatchParseError(f"file {fp.path!r}: hunks overlap or are out of order")
        end = start + hunk.old_len


def reverse(fp: FilePatch) -> FilePatch:
    """The patch that undoes fp (used to revert when no backup exists)."""
    swap = {" ": " ", "-": "+", "+": "-"}
    hunks = [
        Hunk(h.new_start, h.new_len, h.old_start, h.old_len, h.section,
             [(swap[tag], text) for tag, text in h.lines], h.new_eof_newline, h.old_eof_newline)
        for h in fp.hunks
    ]
    return FilePatch(fp.new_path, fp.old_path, hunks)
