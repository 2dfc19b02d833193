"""The patch engine: locate every hunk exactly, never with fuzz, and write atomically.

Per hunk the outcome is one of:
  exact     context and removed lines match at the line the hunk states;
  offset    they match elsewhere; the match nearest to where the previous hunk's drift
            predicts wins, and two equally near matches are a conflict, never a guess;
  applied   the hunk's result is already there (the reverse of the hunk matches);
  conflict  no exact match anywhere: the closest near-match and its differing lines are
            reported so a human (or `sparkmods rebase-patch`) can act.

Hunks are located against the ORIGINAL text, in order and without overlapping, then
spliced in one pass. Writing is separate (journal.transact) and all-or-nothing across files.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from .fsops import TMP_SUFFIX, StrPath
from .udiff import FilePatch, Hunk

Line = Tuple[str, str]  # (content without end-of-line, end-of-line: "\n", "\r\n" or "")

__all__ = [
    "EXACT", "OFFSET", "APPLIED", "CONFLICT",
    "OK", "OK_OFFSET", "MISSING_FILE",
    "PACKAGE", "TMP_SUFFIX", "UnsafePath", "HunkResult", "FileResult", "check_relpath", "confine", "plan_file", "plan",
    "safe_target", "plain_path",
]

# Hunk outcomes.
EXACT, OFFSET, APPLIED, CONFLICT = "exact", "offset", "applied", "conflict"
# File statuses (a subset of the check vocabulary).
OK, OK_OFFSET, MISSING_FILE = "ok", "ok-offset", "missing-file"
PACKAGE = "vllm"  # the only top-level folder of site-packages a mod may change


class UnsafePath(ValueError):
    """A patch path that would escape the target tree."""


@dataclass
class NearMatch:
    """Where a conflicting hunk came closest, and the lines that differ there."""

    line: int  # 1-based line of the window's first line in the target file
    matching: int
    total: int
    differing: List[Tuple[int, str, str]] = field(default_factory=list)  # (line, expected, found)

    def to_dict(self) -> dict:
        return {
            "line": self.line,
            "matching": self.matching,
            "total": self.total,
            "differing": [{"line": n, "expected": e, "found": f} for n, e, f in self.differing],
        }


@dataclass
class HunkResult:
    """How one hunk fares on one file."""

    index: int  # 1-based hunk number within the file patch
    outcome: str
    stated_line: int  # the hunk's own old_start
    line: Optional[int] = None  # 1-based line where it was located (old side, or new side if applied)
    offset: int = 0
    reason: str = ""
    near: Optional[NearMatch] = None

    def to_dict(self) -> dict:
        out = {"hunk": self.index, "outcome": self.outcome, "stated_line": self.stated_line,
               "line": self.line, "offset": self.offset}
        if self.reason:
            out["reason"] = self.reason
        if self.near:
            out["near"] = self.near.to_dict()
        return out


@dataclass
class FileResult:
    """What a mod's patches (or site install) do to one file."""

    path: str
    status: str  # ok, ok-offset, applied, conflict, missing-file
    hunks: List[HunkResult] = field(default_factory=list)
    reason: str = ""
    before: Optional[bytes] = None  # the target's content (None: absent)
    after: Optional[bytes] = None  # content to write (None: delete, or nothing to do)

    @property
    def changes(self) -> bool:
        return self.status in (OK, OK_OFFSET)

    def to_dict(self) -> dict:
        out = {"path": self.path, "status": self.status, "hunks": [h.to_dict() for h in self.hunks]}
        if self.reason:
            out["reason"] = self.reason
        return out


_CONTROL = frozenset(map(chr, (*range(32), 0x7f)))


def check_relpath(path: str) -> str:
    """Refuse absolute paths, `..` segments, empty names and control characters in a path."""
    if not _CONTROL.isdisjoint(path):
        raise UnsafePath(f"refusing path with a control character (NUL?) {path!r}")
    if not path or path.startswith(("/", "\\")) or (len(path) > 1 and path[1] == ":"):
        raise UnsafePath(f"refusing absolute path {path!r}")
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]  # as PurePosixPath reads it
    if ".." in parts:
        raise UnsafePath(f"refusing path with '..' {path!r}")
    return "/".join(parts)


