"""Carry a patch from the vLLM it was written against (base) to another one (onto).

Per file: created files are carried as they are, deleted files are deleted when onto still
has the base content, changed files are merged three ways (`merge`) - in the file onto
moved them to when the path is gone (`moves`). The result is a regenerated patch that the
engine applies `exact` to onto (`regen.verify`), or a report of what could not be carried.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Protocol, Sequence, Set, Tuple

from sparkmods.runtime.udiff import FilePatch

from .conflicts import conflict_lines
from .edits import BaseMismatch, Edit, extract_edits, join_lines, split_lines
from .merge import ALREADY, CONFLICT, EditOutcome, merge_file
from .moves import Candidate, find_moves
from .regen import file_diff, verify

__all__ = ["Tree", "FileOutcome", "RebaseResult", "rebase_patches", "BaseMismatch",
           "REBASED", "UNCHANGED", "FILE_CONFLICT", "MISSING"]

REBASED, UNCHANGED, FILE_CONFLICT, MISSING = "rebased", "already-in-onto", "conflict", "missing-file"


class Tree(Protocol):
    label: str
    version: str

    def read(self, path: str) -> Optional[bytes]: ...
    def list_files(self) -> List[str]: ...
    def prefetch(self, paths: Sequence[str]) -> None: ...


@dataclass
class Part:
    """The edits of one patched file that land in one onto file."""

    target: str
    outcomes: List[EditOutcome]
    onto: Optional[List[str]]
    merged: Optional[List[str]]  # None: conflict; for a deletion: the empty list is not used
    delete: bool = False
    conflict: Optional[List[str]] = None


@dataclass
class FileOutcome:
    path: str
    status: str
    parts: List[Part] = field(default_factory=list)
    reason: str = ""
    candidates: List[Candidate] = field(default_factory=list)
    base: Optional[List[str]] = None

    @property
    def clean(self) -> bool:
        return self.status in (REBASED, UNCHANGED)

    def to_dict(self) -> dict:
        out: dict = {"path": self.path, "status": self.status}
        targets = sorted({p.target for p in self.parts if p.target != self.path})
        if targets:
            out["moved_to"] = targets
        if self.reason:
            out["reason"] = self.reason
        if self.candidates:
            out["candidates"] = [{"path": c.path, "score": round(c.score, 2)} for c in self.candidates]
        out["edits"] = [dict(o.to_dict(), onto_path=p.target) for p in self.parts for o in p.outcomes]
        return out


@dataclass
class RebaseResult:
    base: str
    onto: str
    files: List[FileOutcome]
    patch: Optional[str] = None  # the rebased patch, verified; None when not clean
    problem: str = ""  # why no patch was produced although every file merged

    @property
    def clean(self) -> bool:
        return self.problem == "" and all(f.clean for f in self.files)

    def changes(self) -> Dict[str, Tuple[Optional[bytes], Optional[bytes]]]:
        """onto path -> (onto bytes, patched bytes) for every file the rebased patch changes."""
        out: Dict[str, Tuple[Optional[bytes], Optional[bytes]]] = {}
        for f in self.files:
            for p in f.parts:
                if p.merged is not None or p.delete:
                    before = None if p.onto is None else join_lines(p.onto)
                    after = None if p.delete or p.merged is None else join_lines(p.merged)
                    if before != after:
                        out[p.target] = (before, after)
        return out

    def conflict_files(self) -> Dict[str, bytes]:
        return {p.target: join_lines(p.conflict) for f in self.files for p in f.parts if p.conflict is not None}

    def to_dict(self) -> dict:
        out = {"base": self.base, "onto": self.onto, "clean": self.clean,
               "files": [f.to_dict() for f in self.files]}
        if self.problem:
            out["problem"] = self.problem
        return out


def _is_python(path: str) -> bool:
    return path.endswith((".py", ".pyi"))


def _new_file(fp: FilePatch, onto: Tree) -> FileOutcome:
    lines = [text + "\n" for h in fp.hunks for text in h.new_lines]
    if lines and not fp.hunks[-1].new_eof_newline:
        lines[-1] = lines[-1][:-1]
    have = onto.read(fp.path)
    if have is None:
        return FileOutcome(fp.path, REBASED, [Part(fp.path, [], None, lines)])
    if split_lines(have) == lines:
        return FileOutcome(fp.path, UNCHANGED, [Part(fp.path, [], split_lines(have), split_lines(have))],
                           reason="onto already has this new file")
    return FileOutcome(fp.path, FILE_CONFLICT, reason="the patch creates this file but onto already has one")


def _deleted_file(fp: FilePatch, base: Tree, onto: Tree) -> FileOutcome:
    have_base, have = base.read(fp.path), onto.read(fp.path)
    if have_base is None:
        raise BaseMismatch(f"{fp.path}: the patch deletes it but {base.label} has no such file")
    if have is None:
        return FileOutcome(fp.path, UNCHANGED, reason="onto no longer has this file")
    if have == have_base:
        return FileOutcome(fp.path, REBASED, [Part(fp.path, [], split_lines(have), None, delete=True)])
    return FileOutcome(fp.path, FILE_CONFLICT, reason="the patch deletes this file but onto changed it")


def _merge_part(fp: FilePatch, target: str, base_lines: List[str], edits: List[Edit], onto_bytes: bytes,
                labels: Tuple[str, str]) -> Part:
    onto_lines = split_lines(onto_bytes)
    fm = merge_file(fp, base_lines, onto_lines, edits, _is_python(target), onto_bytes)
    conflict = None
    if not fm.clean and fm.alignment is not None:
        conflict = conflict_lines(fm.alignment, fm.outcomes, labels[1], labels[0])
    part = Part(target, fm.outcomes, onto_lines, fm.merged, conflict=conflict)
    if fm.reason:
        for o in fm.outcomes:
            o.reason = o.reason or fm.reason
    return part


def _changed_file(fp: FilePatch, base: Tree, onto: Tree, files: "_Listing") -> FileOutcome:
    data = base.read(fp.path)
    if data is None:
        raise BaseMismatch(f"{fp.path}: {base.label} has no such file; is --base the vLLM the patch was written for?")
    base_lines, _, edits = extract_edits(fp, data, base.label)
    labels = (base.label, onto.label)
    have = onto.read(fp.path)
    if have is not None:
        part = _merge_part(fp, fp.path, base_lines, edits, have, labels)
        return _finish(fp.path, [part], base_lines)
    search = find_moves(fp.path, base_lines, edits, files.base(), files.onto(), onto.read, onto.prefetch)
    lost = search.unresolved(len(edits))
    best = search.best()
    if lost:
        where = "; candidates: " + ", ".join(f"{c.path} ({c.score:.0%})" for c in best) if best else ""
        return FileOutcome(fp.path, MISSING, reason=f"onto has no {fp.path} and no single file clearly holds the "
                                                    f"code around hunk(s) {_hunks(edits, lost)}{where}",
                           candidates=best, base=base_lines)
    parts = []
    for target in sorted(set(search.targets.values())):
        mine = [e for i, e in enumerate(edits) if search.targets[i] == target]
        parts.append(_merge_part(fp, target, base_lines, mine, onto.read(target) or b"", labels))
    out = _finish(fp.path, parts, base_lines)
    out.candidates = best
    return out


def _hunks(edits: Sequence[Edit], idx: Sequence[int]) -> str:
    return ", ".join(str(n) for n in sorted({edits[i].hunk for i in idx}))


def _finish(path: str, parts: List[Part], base_lines: List[str]) -> FileOutcome:
    outcomes = [o for p in parts for o in p.outcomes]
    if any(p.merged is None for p in parts):
        bad = [o for o in outcomes if o.outcome == CONFLICT]
        reason = "; ".join(f"hunk {o.edit.hunk} (base line {o.edit.base_start + 1}): {o.reason}" for o in bad[:3])
        return FileOutcome(path, FILE_CONFLICT, parts, reason or "conflict", base=base_lines)
    if all(o.outcome == ALREADY for o in outcomes):
        return FileOutcome(path, UNCHANGED, parts, "onto already has every change of this file", base=base_lines)
    return FileOutcome(path, REBASED, parts, base=base_lines)


class _Listing:
    """File lists of both trees, fetched only when a move has to be looked for."""

    def __init__(self, base: Tree, onto: Tree) -> None:
        self._trees = (base, onto)
        self._lists: Dict[int, List[str]] = {}

    def _get(self, i: int) -> List[str]:
        if i not in self._lists:
            self._lists[i] = [p for p in self._trees[i].list_files() if p.startswith("vllm/")]
        return self._lists[i]

    def base(self) -> Set[str]:
        return set(self._get(0))

    def onto(self) -> List[str]:
        return self._get(1)


def rebase_patches(patches: Sequence[FilePatch], base: Tree, onto: Tree) -> RebaseResult:
    """Rebase every file patch; raises BaseMismatch when the patch does not fit base."""
    paths = sorted({fp.path for fp in patches})
    base.prefetch(paths)
    onto.prefetch(paths)
    listing = _Listing(base, onto)
    files: List[FileOutcome] = []
    for fp in patches:
        if fp.is_new:
            files.append(_new_file(fp, onto))
        elif fp.is_delete:
            files.append(_deleted_file(fp, base, onto))
        else:
            files.append(_changed_file(fp, base, onto, listing))
    result = RebaseResult(base.label, onto.label, files)
    if result.clean:
        _regenerate(result, onto)
    return result


def _regenerate(result: RebaseResult, onto: Tree) -> None:
    changes = result.changes()
    seen: Set[str] = set()
    for f in result.files:
        for p in f.parts:
            if p.target in seen and p.target in changes:
                result.problem = f"{p.target}: two patched files both land here; merge them by hand"
                return
            seen.add(p.target)
    chunks = []
    for target in sorted(changes):
        before, after = changes[target]
        chunks.append(file_diff(target, None if before is None else split_lines(before),
                                None if after is None else split_lines(after)))
    text = "".join(chunks)
    if not text:
        result.patch = ""
        return
    problem = verify(text, onto.read, {t: a for t, (_, a) in changes.items()})
    if problem:
        result.problem = "internal: " + problem
        return
    result.patch = text

