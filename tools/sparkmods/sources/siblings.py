"""The paths the wheels of one target (a release range, a nightly range) were asked for.

A check asks neighbouring releases for about the same paths: the patched files, then the
modules the drift checks follow from them, one round trip at a time as each module names the
next. A wheel that must go to the network anyway fetches, in the same batch, what its nearest
siblings (in the target's version order) were asked for and it does not hold yet
(remote.RemoteWheel.prefetch): a release's import chains then cost one round of requests
rather than one per module. A sibling whose check is done (released) knows its whole chain,
so the hints stop at the nearest such one; before any is done, the first releases checked
at once learn each other's chains as they go. A hint, never a requirement: bounded per wheel.
(What the wheels share byte for byte is shared through the member store, memberstore.py.)
"""

from __future__ import annotations

import threading
from typing import Dict, Iterable, List

MAX_ASKED = 256  # paths per wheel: a check asks a release for about 60


class Siblings:
    """Shared by the RemoteWheels one target opened (sources/spec.py), each at its place in
    the target's order (join)."""

    def __init__(self, max_asked: int = MAX_ASKED) -> None:
        self._max_asked = max_asked
        self._asked: List[Dict[str, None]] = []  # per place: insertion-ordered set of paths
        self._done: List[bool] = []  # per place: released, so its asked paths are complete
        self._lock = threading.Lock()

    def join(self) -> int:
        """A place for the next wheel of the target."""
        with self._lock:
            self._asked.append({})
            self._done.append(False)
            return len(self._asked) - 1

    def done(self, place: int) -> None:
        """The wheel at place was released: everything it will be asked was asked."""
        with self._lock:
            self._done[place] = True

    def note_asked(self, place: int, paths: Iterable[str]) -> None:
        with self._lock:
            asked = self._asked[place]
            for path in paths:
                if len(asked) >= self._max_asked:
                    return
                asked[path] = None

    def hints(self, place: int) -> List[str]:
        """What the siblings were asked, nearest first (earlier before later at the same
        distance: the release before is the likeliest to read the same), up to and including
        the nearest done one, whose chains are complete; all of them while none is done."""
        with self._lock:
            out: Dict[str, None] = {}
            for distance in range(1, len(self._asked)):
                for other in (place - distance, place + distance):
                    if 0 <= other < len(self._asked):
                        out.update(self._asked[other])
                        if self._done[other]:
                            return list(out)
            return list(out)
