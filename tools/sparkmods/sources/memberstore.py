"""Wheel members kept on disk by what a central directory says they hold, shared by every wheel.

A member is named by its ContentId (zipread.py: path, size, CRC-32), not by the wheel it came
from: releases keep most of vLLM's files byte for byte (and nightly builds of one commit
all of them), so a file is fetched and written once and every wheel that lists the same id
reads it from here. Nothing stored is trusted: the reader checks the bytes against its own
central directory (zipread.ZipMembers.matches, the check a download of them passes) and
treats a file that fails it as absent, and the central directory itself is only used under
the identity its wheel recorded (wheelentry.py).

Within a process, a wheel claims the ids it is about to fetch (claim/settle): a wheel that
needs the same bytes meanwhile waits for that fetch instead of making its own, as a release
and its patch release (which share most files) are read at the same time.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

from sparkmods.sources.cache import cache_root, digest, read_bytes, write_atomic
from sparkmods.sources.zipread import ContentId


def _path(cid: ContentId) -> Path:
    """One flat folder, as the result cache's (resultcache.py says why)."""
    return cache_root() / "members-v1" / digest("%s\0%d\0%d" % cid)


def load(cid: ContentId) -> Optional[bytes]:
    """The stored bytes for cid (unverified: see the module docstring), or None."""
    return read_bytes(_path(cid))


def save(cid: ContentId, data: bytes) -> None:
    """Store verified bytes under their id (atomically; a second writer writes the same)."""
    write_atomic(_path(cid), data)


_claims: Dict[ContentId, threading.Event] = {}
_claims_lock = threading.Lock()


def claim(cids: Iterable[ContentId]) -> Tuple[List[ContentId], List[threading.Event]]:
    """(the ids now claimed by the caller, who must settle them; the events of the others'
    claims, set once those fetches ended, stored or not)."""
    mine: List[ContentId] = []
    theirs: List[threading.Event] = []
    with _claims_lock:
        for cid in cids:
            event = _claims.get(cid)
            if event is None:
                _claims[cid] = threading.Event()
                mine.append(cid)
            else:
                theirs.append(event)
    return mine, theirs


def settle(cids: Iterable[ContentId]) -> None:
    """End the caller's claims (after its fetch stored the bytes, or failed)."""
    with _claims_lock:
        events = [_claims.pop(cid) for cid in cids]
    for event in events:
        event.set()
