"""A check's result as the host passes it on: CheckRow (one mod on one target), what a set of
rows or matrix cells adds up to, where a result breaks, and a result read back from its
to_dict() form (the result cache's entries, the matrix's cells)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from sparkmods.runtime.engine import CONFLICT, MISSING_FILE, FileResult, HunkResult, NearMatch
from sparkmods.runtime.modcheck import GREEN, ModResult

__all__ = ["CheckRow", "Tally", "breaks", "result_from_dict", "files_from_dicts"]


@dataclass
class CheckRow:
    """One mod on one target."""

    target: str  # the spec it came from, e.g. pypi:0.19.1
    commit: "str | None"
    sha256: "str | None"
    result: ModResult
    served: "dict | None" = None  # the GPU run that served this variant here (matrix/served.py)

    def to_dict(self) -> dict:
        out: Dict[str, Any] = {"target": self.target, "commit": self.commit, "wheel_sha256": self.sha256}
        out.update(self.result.to_dict())
        if self.served is not None:
            out["served"] = self.served
        return out


@dataclass(frozen=True)
class Tally:
    """How many statuses (rows of a check, cells of a matrix) there are, and how many green."""

    total: int
    green: int

    @classmethod
    def of(cls, statuses: Iterable[str]) -> "Tally":
        listed = list(statuses)
        return cls(len(listed), sum(1 for s in listed if s in GREEN))

    @property
    def not_green(self) -> int:
        return self.total - self.green


def breaks(files: Iterable[FileResult]) -> Iterator[Tuple[FileResult, Optional[HunkResult]]]:
    """Where a result breaks, file by file: each hunk that conflicts (file, hunk), then the file
    itself when it is missing (file, None)."""
    for f in files:
        for h in f.hunks:
            if h.outcome == CONFLICT:
                yield f, h
        if f.status == MISSING_FILE:
            yield f, None


def _typed(value: Any, kind: Any) -> Any:
    """value when it is of kind (bool is never an int here), else TypeError."""
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise TypeError(f"{value!r} is not {kind}")
    return value


def _opt(value: Any, kind: Any) -> Any:
    return None if value is None else _typed(value, kind)


def _listed(value: Any, item: Callable[[Any], Any]) -> List[Any]:
    return [item(v) for v in _typed(value, list)]


def _near(d: Dict[str, Any]) -> NearMatch:
    return NearMatch(_typed(d["line"], int), _typed(d["matching"], int), _typed(d["total"], int),
                     _listed(d["differing"], lambda x: (_typed(x["line"], int), _typed(x["expected"], str),
                                                        _typed(x["found"], str))))


def _hunk(d: Dict[str, Any]) -> HunkResult:
    near = d.get("near")
    return HunkResult(_typed(d["hunk"], int), _typed(d["outcome"], str), _typed(d["stated_line"], int),
                      _opt(d["line"], int), _typed(d["offset"], int), _typed(d.get("reason", ""), str),
                      _near(_typed(near, dict)) if near is not None else None)


def _file(d: Dict[str, Any]) -> FileResult:
    return FileResult(_typed(d["path"], str), _typed(d["status"], str), _listed(d["hunks"], _hunk),
                      _typed(d.get("reason", ""), str))


def result_from_dict(d: Dict[str, Any]) -> ModResult:
    """A ModResult from its to_dict() form (the bytes before/after a patch are not kept)."""
    _typed(d, dict)
    return ModResult(_typed(d["mod"], str), _typed(d["vllm"], str), _typed(d["status"], str),
                     _opt(d["variant"], str), _typed(d.get("reason", ""), str), files_from_dicts(d["files"]),
                     _typed(d.get("chosen_by", ""), str))


def files_from_dicts(value: Any) -> List[FileResult]:
    """FileResults from their to_dict() forms (TypeError or KeyError when one is malformed)."""
    return _listed(value, _file)