def confine(path: str) -> str:
    """A path a mod may write: inside the vLLM package, never a .pth file or one of our temps.

    A .pth file in site-packages runs code at every interpreter start, and anything outside
    vllm/ (another package, the .sparkmods state of other mods) is not the mod's to change.
    """
    rel = check_relpath(path)
    parts = rel.split("/")
    if parts[0] != PACKAGE or len(parts) < 2:
        raise UnsafePath(f"refusing {rel!r}: a mod may change only files inside the {PACKAGE}/ package")
    if rel.endswith(".pth") or parts[-1].endswith(TMP_SUFFIX):
        raise UnsafePath(f"refusing {rel!r}: .pth files (run at interpreter start) and "
                         f"*{TMP_SUFFIX} names (sparkmods' temp files) cannot be mod targets")
    return rel


def _split(data: bytes) -> List[Line]:
    text = data.decode("utf-8", "surrogateescape")
    out: List[Line] = []
    for raw in text.splitlines(keepends=True):
        if raw.endswith("\r\n"):
            out.append((raw[:-2], "\r\n"))
        elif raw.endswith("\n"):
            out.append((raw[:-1], "\n"))
        else:
            out.append((raw, ""))
    return out


def _join(lines: Sequence[Line]) -> bytes:
    return "".join(c + e for c, e in lines).encode("utf-8", "surrogateescape")


def _dominant_eol(lines: Sequence[Line]) -> str:
    crlf = sum(1 for _, e in lines if e == "\r\n")
    return "\r\n" if crlf * 2 > len(lines) else "\n"


def _matches_at(contents: Sequence[str], pos: int, want: Sequence[str]) -> bool:
    return pos + len(want) <= len(contents) and list(contents[pos:pos + len(want)]) == list(want)


def _candidates(contents: Sequence[str], want: Sequence[str], lo: int) -> List[int]:
    if not want:
        return []
    first = want[0]
    return [p for p in range(lo, len(contents) - len(want) + 1)
            if contents[p] == first and _matches_at(contents, p, want)]


def _nearest(cands: List[int], target: int) -> Tuple[Optional[int], List[int]]:
    """The candidate nearest to target, or (None, tied) when two are equally near."""
    if not cands:
        return None, []
    best = min(abs(p - target) for p in cands)
    tied = [p for p in cands if abs(p - target) == best]
    return (tied[0], tied) if len(tied) == 1 else (None, tied)


def _near_match(contents: Sequence[str], want: Sequence[str], target: int) -> Optional[NearMatch]:
    if not want or not contents:
        return None
    n = len(want)
    best: Optional[Tuple[int, int]] = None  # (score, -distance) maximised
    best_pos = 0
    for p in range(0, max(1, len(contents) - n + 1)):
        score = sum(1 for i in range(n) if p + i < len(contents) and contents[p + i] == want[i])
        key = (score, -abs(p - target))
        if best is None or key > best:
            best, best_pos = key, p
    assert best is not None
    differing = []
    for i in range(n):
        found = contents[best_pos + i] if best_pos + i < len(contents) else "<end of file>"
        if found != want[i]:
            differing.append((best_pos + i + 1, want[i], found))
    return NearMatch(best_pos + 1, best[0], n, differing)


def _stated_index(hunk: Hunk) -> int:
    """0-based index of the hunk's first old line (insertion point for empty old sides)."""
    return hunk.old_start - 1 if hunk.old_len else hunk.old_start


def _eof_filter(cands: List[int], size: int, n: int, at_eof: bool) -> List[int]:
    """A side marked `\\ No newline at end of file` can only match at the end of the file."""
    return [p for p in cands if p + n == size] if at_eof else cands


def _locate(hunk: Hunk, contents: Sequence[str], lo: int, drift: int, number: int) -> HunkResult:
    old, new = hunk.old_lines, hunk.new_lines
    size = len(contents)

    def fits_old(pos: int) -> bool:
        return _matches_at(contents, pos, old) and (hunk.old_eof_newline or pos + len(old) == size)

    def fits_new(pos: int) -> bool:
        return _matches_at(contents, pos, new) and (hunk.new_eof_newline or pos + len(new) == size)

    stated = _stated_index(hunk)
    result = HunkResult(number, CONFLICT, hunk.old_start)
    if not old:
        # Zero-context insertion (diff -U0): only the stated position means anything.
        if stated <= len(contents) and stated >= lo:
            if new and fits_new(stated):
                result.outcome, result.line = APPLIED, stated + 1
            else:
                result.outcome, result.line = EXACT, stated + 1
        else:
            result.reason = f"insertion point line {stated + 1} is outside the file"
        return result
    if stated >= lo and fits_old(stated):
        result.outcome, result.line = EXACT, stated + 1
        return result
    new_stated = hunk.new_start - 1 + drift
    if new and new_stated >= 0 and fits_new(new_stated):
        result.outcome, result.line = APPLIED, new_stated + 1
        return result
    pos, tied = _nearest(_eof_filter(_candidates(contents, old, lo), size, len(old), not hunk.old_eof_newline),
                         stated + drift)
    if pos is not None:
        result.outcome, result.line, result.offset = OFFSET, pos + 1, pos - stated
        return result
    if tied:
        result.reason = "ambiguous: identical context at lines " + ", ".join(str(p + 1) for p in tied)
        return result
    pos, tied = _nearest(_eof_filter(_candidates(contents, new, 0), size, len(new), not hunk.new_eof_newline),
                         new_stated)
    if pos is not None:
        result.outcome, result.line = APPLIED, pos + 1
        return result
    result.reason = "context or removed lines not found"
    result.near = _near_match(contents, old, stated + drift)
    return result


