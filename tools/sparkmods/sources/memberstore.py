"""Wheel members kept on disk by the sha256 their own wheel's RECORD lists, shared by every wheel.

Releases keep most of vLLM's files byte for byte (and nightly builds of one commit all of
them), so a file is fetched and written once and every wheel that needs the same bytes reads
it from here. What says "the same bytes" must be a cryptographic hash: a central directory
only gives size and CRC-32, and four chosen bytes force any CRC-32, so an index serving a
forged file of the right path, size and CRC-32 would otherwise answer for the real wheel's
file later, online and offline. A wheel's `*.dist-info/RECORD` (read from that wheel, checked
against its own central directory like any member) lists every file's sha256, so:

- a member its RECORD gives a sha256 is stored under that hash (`shared`) once its bytes hash
  to it, and read back only by a wheel whose own RECORD names the same hash, after the
  stored bytes are hashed again (and matched against the reader's central directory);
- any other member (no RECORD, not listed, or bytes that contradict it) and the RECORD itself
  are stored under a key `scoped` to their wheel: its cache entry and the central directory
  that entry recorded (wheelentry.py), so no other wheel ever reads them.

Within a process, a wheel claims the keys it is about to fetch (claim/settle): a wheel that
needs the same bytes meanwhile waits for that fetch instead of making its own, as a release
and its patch release (which share most files) are read at the same time.
"""

from __future__ import annotations

import base64
import binascii
import csv
import hashlib
import re
import threading
from pathlib import Path
from typing import Dict, Iterable, List, NamedTuple, Optional, Tuple

from sparkmods.sources.cache import cache_root, digest, read_bytes, write_atomic
from sparkmods.sources.zipread import ContentId


class Key(NamedTuple):
    """Where a member's bytes are stored, and the sha256 they must have (None: scoped, no hash)."""

    name: str
    sha256: Optional[str]


def shared(sha256: str) -> Key:
    return Key("sha256-" + sha256, sha256)


def scoped(scope: str, cid: ContentId) -> Key:
    """A key only the wheel `scope` names can reach (see the module docstring)."""
    name, size, crc = cid
    return Key("wheel-" + digest(f"{scope}\0{name}\0{size}\0{crc}"), None)


def record_name(names: Iterable[str]) -> Optional[str]:
    """The wheel's `NAME.dist-info/RECORD` when it has exactly one."""
    found = [n for n in names if n.endswith(".dist-info/RECORD") and n.count("/") == 1]
    return found[0] if len(found) == 1 else None


_ROW = re.compile(r"^([^\n\r\",]+),(sha256=[A-Za-z0-9_=-]+),", re.M)


def record_hashes(data: bytes) -> Dict[str, str]:
    """path -> the sha256 field of its RECORD row ("sha256=<urlsafe base64>"), decoded only when
    looked up (sha256_hex): a vLLM RECORD has thousands of rows and a check needs a few. Rows
    are matched in one pass; a quoted path (one holding a comma) goes through csv."""
    text = data.decode("utf-8", errors="replace")
    hashes = dict(_ROW.findall(text))
    quoted = text.startswith('"') or '\n"' in text
    for row in csv.reader(line for line in text.splitlines() if quoted and line.startswith('"')):
        if len(row) == 3 and row[1].startswith("sha256="):
            hashes[row[0]] = row[1]
    return hashes


def sha256_hex(field: str) -> Optional[str]:
    """The hex digest a RECORD sha256 field gives, or None when it is malformed (that member is
    then simply not shared)."""
    value = field[len("sha256="):]
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == 32 else None


def _path(key: Key) -> Path:
    """One flat folder, as the result cache's (resultcache.py says why)."""
    return cache_root() / "members-v2" / key.name


def load(key: Key) -> Optional[bytes]:
    """The stored bytes for key, or None; a shared entry whose bytes no longer hash to its
    name is as good as absent (the caller still checks size and CRC-32 against its own wheel)."""
    data = read_bytes(_path(key))
    if data is not None and key.sha256 is not None and hashlib.sha256(data).hexdigest() != key.sha256:
        return None
    return data


def save(key: Key, data: bytes) -> None:
    """Store bytes read from the wheel the key came from (atomically; a second writer writes the
    same). Bytes that do not hash to a shared key's sha256 are never stored under it."""
    if key.sha256 is not None and hashlib.sha256(data).hexdigest() != key.sha256:
        return
    write_atomic(_path(key), data)


_claims: Dict[str, threading.Event] = {}
_claims_lock = threading.Lock()


def claim(keys: Iterable[Key]) -> Tuple[List[Key], List[threading.Event]]:
    """(the keys now claimed by the caller, who must settle them; the events of the others'
    claims, set once those fetches ended, stored or not)."""
    mine: List[Key] = []
    theirs: List[threading.Event] = []
    with _claims_lock:
        for key in keys:
            event = _claims.get(key.name)
            if event is None:
                _claims[key.name] = threading.Event()
                mine.append(key)
            else:
                theirs.append(event)
    return mine, theirs


def settle(keys: Iterable[Key]) -> None:
    """End the caller's claims (after its fetch stored the bytes, or failed)."""
    with _claims_lock:
        events = [_claims.pop(key.name) for key in keys]
    for event in events:
        event.set()
