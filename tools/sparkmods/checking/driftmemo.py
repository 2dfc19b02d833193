"""Drift findings remembered with the questions their check asked, so that a check whose
tree answers them all the same is not parsed and walked again.

The findings of drift.check_patched are a pure function of the changes (every patched file
before and after) and of what the tree answered: the bytes of each module it read, or that
there was none, and the folder and extension questions it put to the file list
(VllmTree.observed, in the order asked). The checks are deterministic, so a tree that gives
the recorded answers to the recorded questions, asked in that order, would take the very
same path and find the very same things. Consecutive releases, and nightly builds above all,
often leave the patched files and everything they import unchanged; their checks then cost
the reads (which the check would do anyway) instead of parsing and walking the closure.
The memo lives in the process (one check or matrix run over many builds): nothing is stored.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Dict, Generic, List, Optional, Sequence, Tuple, TypeVar

from sparkmods.pyindex.resolve import Observation, VllmTree

Changes = Dict[str, Tuple[Optional[bytes], Optional[bytes]]]  # path -> (before, after)
T = TypeVar("T")


def changes_key(changes: Changes) -> bytes:
    """sha256 over every patched path and the digests of its content before and after."""
    digest = hashlib.sha256()
    for path in sorted(changes):
        digest.update(path.encode("utf-8", "surrogateescape") + b"\0")
        for data in changes[path]:
            digest.update(b"-" if data is None else b"+" + hashlib.sha256(data).digest())
    return digest.digest()


def answers_all(tree: VllmTree, observed: Sequence[Observation]) -> bool:
    """Whether tree answers every recorded question as recorded (stops at the first that differs)."""
    return all(tree.answer(question) == question[2] for question in observed)


R = TypeVar("R")


class DriftMemo(Generic[R]):
    """Results by changes key: for each, the last few (questions and answers, result) pairs."""

    def __init__(self, keys: int = 256, per_key: int = 4) -> None:
        self._keys, self._per_key = keys, per_key
        self._table: "OrderedDict[bytes, List[Tuple[Tuple[Observation, ...], R]]]" = OrderedDict()
        self._lock = threading.Lock()

    def lookup(self, key: bytes, tree: VllmTree) -> Optional[R]:
        """A stored result whose questions tree answers the same; None when there is none."""
        with self._lock:
            entries = list(self._table.get(key, ()))
        for observed, result in entries:
            if answers_all(tree, observed):
                return result
        return None

    def store(self, key: bytes, observed: Sequence[Observation], result: R) -> None:
        with self._lock:
            entries = self._table.setdefault(key, [])
            self._table.move_to_end(key)
            entries.insert(0, (tuple(observed), result))
            del entries[self._per_key:]
            while len(self._table) > self._keys:
                self._table.popitem(last=False)
