"""Turn a community mod into one of ours: a mod.toml whose variants are keyed by the vLLM
versions where the mod's run.sh steps apply, each with one patch regenerated from what those
steps produce there (stacked diffs, -R, --exclude and odd -p levels all resolved), and a
generated run.sh that fails loudly where no variant fits instead of skipping silently. A mod
whose run.sh cannot be read statically (Python or sed patchers) is run in the sandbox on each
version instead, and its variants' patches are what the runs wrote.

Consecutive checked versions where the steps apply (ok or ok-offset, no drift) share a
variant: `>=` the first, `<` the next checked version where they stop (open-ended when they
still apply to the newest checked), `verified` on every version of the run. Versions where
they do not apply are reported; `sparkmods rebase` can carry the patch there.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from sparkmods.community.judge import CommunityResult, judge
from sparkmods.community.runsh import CommunityMod
from sparkmods.errors import SparkmodsError
from sparkmods.rebase.regen import file_diff
from sparkmods.rebase.tomledit import _value, render_variant
from sparkmods.runtime.engine import OK, OK_OFFSET
from sparkmods.runtime.pep440 import Version

if TYPE_CHECKING:
    from sparkmods.community.sandbox import RunResult

__all__ = ["Adopted", "plan_adoption", "write_adoption"]


@dataclass
class Variant:
    label: str
    first: str
    end: str  # exclusive upper bound ("" = open-ended)
    verified: List[str]
    patch: str

    @property
    def vllm(self) -> str:
        return f">={self.first}" + (f", <{self.end}" if self.end else "")


@dataclass
class Adopted:
    name: str
    variants: List[Variant] = field(default_factory=list)
    not_carried: List[Tuple[str, str, str]] = field(default_factory=list)  # (version, status, reason)


def _combined(result: CommunityResult) -> str:
    """One diff for what every step together does to each file."""
    return "".join(file_diff(f.path, f.before.decode("utf-8", "surrogateescape").splitlines(True) if f.before is not None else None,
                             f.after.decode("utf-8", "surrogateescape").splitlines(True) if f.after is not None else None)
                   for f in result.files)


def plan_adoption(mod: CommunityMod, name: str, sources: Sequence) -> Adopted:
    """The variants for these sources (any order: sorted by version here)."""
    if not mod.checkable:
        raise SparkmodsError(f"{mod.path}: cannot adopt: {mod.why_not()}")
    adopted = Adopted(name)
    current = None
    for source in sorted(sources, key=lambda s: Version(s.version)):
        result = judge(mod, source, keep_bytes=True)
        public = str(Version(source.version).public)
        if result.status not in (OK, OK_OFFSET):
            adopted.not_carried.append((public, result.status, result.reason))
            if current is not None:
                current.end, current = public, None
            continue
        if current is None:
            current = Variant(f"v{public}", public, "", [], _combined(result))
            adopted.variants.append(current)
        current.verified.append(public)
    if not adopted.variants:
        raise SparkmodsError(f"{mod.path}: cannot adopt: its steps apply to none of the "
                             f"{len(sources)} vLLM versions checked")
    return adopted


def _run_patch(tree: Path, ran: RunResult) -> str:
    """One diff for what a run changed in vllm/ (pristine bytes from the release tree)."""
    def lines(data: Optional[bytes]) -> Optional[List[str]]:
        return None if data is None else data.decode("utf-8", "surrogateescape").splitlines(True)
    return "".join(file_diff(path, lines((tree / path).read_bytes() if (tree / path).is_file() else None),
                             lines(ran.after[path])) for _, path in ran.changed
                   if not path.endswith(_LEFTOVERS))  # GNU patch's backups and rejects are not the fix


_LEFTOVERS = (".orig", ".rej")


def _shape(patch: str) -> str:
    """The patch without its hunks' line numbers: runs that differ only there share a variant."""
    return re.sub(r"^@@ [^@]* @@", "@@", patch, flags=re.M)


def plan_adoption_by_running(mod: CommunityMod, name: str, sources: Sequence, image: str,
                             timeout: float) -> Adopted:
    """The variants for a mod judged by running it (sandbox.py): on each version where the run
    changed only vllm/ files and exited 0, its patch is what the run wrote; consecutive versions
    whose patches differ only in line numbers share a variant."""
    from sparkmods.community.sandbox import APPLIED, _client, release_tree, run_mod

    adopted = Adopted(name)
    current, shape = None, ""
    client = _client()
    for source in sorted(sources, key=lambda s: Version(s.version)):
        public = str(Version(source.version).public)
        with tempfile.TemporaryDirectory(prefix="sparkmods-adopt-") as tmp:
            tree = release_tree(source, Path(tmp))
            ran = run_mod(mod.path, tree, image, timeout, client, keep=True)
            symlinks = [p for op, p in ran.changed if op != "deleted" and p not in ran.after]
            patch = _run_patch(tree, ran) if ran.status == APPLIED and not symlinks else ""
        if not patch:
            why = f"wrote symbolic links {', '.join(symlinks)}" if symlinks else ran.reason(timeout)
            adopted.not_carried.append((public, ran.status, why))
            if current is not None:
                current.end, current = public, None
            continue
        if current is not None and _shape(patch) != shape:
            current.end, current = public, None
        if current is None:
            current, shape = Variant(f"v{public}", public, "", [], patch), _shape(patch)
            adopted.variants.append(current)
        current.verified.append(public)
    if not adopted.variants:
        raise SparkmodsError(f"{mod.path}: cannot adopt: its run changed vLLM on none of the "
                             f"{len(sources)} versions run")
    return adopted


def write_adoption(adopted: Adopted, mod: CommunityMod, out: Path) -> None:
    """mod.toml and the patches under out, a new folder written whole or not at all (built
    beside it, then renamed); the caller syncs run.sh."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SparkmodsError(f"{out}: exists and is not empty; adopt writes a new mod folder")
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", adopted.name):
        raise SparkmodsError(f"{adopted.name!r}: a mod name is lower-case letters, digits, '.', '_' or '-'")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out.parent) as tmp:
        _write_files(adopted, mod, Path(tmp) / "mod")
        if out.exists():
            out.rmdir()
        os.replace(Path(tmp) / "mod", out)


def _write_files(adopted: Adopted, mod: CommunityMod, out: Path) -> None:
    lines = ["schema = 1\n", f"name = {_value(adopted.name)}\n",
             f"summary = {_value(f'adopted from the community mod {mod.name} (what its run.sh does, as one patch per variant)')}\n"]
    for v in adopted.variants:
        rel = f"patches/{v.label}/{mod.name}.patch"
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(v.patch, encoding="utf-8")
        lines += ["\n"] + render_variant({"label": v.label, "vllm": v.vllm, "patches": [rel], "verified": v.verified},
                                         f"what the run.sh of {mod.name} does to vLLM {v.verified[0]}")
    (out / "mod.toml").write_text("".join(lines), encoding="utf-8")
