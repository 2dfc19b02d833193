"""Where did a patched file go? Similarity between the hunks' surroundings and onto's files.

When the patched path does not exist in onto, every edit looks for the onto file that holds
the lines around it (its hunk's context and removed lines). Candidates are files onto has
and base had not (plus the old file's neighbours), nearest first: same folder, the folder
named after the old module (`inc.py` -> `inc/`), then every new file.

For Python the enclosing class/function of the edit guides the choice: when exactly one
candidate that holds some of the edit's surroundings defines that qualified name
(`INCConfig.get_quant_method`), that file is it. Otherwise one candidate must clearly win on
the surrounding lines. Anything else is reported with the candidates. Choosing a file only
says where to try: the three-way merge into it still has to place every edit safely.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Set

from .edits import Edit, split_lines
from .pyscope import PyFile, is_trivia, parse_py

__all__ = ["Candidate", "MoveSearch", "find_moves"]

MIN_SCORE = 0.5  # share of an edit's surrounding lines the target must hold
MARGIN = 0.25  # and by how much it must beat the runner-up
AROUND = 4  # lines on each side of an edit that identify it


@dataclass(frozen=True)
class Candidate:
    path: str
    score: float


@dataclass
class MoveSearch:
    targets: Dict[int, str] = field(default_factory=dict)  # edit index -> onto path
    candidates: Dict[int, List[Candidate]] = field(default_factory=dict)  # per edit, best first

    def unresolved(self, count: int) -> List[int]:
        return [i for i in range(count) if i not in self.targets]

    def best(self, limit: int = 5) -> List[Candidate]:
        """The best score of each candidate file over all edits, best first."""
        top: Dict[str, float] = {}
        for cands in self.candidates.values():
            for c in cands:
                top[c.path] = max(top.get(c.path, 0.0), c.score)
        return sorted((Candidate(p, s) for p, s in top.items()), key=lambda c: (-c.score, c.path))[:limit]


def _probe(base: Sequence[str], e: Edit) -> Set[str]:
    lo, hi = max(0, e.base_start - AROUND), min(len(base), e.base_end + AROUND)
    return {line.strip() for line in base[lo:hi] if not is_trivia(line) and len(line.strip()) >= 6}


def _scope(pf: Optional[PyFile], e: Edit) -> str:
    """The innermost def/class holding the edit and both its neighbouring lines ("" for none)."""
    if pf is None:
        return ""
    lo = pf.scope_at(max(e.base_start - 1, 0)).split(".")
    hi = pf.scope_at(min(e.base_end, len(pf.lines) - 1)).split(".")
    common = []
    for a, b in zip(lo, hi):
        if a != b:
            break
        common.append(a)
    return ".".join(common)


def _tiers(path: str, base_files: Set[str], onto_files: Sequence[str]) -> List[List[str]]:
    ext = posixpath.splitext(path)[1]
    folder = posixpath.dirname(path)
    stem_dir = posixpath.splitext(path)[0] + "/"
    name = posixpath.basename(path)
    same = [f for f in onto_files if f.endswith(ext)]
    new = [f for f in same if f not in base_files]
    near = [f for f in same if posixpath.dirname(f) == folder or f.startswith(stem_dir)
            or (f in new and posixpath.basename(f) == name)]
    rest = [f for f in new if f not in near]
    return [near, rest]


class _Texts:
    """Candidate files' stripped lines, and their parse (only when a scope asks for it)."""

    def __init__(self, read: Callable[[str], Optional[bytes]], paths: Sequence[str]) -> None:
        self.lines: Dict[str, List[str]] = {}
        for f in paths:
            data = read(f)
            if data is not None:
                self.lines[f] = split_lines(data)
        self.stripped = {f: {line.strip() for line in lines} for f, lines in self.lines.items()}
        self._parsed: Dict[str, Optional[PyFile]] = {}

    def defines(self, path: str, qualname: str) -> bool:
        if path not in self._parsed:
            self._parsed[path] = parse_py(self.lines[path]) if path.endswith(".py") else None
        pf = self._parsed[path]
        return pf is not None and len(pf.defs.get(qualname, [])) == 1


def find_moves(path: str, base: Sequence[str], edits: Sequence[Edit], base_files: Set[str],
               onto_files: Sequence[str], read: Callable[[str], Optional[bytes]],
               prefetch: Callable[[Sequence[str]], None]) -> MoveSearch:
    """Pick an onto file for each edit of the vanished `path`, tier by tier."""
    probes = [_probe(base, e) for e in edits]
    pf = parse_py(base) if path.endswith(".py") else None
    scopes = [_scope(pf, e) for e in edits]
    found = MoveSearch()
    for tier in _tiers(path, base_files, onto_files):
        todo = found.unresolved(len(edits))
        if not todo or not tier:
            continue
        prefetch(tier)
        texts = _Texts(read, tier)
        for i in todo:
            if not probes[i]:
                continue
            scored = sorted((Candidate(f, len(probes[i] & lines) / len(probes[i]))
                             for f, lines in texts.stripped.items()), key=lambda c: (-c.score, c.path))
            scored = [c for c in scored if c.score > 0]
            found.candidates[i] = sorted(found.candidates.get(i, []) + scored[:5], key=lambda c: (-c.score, c.path))[:5]
            holders = [c for c in scored if scopes[i] and texts.defines(c.path, scopes[i])]
            best = found.candidates[i]
            if len(holders) == 1:
                found.targets[i] = holders[0].path
            elif not holders and best and best[0].score >= MIN_SCORE and (
                    len(best) == 1 or best[0].score - best[1].score >= MARGIN):
                found.targets[i] = best[0].path
    return found