def _splice(lines: List[Line], hunk: Hunk, pos: int, eol: str) -> List[Line]:
    """The replacement lines for the hunk located at pos (context keeps the file's eol)."""
    seg: List[Line] = []
    k = pos
    for tag, text in hunk.lines:
        if tag == " ":
            seg.append(lines[k])
            k += 1
        elif tag == "-":
            k += 1
        else:
            seg.append((text, eol))
    seg = [(c, e or eol) for c, e in seg[:-1]] + seg[-1:]
    if seg and k == len(lines):  # the hunk reaches the end of the file
        last_c, last_e = seg[-1]
        seg[-1] = (last_c, "" if not hunk.new_eof_newline else (last_e or eol))
    elif seg and not seg[-1][1]:
        seg[-1] = (seg[-1][0], eol)
    return seg


def plan_file(fp: FilePatch, data: Optional[bytes]) -> FileResult:
    """Decide, without writing, what the patch does to one file whose content is `data`."""
    path = check_relpath(fp.path)
    if fp.is_new:
        new = [t for h in fp.hunks for t in h.new_lines]
        eol_ok = fp.hunks[-1].new_eof_newline
        body = "\n".join(new) + ("\n" if new and eol_ok else "")
        wanted = body.encode("utf-8", "surrogateescape")
        if data is None:
            return FileResult(path, OK, [HunkResult(1, EXACT, 0, 1)], before=None, after=wanted)
        if _split(data) and [c for c, _ in _split(data)] == new:
            return FileResult(path, APPLIED, [HunkResult(1, APPLIED, 0, 1)], before=data)
        return FileResult(path, CONFLICT, [HunkResult(1, CONFLICT, 0, reason="file already exists with other content")],
                          reason="new file already exists with other content", before=data)
    if data is None:
        if fp.is_delete:
            return FileResult(path, APPLIED, [HunkResult(1, APPLIED, 1)], reason="already deleted")
        return FileResult(path, MISSING_FILE, reason="file does not exist in this vLLM")
    lines = _split(data)
    contents = [c for c, _ in lines]
    if fp.is_delete:
        old = [t for h in fp.hunks for t in h.old_lines]
        if contents == old:
            return FileResult(path, OK, [HunkResult(1, EXACT, 1, 1)], before=data, after=None)
        return FileResult(path, CONFLICT, [HunkResult(1, CONFLICT, 1, reason="content differs")],
                          reason="file to delete has other content", before=data)

    results: List[HunkResult] = []
    lo, drift = 0, 0
    for number, hunk in enumerate(fp.hunks, 1):
        res = _locate(hunk, contents, lo, drift, number)
        results.append(res)
        if res.outcome in (EXACT, OFFSET):
            start = res.line - 1  # type: ignore[operator]  # a located hunk has its line
            drift = start - _stated_index(hunk)
            lo = start + len(hunk.old_lines)
        elif res.outcome == APPLIED and res.line is not None:
            lo = max(lo, res.line - 1 + len(hunk.new_lines))
    outcomes = {r.outcome for r in results}
    if CONFLICT in outcomes:
        bad = [str(r.index) for r in results if r.outcome == CONFLICT]
        return FileResult(path, CONFLICT, results, reason="hunk(s) " + ", ".join(bad) + " conflict", before=data)
    if outcomes == {APPLIED}:
        return FileResult(path, APPLIED, results, before=data)
    if APPLIED in outcomes:
        done = [str(r.index) for r in results if r.outcome == APPLIED]
        return FileResult(path, CONFLICT, results,
                          reason="partly applied: hunk(s) " + ", ".join(done) + " already present, the rest not",
                          before=data)
    eol = _dominant_eol(lines)
    out: List[Line] = []
    cursor = 0
    for hunk, res in zip(fp.hunks, results):
        start = res.line - 1  # type: ignore[operator]  # every hunk is located here (a failure returned above)
        out.extend(lines[cursor:start])
        out.extend(_splice(lines, hunk, start, eol))
        cursor = start + len(hunk.old_lines)
    out.extend(lines[cursor:])
    status = OK_OFFSET if OFFSET in outcomes else OK
    return FileResult(path, status, results, before=data, after=_join(out))


