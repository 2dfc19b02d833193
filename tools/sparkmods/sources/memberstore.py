"""Wheel members kept on disk by what a central directory says they hold, shared by every wheel.

A member is named by its ContentId (zipread.py: path, size, CRC-32), not by the wheel it came
from: releases and nightly builds keep most of vLLM's files byte for byte (of the 389 members
a check of 23 releases reads, 176 distinct contents; 50 nightly builds of one commit share
all of theirs), so a file is fetched and written once and every wheel that lists the same id
reads it from here. Nothing stored is trusted: the reader checks the bytes against its own
central directory (zipread.ZipMembers.matches, the check a download of them passes) and
treats a file that fails it as absent, and the central directory itself is only used under
the identity its wheel recorded (wheelentry.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from sparkmods.sources.cache import cache_root, digest, read_bytes, write_atomic
from sparkmods.sources.zipread import ContentId


def _path(cid: ContentId) -> Path:
    name = digest("%s\0%d\0%d" % cid)
    return cache_root() / "members-v1" / name[:2] / name


def load(cid: ContentId) -> Optional[bytes]:
    """The stored bytes for cid (unverified: see the module docstring), or None."""
    return read_bytes(_path(cid))


def save(cid: ContentId, data: bytes) -> None:
    """Store verified bytes under their id (atomically; a second writer writes the same)."""
    write_atomic(_path(cid), data)
