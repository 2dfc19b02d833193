"""File moves that never corrupt a checkpoint and never copy more than they must.

Hugging Face caches keep files as blobs that snapshot folders point to through symlinks.
Writing *through* such a symlink would silently change the cached blob (and every other
snapshot sharing it), so every write here goes to a temporary file in the destination
folder and is renamed over the destination (outputfile.py): a symlink is replaced, its
target untouched.
"""

from __future__ import annotations

import errno
import glob
import os
import re
import shutil
from pathlib import Path
from typing import Callable

from sparkmods.errors import SparkmodsError
from sparkmods.outputfile import replacing, temp_name

# Bounded buffer for the user-space fallbacks: peak memory never depends on file size.
CHUNK = 8 << 20
# copy_file_range is asked for at most this much per call so progress can be reported.
RANGE_STEP = 64 << 20
_NO_KERNEL_COPY = {errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EBADF, errno.EPERM}


def remove_stale_temps(path: Path) -> list[Path]:
    """Remove temp siblings of `path` (and of its backups) that a killed run left; returns them.

    Only names outputfile.temp_name makes match, so nothing of the user's is touched.
    """
    pattern = re.compile(rf"\.{re.escape(path.name)}(\.bak(\.\d+)?)?\.[0-9a-f]{{12}}\.tmp")
    stale = [p for p in path.parent.glob(f".{glob.escape(path.name)}*.tmp") if pattern.fullmatch(p.name)]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` via temp file + fsync + rename; a symlink at `path` is replaced.

    Readers (vLLM) see the old file or the complete new one, also after a crash.
    """
    with replacing(path, durable=True) as out:
        out.write(text.encode("utf-8"))


def backup_file(path: Path) -> Path:
    """Copy the content of `path` (through a symlink) to the first free `.bak` name.

    An existing backup with the same bytes is reused, so retries (after a kill, say) never
    pile up `.bak.N` copies of one file.
    """
    n = 0
    while True:
        candidate = path.with_name(path.name + (".bak" if n == 0 else f".bak.{n}"))
        if not os.path.lexists(candidate):
            break
        if candidate.is_file() and not candidate.is_symlink() and files_identical(path, candidate):
            return candidate
        n += 1
    with replacing(candidate) as out, path.open("rb") as source:
        shutil.copyfileobj(source, out)
    return candidate


def copy_range(
    src_fd: int,
    dst_fd: int,
    offset: int,
    length: int,
    on_bytes: Callable[[int], None] = lambda n: None,
) -> None:
    """Append `length` bytes of `src_fd` from `offset` to `dst_fd` (at its position).

    Uses the kernel's copy_file_range where it works (no user-space buffer at all) and
    a bounded pread/write loop elsewhere. A source shorter than expected raises: the file
    changed after its header was read.
    """
    done = 0
    kernel = hasattr(os, "copy_file_range")
    while done < length:
        step = min(RANGE_STEP if kernel else CHUNK, length - done)
        if kernel:
            try:
                n = os.copy_file_range(src_fd, dst_fd, step, offset + done)
            except OSError as exc:
                if exc.errno not in _NO_KERNEL_COPY:
                    raise
                kernel = False
                continue
        else:
            buf = os.pread(src_fd, step, offset + done)
            n = len(buf)
            view = memoryview(buf)
            while view:
                view = view[os.write(dst_fd, view):]
        if n == 0:
            raise SparkmodsError(
                f"source ended {length - done} bytes early at offset {offset + done}: "
                "did a checkpoint file change while sparkmods was reading it?"
            )
        done += n
        on_bytes(n)


def copy_file(src: Path, dst: Path, on_bytes: Callable[[int], None] = lambda n: None) -> None:
    """Stream `src` (following symlinks) into a new file `dst` with bounded memory."""
    with open(src, "rb") as fin, open(dst, "xb") as fout:
        copy_range(fin.fileno(), fout.fileno(), 0, os.fstat(fin.fileno()).st_size, on_bytes)


def files_identical(a: Path, b: Path) -> bool:
    """Same file or same bytes; compares in bounded chunks and stops at the first difference."""
    if os.path.samefile(a, b):
        return True
    if os.path.getsize(a) != os.path.getsize(b):
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            ca, cb = fa.read(CHUNK), fb.read(CHUNK)
            if ca != cb:
                return False
            if not ca:
                return True


def link_or_copy(src: Path, dst: Path, on_bytes: Callable[[int], None] = lambda n: None) -> str:
    """Create `dst` (must not exist) as a hardlink of `src`'s real file, else as a copy.

    Returns "hardlinked" or "copied". A hardlink shares the inode, which is safe because
    nothing here (nor the Hugging Face client) ever writes a checkpoint file in place.
    """
    try:
        os.link(os.path.realpath(src), dst)
        on_bytes(os.path.getsize(dst))
        return "hardlinked"
    except OSError as exc:
        if exc.errno not in {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP}:
            raise
    copy_file(src, dst, on_bytes)
    return "copied"


def place_file(src: Path, dst: Path, on_bytes: Callable[[int], None] = lambda n: None) -> str:
    """Make `dst` hold the bytes of `src` without re-copying what is already there.

    Returns "same" (one file), "identical" (already equal bytes), "hardlinked" or
    "copied". A different existing `dst` is an error: the caller decides about deleting.
    """
    if os.path.lexists(dst):
        if not dst.exists():
            raise SparkmodsError(f"{dst} is a broken symlink: remove it and run again")
        if files_identical(src, dst):
            return "same" if os.path.samefile(src, dst) else "identical"
        raise SparkmodsError(f"{dst} exists and differs from {src}: remove it and run again")
    tmp = temp_name(dst)
    try:
        how = link_or_copy(src, tmp, on_bytes)
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return how