def plan(patches: Iterable[FilePatch], read: Callable[[str], Optional[bytes]]) -> List[FileResult]:
    """Plan every file patch against the tree that `read` serves (path -> bytes or None).

    A path patched twice (two diffs of one file stacked in a patch, or patch files applied
    one after the other) is planned as `git apply` does it: each diff against the text the
    ones before it leave, one result per path.
    """
    out: Dict[str, FileResult] = {}
    for fp in patches:
        path = check_relpath(fp.path)
        first = out.get(path)
        if first is None:
            out[path] = plan_file(fp, read(path))
        else:
            out[path] = _stacked(first, plan_file(fp, first.after if first.changes else first.before))
    return list(out.values())


def _stacked(first: FileResult, then: FileResult) -> FileResult:
    """One result for a file two diffs change in turn: hunks numbered on, the worst status
    (a diff already present above one still to apply is a partly applied file, as in aggregate)."""
    hunks = first.hunks + [
        HunkResult(len(first.hunks) + h.index, h.outcome, h.stated_line, h.line, h.offset, h.reason, h.near)
        for h in then.hunks]
    statuses = {first.status, then.status}
    after = then.after if then.changes else first.after
    for bad in (CONFLICT, MISSING_FILE):
        if bad in statuses:
            worst = first if first.status == bad else then  # a diff after a failed one fails too
            return FileResult(first.path, bad, hunks, worst.reason, first.before)
    if statuses == {APPLIED}:
        return FileResult(first.path, APPLIED, hunks, before=first.before)
    if APPLIED in statuses:
        return FileResult(first.path, CONFLICT, hunks, "partly applied: a stacked diff is already present, "
                          "another is not", first.before)
    status = OK_OFFSET if OK_OFFSET in statuses else OK
    return FileResult(first.path, status, hunks, before=first.before, after=after)


def safe_target(root: StrPath, rel: str) -> str:
    """The absolute path of rel under root; refuses anything that resolves outside root."""
    rel = check_relpath(rel)
    base = os.path.realpath(root)
    target = os.path.realpath(os.path.join(base, rel))
    if target != base and not target.startswith(base.rstrip("/") + "/"):
        raise UnsafePath(f"refusing {rel!r}: it resolves outside {base} (symlink?)")
    return target


_KINDS = {stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a device",
          stat.S_IFBLK: "a device"}


def plain_path(root: StrPath, rel: str, leaf: bool = False) -> str:
    """root/rel, refused (UnsafePath, one line) unless it is reached through real folders only.

    The runtime's policy for links inside the tree: none is followed. A link (to another file
    in vllm/, dangling, or where a mod creates a file) would make the file read, the file
    written, its temp name and its saved copy different places; vLLM's wheels contain none.
    With `leaf`, what is at rel must also be a regular file or nothing (a folder or a FIFO
    where a mod writes a file is refused, never replaced).
    """
    rel = check_relpath(rel)
    base = os.path.realpath(root)
    path = base
    parts = rel.split("/") if rel else []
    for i, part in enumerate(parts):
        path = os.path.join(path, part)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            break  # nothing below it exists either
        where = "/".join(parts[:i + 1])
        if stat.S_ISLNK(mode):
            raise UnsafePath(f"{path}: {where} is a symbolic link (to {os.readlink(path)}); a mod changes only "
                             f"real files inside {PACKAGE}/, never through a link: replace the link with the file or "
                             "folder it points to (or reinstall vLLM); nothing was changed")
        last = i == len(parts) - 1
        if not last and not stat.S_ISDIR(mode):
            raise UnsafePath(f"{path}: {where} is not a folder, but {rel} is meant to be inside it; "
                             "move it away and run again; nothing was changed")
        if last and leaf and not stat.S_ISREG(mode):
            kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
            raise UnsafePath(f"{path}: {where} is {kind}, not a regular file, where the mod reads or writes a "
                             "file; move it away and run again; nothing was changed")
    return os.path.join(base, *parts) if parts else base
