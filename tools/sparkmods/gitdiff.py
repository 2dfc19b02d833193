"""Git-format diffs as `git apply --binary` reads them: what launch-cluster.sh's `--apply-vllm-pr`
applies (a pull request's .diff), checked against a vLLM tree without writing.

Beyond the hunks (runtime/udiff.py reads those), a `diff --git` section may carry what a plain
unified diff cannot: a rename or copy (`rename from/to`, `copy from/to`, with or without hunks),
a mode change (`old mode`/`new mode`, with or without hunks), a new or deleted file's mode, a
binary change (`Binary files ... differ`, which git apply refuses without its data, or a
`GIT binary patch` with it) and the `index OLD..NEW` blob ids. A binary change is judged by
those blob ids: the file must be the blob the diff starts from (or already the one it makes).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Callable, List, Optional

from sparkmods.runtime.engine import APPLIED, CONFLICT, EXACT, MISSING_FILE, OK, FileResult, HunkResult, plan_file
from sparkmods.runtime.udiff import (
    FilePatch,
    PatchParseError,
    _strip as strip_name,  # GNU patch's -p N, as the --- / +++ names get it
    parse_patch,
    reverse,
)

__all__ = ["Change", "parse_git_diff", "plan_changes", "reverse_change", "blob_id"]

Reader = Callable[[str], Optional[bytes]]
_GIT = "diff --git "


@dataclass
class Change:
    """One file of a diff: its paths before and after (None: absent), its hunks, and git's extras."""

    old_path: Optional[str]
    new_path: Optional[str]
    patch: Optional[FilePatch] = None
    rename: bool = False
    copy: bool = False
    old_mode: Optional[str] = None
    new_mode: Optional[str] = None
    binary: str = ""  # "", "data" (GIT binary patch) or "no-data" (Binary files ... differ)
    index: Optional["tuple[str, str]"] = None  # (old blob id, new blob id), possibly abbreviated

    @property
    def path(self) -> str:
        return self.new_path if self.new_path is not None else self.old_path  # type: ignore[return-value]  # the parser refuses a patch naming neither side

    @property
    def paths(self) -> List[str]:
        """Every file the change touches (a rename: both)."""
        return sorted({p for p in (self.old_path, self.new_path) if p is not None})


def blob_id(data: bytes) -> str:
    """git's object id of a file's bytes (the ids on an `index` line)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def parse_git_diff(text: str, strip: int = 1) -> List[Change]:
    """Every file of a diff. Sections headed `diff --git` are read with their extended headers;
    a diff without them is read as a plain unified diff. Raises PatchParseError."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith(_GIT)]
    if not starts:
        return [Change(fp.old_path, fp.new_path, fp) for fp in parse_patch(text, strip)]
    changes = []
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        changes.append(_section(lines[start:end], start + 1, strip))
    return changes


def _section(lines: List[str], first: int, strip: int) -> Change:
    a, b = _git_names(lines[0].rstrip("\r\n")[len(_GIT):], first)
    change = Change(_path(a, strip, first), _path(b, strip, first))
    body = 1
    for body, raw in enumerate(lines[1:], start=1):
        line = raw.rstrip("\r\n")
        key, _, value = line.partition(" ")
        if line.startswith(("--- ", "@@ ")) or line.startswith("Binary files ") or line == "GIT binary patch":
            break
        if line.startswith(("rename from ", "copy from ")):
            change.old_path = _path("a/" + line.split(" from ", 1)[1], strip, first + body)
            change.rename, change.copy = key == "rename", key == "copy"
        elif line.startswith(("rename to ", "copy to ")):
            change.new_path = _path("b/" + line.split(" to ", 1)[1], strip, first + body)
        elif line.startswith("old mode "):
            change.old_mode = line[len("old mode "):]
        elif line.startswith("new mode "):
            change.new_mode = line[len("new mode "):]
        elif line.startswith("new file mode "):
            change.old_path, change.new_mode = None, line[len("new file mode "):]
        elif line.startswith("deleted file mode "):
            change.new_path, change.old_mode = None, line[len("deleted file mode "):]
        elif key == "index":
            ids, _, mode = value.partition(" ")
            old, dots, new = ids.partition("..")
            if not dots:
                raise PatchParseError(f"line {first + body}: bad index line {line!r}")
            change.index = (old, new)
            change.old_mode = change.old_mode or mode or None
            change.new_mode = change.new_mode or mode or None
        elif key in ("similarity", "dissimilarity"):
            pass
        else:
            raise PatchParseError(f"line {first + body}: unexpected {line[:40]!r} in the header of a git diff")
    else:
        body = len(lines)
    rest = "".join(lines[body:])
    if rest.startswith("Binary files "):
        change.binary = "no-data"
    elif rest.startswith("GIT binary patch"):
        change.binary = "data"
    elif rest.strip():
        if not rest.startswith("--- "):
            raise PatchParseError(f"line {first + body}: hunks without the ---/+++ lines of a git diff")
        (fp,) = parse_patch(rest, strip)
        change.patch = FilePatch(change.old_path, change.new_path, fp.hunks)  # the section's names rule
    return change


