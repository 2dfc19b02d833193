"""The runtime's diff parser (sparkmods.runtime.udiff, stdlib only) read side by side with unidiff,
the diff parser on PyPI, as pep440.py is compared with packaging: a patch must give the same files,
hunks, line numbers, and removed, added and context lines to both."""

from __future__ import annotations

from typing import List, Optional, Tuple

from unidiff import PatchSet
from unidiff.constants import LINE_TYPE_NO_NEWLINE

from sparkmods.runtime.udiff import DEV_NULL, parse_patch

# (tag, old line number, new line number, text): a line of a hunk, numbered as each parser reads it
Line = Tuple[str, Optional[int], Optional[int], str]
# (old start, old length, new start, new length, section, lines, old side ends in a newline, new side does)
Hunk = Tuple[int, int, int, int, str, List[Line], bool, bool]
# (old name, new name, hunks); a name is None for /dev/null
File = Tuple[Optional[str], Optional[str], List[Hunk]]


def _text(value: str) -> str:
    """A line's text without its line end (the runtime keeps no line ends)."""
    value = value[:-1] if value.endswith("\n") else value
    return value[:-1] if value.endswith("\r") else value


def by_unidiff(text: str) -> List[File]:
    files = []
    for pf in PatchSet(text):
        hunks = []
        for h in pf:
            body = list(h)
            lines = [(ln.line_type, ln.source_line_no, ln.target_line_no, _text(ln.value))
                     for ln in body if ln.line_type != LINE_TYPE_NO_NEWLINE]
            no_eol = [body[i - 1].line_type for i, ln in enumerate(body) if ln.line_type == LINE_TYPE_NO_NEWLINE]
            hunks.append((h.source_start, h.source_length, h.target_start, h.target_length, h.section_header.strip(),
                          lines, not any(t in " -" for t in no_eol), not any(t in " +" for t in no_eol)))
        files.append((None if pf.source_file == DEV_NULL else pf.source_file,
                      None if pf.target_file == DEV_NULL else pf.target_file, hunks))
    return files


def by_runtime(text: str) -> List[File]:
    files = []
    for fp in parse_patch(text, strip=0):  # names as written: stripping is not the parser's question
        hunks = []
        for h in fp.hunks:
            old, new, lines = h.old_start, h.new_start, []
            for tag, line in h.lines:
                lines.append((tag, old if tag != "+" else None, new if tag != "-" else None, line))
                old, new = old + (tag != "+"), new + (tag != "-")
            hunks.append((h.old_start, h.old_len, h.new_start, h.new_len, h.section, lines, h.old_eof_newline,
                          h.new_eof_newline))
        files.append((fp.old_path, fp.new_path, hunks))
    return files


def assert_parsed_alike(text: str, what: str) -> None:
    """Both parsers read `text` (the patch `what`) the same way; the first difference otherwise."""
    ours, theirs = by_runtime(text), by_unidiff(text)
    assert [f[:2] for f in ours] == [f[:2] for f in theirs], f"{what}: files differ"
    for (name, _, our_hunks), (_, _, their_hunks) in zip(ours, theirs):
        assert len(our_hunks) == len(their_hunks), f"{what}: {name}: {len(our_hunks)} hunks, unidiff {len(their_hunks)}"
        for n, (mine, ref) in enumerate(zip(our_hunks, their_hunks), 1):
            assert mine[:5] == ref[:5], f"{what}: {name} hunk {n}: header {mine[:5]}, unidiff {ref[:5]}"
            for got, want in zip(mine[5], ref[5]):
                assert got == want, f"{what}: {name} hunk {n}: {got}, unidiff {want}"
            assert mine[5:] == ref[5:], f"{what}: {name} hunk {n}: line count or final newlines differ"
