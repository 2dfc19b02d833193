"""The lines of a file that a diff against its old version marks added or changed: exactly
what `difflib.SequenceMatcher(None, old, new, autojunk=False)` marks, found faster.

drift.py checks only what a patch wrote, and asks this for every patched file of every
release. SequenceMatcher finds its matching blocks one longest block at a time, and its
search for one compares every line of `old` with every occurrence of that line in `new`: a
file with 400 blank lines costs 160,000 steps for the blank lines alone, on every level of
the search. Anchors find the same blocks without that search on the files patches edit.

Same answers, because each longest block is the one SequenceMatcher picks. With no junk, its
search returns the longest run of equal lines (old[i:i+k] == new[j:j+k]) within the ranges,
and of several, the one that starts first in `old`, then first in `new` (it keeps the first
run to reach the greatest length, scanning `old` then `new` forward). Here the runs are
found from anchors: the pairs of equal lines whose text occurs at most ANCHOR_MAX times in
`new`. Each anchor's run is followed both ways along its diagonal (each diagonal stretch once).
A run without an anchor is made of frequent lines only, so it is no longer than the longest
stretch of `old` made of frequent lines; when that stretch is shorter than the best anchored
run, every longest run has an anchor and the pick is SequenceMatcher's. Otherwise (or with no
anchor) SequenceMatcher's own search runs. tests/test_linediff.py compares both on random and
edited files.
"""

from __future__ import annotations

import bisect
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["changed_lines"]

# Lines whose text occurs at most this often in the new file anchor runs (a blank line or a
# lone `)` occurs hundreds of times and would make anchors as costly as the plain search).
ANCHOR_MAX = 8

Block = Tuple[int, int, int]  # i in old, j in new, length


def changed_lines(old: Sequence[str], new: Sequence[str], anchor_max: int = ANCHOR_MAX) -> List[int]:
    """0-based indices of `new` that SequenceMatcher(None, old, new, autojunk=False) puts in
    its "replace" or "insert" opcodes, ascending (anchor_max: see ANCHOR_MAX; tests vary it)."""
    return _Matcher(old, new, anchor_max).changed()


class _Matcher:
    def __init__(self, old: Sequence[str], new: Sequence[str], anchor_max: int) -> None:
        self.a, self.b, self.anchor_max = old, new, anchor_max
        self.b2j: Dict[str, List[int]] = {}
        for j, line in enumerate(new):
            self.b2j.setdefault(line, []).append(j)

    def changed(self) -> List[int]:
        """SequenceMatcher.get_matching_blocks' recursion; what no block covers is changed."""
        covered = bytearray(len(self.b))
        queue = [(0, len(self.a), 0, len(self.b))]
        while queue:
            alo, ahi, blo, bhi = queue.pop()
            i, j, k = self._anchored(alo, ahi, blo, bhi) or self._search(alo, ahi, blo, bhi)
            if k:
                covered[j:j + k] = b"\1" * k
                if alo < i and blo < j:
                    queue.append((alo, i, blo, j))
                if i + k < ahi and j + k < bhi:
                    queue.append((i + k, ahi, j + k, bhi))
        return [j for j, done in enumerate(covered) if not done]

    def _anchored(self, alo: int, ahi: int, blo: int, bhi: int) -> Optional[Block]:
        """The longest block from anchors, when it is provably SequenceMatcher's; else None."""
        a, b, b2j, cap = self.a, self.b, self.b2j, self.anchor_max
        size, besti, bestj = 0, alo, blo
        ends: Dict[int, int] = {}  # diagonal j - i -> end (in old) of the last run followed on it
        stretch = frequent = 0  # current and longest stretch of old made of frequent lines
        for i in range(alo, ahi):
            js = b2j.get(a[i])
            if js is None:
                stretch = 0
                continue
            if len(js) > cap:
                stretch += 1
                frequent = max(frequent, stretch)
                continue
            stretch = 0
            for j in js:
                if j < blo:
                    continue
                if j >= bhi:
                    break
                d = j - i
                if ends.get(d, -1) > i:
                    continue  # inside the run already followed on this diagonal
                s, e = i, i + 1
                while s > alo and s + d > blo and a[s - 1] == b[s - 1 + d]:
                    s -= 1
                while e < ahi and e + d < bhi and a[e] == b[e + d]:
                    e += 1
                ends[d] = e
                if e - s > size or (e - s == size and (s, s + d) < (besti, bestj)):
                    size, besti, bestj = e - s, s, s + d
        if size == 0 or frequent >= size:
            return None
        return besti, bestj, size

    def _search(self, alo: int, ahi: int, blo: int, bhi: int) -> Block:
        """SequenceMatcher.find_longest_match without junk (each line's occurrences in new
        are entered at blo rather than walked from the start)."""
        a, b2j = self.a, self.b2j
        besti, bestj, size = alo, blo, 0
        j2len: Dict[int, int] = {}
        for i in range(alo, ahi):
            newj2len: Dict[int, int] = {}
            js = b2j.get(a[i])
            if js is not None:
                get = j2len.get
                for x in range(bisect.bisect_left(js, blo), len(js)):
                    j = js[x]
                    if j >= bhi:
                        break
                    k = newj2len[j] = get(j - 1, 0) + 1
                    if k > size:
                        besti, bestj, size = i - k + 1, j - k + 1, k
            j2len = newj2len
        return besti, bestj, size