def _git_names(rest: str, lineno: int) -> "tuple[str, str]":
    """`a/X b/Y` of a `diff --git` line (X and Y alike unless renamed; quoted names allowed)."""
    if rest.startswith('"'):
        close = rest.index('"', 1)
        return rest[1:close], rest[close + 1:].strip().strip('"')
    half = len(rest) // 2
    if rest[half:half + 1] == " " and rest[2:half] == rest[half + 3:]:
        return rest[:half], rest[half + 1:]
    a, sep, b = rest.partition(" b/")
    if not sep:
        raise PatchParseError(f"line {lineno}: cannot read the paths of {_GIT}{rest!r}")
    return a, "b/" + b


def _path(raw: str, strip: int, lineno: int) -> Optional[str]:
    return strip_name(raw, strip, lineno)


def reverse_change(change: Change) -> Change:
    """The change undone (`git apply -R`)."""
    index = (change.index[1], change.index[0]) if change.index else None
    return replace(change, old_path=change.new_path, new_path=change.old_path, old_mode=change.new_mode,
                   new_mode=change.old_mode, index=index,
                   patch=reverse(change.patch) if change.patch is not None else None)


def plan_changes(changes: List[Change], read: Reader) -> List[FileResult]:
    """How each change fares on the tree (read: package path -> bytes or None), as the engine
    reports hunks; nothing is written. A mode change alone is left out where its file exists:
    git applies it to any content, and a tree read here has no modes to compare."""
    results = [_plan(change, read) for change in changes]
    return [r for r in results if r is not None]


def _plan(change: Change, read: Reader) -> Optional[FileResult]:
    path = change.path
    moved = change.rename or change.copy
    # The file the diff starts from (a new file's own path: it may be there already) and, for a
    # rename or copy, the one it makes.
    source = read(change.old_path if change.old_path is not None else path)
    target = read(change.new_path) if moved and change.new_path is not None else None
    if change.binary:
        return _binary(change, source if change.old_path is not None else None, read(path))
    if moved and source is None:
        if target is not None and (change.patch is None or plan_file(_as_new(change.new_path, change.patch), target).status == APPLIED):
            return FileResult(path, APPLIED, [HunkResult(1, APPLIED, 0)], reason=f"already {_moved_from(change)}")
        return FileResult(path, MISSING_FILE, reason=f"{change.old_path} ({_verb(change)} from) does not exist")
    if moved and target is not None:
        return FileResult(path, CONFLICT, [HunkResult(1, CONFLICT, 0, reason="target exists")],
                          reason=f"{_verb(change)} target {change.new_path} already exists")
    if change.patch is None:
        if change.old_path is not None and source is None:
            return FileResult(path, MISSING_FILE, reason=f"{change.old_path} does not exist (mode change)")
        if not moved:
            return None
        return FileResult(path, OK, [HunkResult(1, EXACT, 0, 1)], reason=_moved_from(change))
    result = plan_file(change.patch, source)
    if moved:
        result.path, result.reason = path, "; ".join(filter(None, [_moved_from(change), result.reason]))
    return result


def _as_new(path: Optional[str], patch: FilePatch) -> FilePatch:
    return FilePatch(path, path, patch.hunks)


def _verb(change: Change) -> str:
    return "rename" if change.rename else "copy"


def _moved_from(change: Change) -> str:
    return f"{'renamed' if change.rename else 'copied'} from {change.old_path}"


def _binary(change: Change, before: Optional[bytes], now: Optional[bytes]) -> FileResult:
    """A binary change by its blob ids: what the diff starts from, or already what it makes."""
    path = change.path
    if change.binary == "no-data":
        return FileResult(path, CONFLICT, [HunkResult(1, CONFLICT, 0, reason="binary change without data")],
                          reason="a binary change without its data (`Binary files ... differ`): git apply refuses it")
    if change.index is None:
        return FileResult(path, CONFLICT, reason="a binary patch without an index line: its base is unknown")
    old_id, new_id = change.index
    current = now if now is not None else before
    if current is not None and blob_id(current).startswith(new_id) and change.new_path is not None:
        return FileResult(path, APPLIED, [HunkResult(1, APPLIED, 0)], reason="binary: already the new blob")
    if before is None and change.old_path is not None:
        return FileResult(path, MISSING_FILE, reason=f"{change.old_path} does not exist")
    if before is not None and not blob_id(before).startswith(old_id):
        return FileResult(path, CONFLICT, [HunkResult(1, CONFLICT, 0, reason="other base blob")],
                          reason=f"binary: the file is blob {blob_id(before)[:12]}, the diff starts from {old_id}")
    return FileResult(path, OK, [HunkResult(1, EXACT, 0, 1)], reason="binary: the base blob matches")
