"""A served run's results as one archive: how they come back from the GPU machine whole.

A device call returns at most 8 files, none more than two folders below $OUT, and a run's results
are served.json, .md, .svg, the run's log and one server log per configuration under
servers/<config>/: copied as they are, the server logs stay behind. So `pack` writes each
OUT/served-<model>-<vllm>-<gpu>/ folder, with OUT/bench.log put inside it, as one gzip archive,
and `unpack`, here, extracts one into the results folder: only plain files and folders under
that one served-* folder, never over an existing one, at most MAX_BYTES inflated.
"""

from __future__ import annotations

import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path

MAX_BYTES = 512 << 20  # far above any run's logs; a bound on what an archive may inflate to
PREFIX = "served-"


class ArchiveError(ValueError):
    """An archive unpack will not extract; the message names it and what to do."""


def pack(out: Path, dest: Path) -> list[Path]:
    """dest/<folder>.tar.gz for each OUT/served-*/ folder (OUT/bench.log inside it as bench.log)."""
    folders = sorted(p for p in out.glob(f"{PREFIX}*") if p.is_dir())
    if not folders:
        raise ArchiveError(f"{out}: no {PREFIX}* results folder to pack; pass the --out of a served run")
    dest.mkdir(parents=True, exist_ok=True)
    made = []
    for folder in folders:
        archive = dest / f"{folder.name}.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(folder, arcname=folder.name)
            if (out / "bench.log").is_file():
                tar.add(out / "bench.log", arcname=f"{folder.name}/bench.log")
        made.append(archive)
    return made


def _members(tar: tarfile.TarFile, archive: Path) -> tuple[str, list[tarfile.TarInfo]]:
    """The one served-* folder the archive holds and its members, each checked."""
    members = tar.getmembers()
    tops = {Path(m.name).parts[0] for m in members if Path(m.name).parts}
    if len(tops) != 1 or not next(iter(tops)).startswith(PREFIX):
        raise ArchiveError(f"{archive}: holds {sorted(tops) or 'nothing'}, not one {PREFIX}* folder; "
                           "pass an archive `bench_served.py pack` wrote")
    total = 0
    for m in members:
        if not (m.isfile() or m.isdir()) or Path(m.name).is_absolute() or ".." in Path(m.name).parts:
            raise ArchiveError(f"{archive}: member {m.name!r} is not a plain file or folder inside the archive's "
                               "folder; not extracting it")
        total += m.size
    if total > MAX_BYTES:
        raise ArchiveError(f"{archive}: inflates to {total} bytes, over {MAX_BYTES}; not extracting it")
    return next(iter(tops)), members


def unpack(archive: Path, results: Path) -> Path:
    """Extract archive into results/<its served-* folder>, which must not exist yet; that folder.
    Extracted beside it first and renamed into place: an interrupted unpack leaves no half folder."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            name, members = _members(tar, archive)
            target = results / name
            if target.exists():
                raise ArchiveError(f"{target} exists already; remove it, or unpack into another --results folder")
            results.mkdir(parents=True, exist_ok=True)
            scratch = Path(tempfile.mkdtemp(prefix=".unpack-", dir=results))
            try:
                tar.extractall(scratch, members=members, filter="data")
                (scratch / name).rename(target)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise ArchiveError(f"{archive}: could not extract it into {results} ({exc}); a damaged archive: fetch "
                           "it again") from None
    return target
