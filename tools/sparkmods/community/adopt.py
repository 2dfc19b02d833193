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
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

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


# A version as a plan sees it: (public version, the patch it carries or None, status, why not).
Outcome = Tuple[str, Optional[str], str, str]


def _lines(data: Optional[bytes]) -> Optional[List[str]]:
    return None if data is None else data.decode("utf-8", "surrogateescape").splitlines(True)


def _combined(result: CommunityResult) -> str:
    """One diff for what every step together does to each file."""
    return "".join(file_diff(f.path, _lines(f.before), _lines(f.after)) for f in result.files)


def _grouped(name: str, outcomes: Iterable[Outcome], key: Callable[[str], str]) -> Adopted:
    """Variants from versions in order: consecutive versions whose patches have the same key
    share one (with the first one's patch); a version that carries none ends the current one."""
    adopted = Adopted(name)
    current: Optional[Variant] = None
    current_key = ""
    for public, patch, status, why in outcomes:
        if patch is None:
            adopted.not_carried.append((public, status, why))
            if current is not None:
                current.end, current = public, None
            continue
        if current is not None and key(patch) != current_key:
            current.end, current = public, None
        if current is None:
            current, current_key = Variant(f"v{public}", public, "", [], patch), key(patch)
            adopted.variants.append(current)
        current.verified.append(public)
    return adopted


def _judged(mod: CommunityMod, sources: Sequence) -> Iterator[Outcome]:
    for source in sorted(sources, key=lambda s: Version(s.version)):
        result = judge(mod, source, keep_bytes=True)
        public = str(Version(source.version).public)
        if result.status not in (OK, OK_OFFSET):
            yield public, None, result.status, result.reason
        else:
            yield public, _combined(result), result.status, ""


def plan_adoption(mod: CommunityMod, name: str, sources: Sequence) -> Adopted:
    """The variants for these sources (any order: sorted by version here); consecutive
    versions the steps apply to share a variant."""
    if not mod.checkable:
        raise SparkmodsError(f"{mod.path}: cannot adopt: {mod.why_not()}")
    adopted = _grouped(name, _judged(mod, sources), key=lambda _patch: "")
    if not adopted.variants:
        raise SparkmodsError(f"{mod.path}: cannot adopt: its steps apply to none of the "
                             f"{len(sources)} vLLM versions checked")
    return adopted


def _run_patch(tree: Path, ran: RunResult) -> str:
    """One diff for what a run changed in vllm/ (pristine bytes from the release tree)."""
    return "".join(file_diff(path, _lines((tree / path).read_bytes() if (tree / path).is_file() else None),
                             _lines(ran.after[path])) for _, path in ran.changed
                   if not path.endswith(_LEFTOVERS))  # GNU patch's backups and rejects are not the fix


_LEFTOVERS = (".orig", ".rej")


def _shape(patch: str) -> str:
    """The patch without its hunks' line numbers: runs that differ only there share a variant."""
    return re.sub(r"^@@ [^@]* @@", "@@", patch, flags=re.M)


def _ran(mod: CommunityMod, sources: Sequence, image: str, timeout: float) -> Iterator[Outcome]:
    from sparkmods.community.sandbox import APPLIED, _client, release_tree, run_mod

    client = _client()
    for source in sorted(sources, key=lambda s: Version(s.version)):
        public = str(Version(source.version).public)
        with tempfile.TemporaryDirectory(prefix="sparkmods-adopt-") as tmp:
            tree = release_tree(source, Path(tmp))
            ran = run_mod(mod.path, tree, image, timeout, client, keep=True)
            symlinks = [p for op, p in ran.changed if op != "deleted" and p not in ran.after]
            patch = _run_patch(tree, ran) if ran.status == APPLIED and not symlinks else ""
        if patch:
            yield public, patch, ran.status, ""
        else:
            yield public, None, ran.status, f"wrote symbolic links {', '.join(symlinks)}" if symlinks else ran.reason(timeout)


def plan_adoption_by_running(mod: CommunityMod, name: str, sources: Sequence, image: str,
                             timeout: float) -> Adopted:
    """The variants for a mod judged by running it (sandbox.py): on each version where the run
    changed only vllm/ files and exited 0, its patch is what the run wrote; consecutive versions
    whose patches differ only in line numbers share a variant."""
    adopted = _grouped(name, _ran(mod, sources, image, timeout), key=_shape)
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
