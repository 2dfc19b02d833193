"""Carry out a HybridPlan: stream the output into a temporary folder, verify, rename.

A failure at any point (bad plan, full disk, Ctrl-C, a source file changing under us)
leaves no output folder and no temporary folder behind; an existing output is replaced
only with `force`, and only after the new one is complete.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sparkmods.checkpoint.fileops import link_or_copy
from sparkmods.checkpoint.header import read_header
from sparkmods.checkpoint.hybrid_plan import HybridPlan
from sparkmods.checkpoint.layout import INDEX_NAME, Index
from sparkmods.checkpoint.progress import byte_progress
from sparkmods.checkpoint.shard_writer import write_shard
from sparkmods.errors import SparkmodsError


@dataclass
class BuildResult:
    out: Path
    rewritten: int
    hardlinked: int
    copied: int  # unchanged weight files that could not be hardlinked (another filesystem)
    bytes_written: int
    others: int = 0  # config, tokenizer and other non-weight files: always copied


def check_target(plan: HybridPlan, out: Path, force: bool) -> None:
    """Refuse an output that overlaps an input, or exists without `force`."""
    resolved = out.resolve()
    for src in (plan.int4_root, plan.fp8_root):
        src = src.resolve()
        if resolved == src or src in resolved.parents or resolved in src.parents:
            raise SparkmodsError(f"--out {out} overlaps the input {src}: choose another folder")
    if os.path.lexists(out) and not force:
        raise SparkmodsError(f"{out} already exists: pass --force to replace it")


def build_hybrid(plan: HybridPlan, out: Path, *, force: bool = False, progress: bool = True) -> BuildResult:
    """Write the checkpoint `plan` describes to `out`."""
    if plan.errors:
        more = f" (and {len(plan.errors) - 1} more; see --dry-run)" if len(plan.errors) > 1 else ""
        raise SparkmodsError(f"cannot build: {plan.errors[0]}{more}")
    out = Path(out)
    clean_leftovers(out)
    check_target(plan, out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    result = BuildResult(out, 0, 0, 0, 0)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; a model folder must not be
        _write_all(plan, tmp, progress, result)
        _verify(plan, tmp)
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result


def clean_leftovers(out: Path) -> None:
    """Undo what a killed earlier build left beside `out`.

    `.OUT.partial-*` folders are unfinished outputs: removed. `.OUT.old-*` is a previous
    output moved aside for the swap: put back if the swap never finished, else removed.
    """
    if not out.parent.is_dir():
        return
    for leftover in sorted(out.parent.glob(f".{glob.escape(out.name)}.partial-*")):
        shutil.rmtree(leftover, ignore_errors=True)
    for old in sorted(out.parent.glob(f".{glob.escape(out.name)}.old-*")):
        if not os.path.lexists(out):
            os.rename(old, out)
        elif old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
        else:
            old.unlink()


def _write_all(plan: HybridPlan, tmp: Path, progress: bool, result: BuildResult) -> None:
    total = sum(f.nbytes if f.changed else f.source.stat().st_size for f in plan.files)
    with byte_progress(total, "build-hybrid", enabled=progress) as advance:
        for f in plan.files:
            if f.changed:
                result.bytes_written += write_shard(tmp / f.name, f.pieces, f.metadata, advance)
                result.rewritten += 1
            elif link_or_copy(f.source, tmp / f.name, advance) == "hardlinked":
                result.hardlinked += 1
            else:
                result.copied += 1
                result.bytes_written += f.source.stat().st_size
    for name in plan.other_files:
        result.others += 1
        src = plan.int4_root / name
        if src.is_dir():
            shutil.copytree(src, tmp / name)
        else:
            shutil.copyfile(src, tmp / name)  # small files: copied, never linked (people edit them)
    index = Index(plan.weight_map(), {"total_size": plan.total_size()}, dict(plan.index_extra))
    (tmp / INDEX_NAME).write_text(index.dumps(), encoding="utf-8")


def _verify(plan: HybridPlan, tmp: Path) -> None:
    """Re-read every written header: names, dtypes, shapes and file sizes as planned."""
    for f in plan.files:
        header = read_header(tmp / f.name)
        got = {n: (t.dtype, t.shape) for n, t in header.tensors.items()}
        want = {p.name: (p.dtype, p.shape) for p in f.pieces}
        end = max((t.end for t in header.tensors.values()), default=header.data_start)
        if got != want or end != header.file_size:
            raise SparkmodsError(f"{f.name}: written file does not match the plan (internal error)")


def _swap_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished folder to `out`; an old `out` is removed only afterwards."""
    old = None
    if os.path.lexists(out):
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.rename(out, old)
    try:
        os.rename(tmp, out)
    except BaseException:
        if old is not None:
            os.rename(old, out)
        raise
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
        else:
            old.unlink()
