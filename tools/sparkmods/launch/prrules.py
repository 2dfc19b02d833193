"""Pull-request diffs beside the recipe's mods (`sparkmods launch --vllm-pr FILE`).

launch-cluster.sh's `--apply-vllm-pr N|URL` downloads a PR's diff, keeps its files under
vllm/ and applies it with `git apply --binary`, in command-line order with `--apply-mod`. When
a PR and a mod change the same file, whichever comes second meets a file the first changed. On a
target we decide it: the PR's change is made to that file in memory and the mod's own decision
runs on the result; a mod that still applies there is a warning (the PR must come first), one
that does not is an error. Without a target it is a warning for every variant's files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

from sparkmods.gitdiff import plan_changes
from sparkmods.launch.prdiff import PrDiff
from sparkmods.launch.problem import WARNING, Context, Problem
from sparkmods.runtime.engine import OK, OK_OFFSET
from sparkmods.runtime.manifest import MANIFEST_TOML, ManifestError, load_manifest
from sparkmods.runtime.modcheck import check_mod, mod_inputs

__all__ = ["RULES"]


def _every_variant(folder: Path) -> List[str]:
    """What any variant of the mod may change (no target: nothing chooses among them)."""
    return mod_inputs(load_manifest(folder), folder, "0.1.dev0").paths()  # no release: every variant


def pr_overlap(ctx: Context) -> Iterator[Problem]:
    results = {r.mod: r for r in ctx.mod_results}
    for folder in ctx.plan.mod_dirs:
        if not (folder / MANIFEST_TOML).is_file():
            continue
        result = results.get(folder.name)
        for pr in ctx.plan.vllm_prs:
            try:
                mine = [f.path for f in result.files] if result is not None else _every_variant(folder)
            except ManifestError:
                return  # the mods rule reports a broken mod
            shared = sorted(set(mine) & set(pr.files))
            if not shared:
                continue
            where = f"mod {folder.name} and {pr.path.name} both change {shared[0]}"
            if result is None or ctx.facts is None or not result.green:
                yield Problem("vllm-pr", f"{where}: the launcher applies them in command-line order, so the "
                                         "second meets the file the first changed", WARNING)
                continue
            source = ctx.facts.source
            after = _after_pr(pr, shared, source.read)
            if after is None:
                yield Problem("vllm-pr", f"{where}, and {pr.path.name} does not apply to {ctx.where} "
                                         f"(sparkmods check-patch {pr.path} says why)")
                continue
            manifest = load_manifest(folder)
            decided = check_mod(manifest, folder, source.version,
                                lambda rel: after[rel] if rel in after else source.read(rel))  # noqa: B023 - used in this iteration only
            if decided.green:
                yield Problem("vllm-pr", f"{where}: the mod still applies after the PR (variant "
                                         f"{decided.variant}), so pass --apply-vllm-pr before --apply-mod", WARNING)
            else:
                yield Problem("vllm-pr", f"{where}: after the PR the mod is {decided.status} on {ctx.where}, and "
                                         "before it the PR would not apply; drop one, or rebase the mod onto the PR")


def _after_pr(pr: PrDiff, shared: List[str], read: Callable[[str], Optional[bytes]]) -> Optional[Dict[str, Optional[bytes]]]:
    """The shared files as the PR leaves them (None: the PR does not apply to them)."""
    out: Dict[str, Optional[bytes]] = {}
    for change in (c for c in pr.changes if set(c.paths) & set(shared)):
        planned = plan_changes([change], read)
        if not planned:
            continue  # a mode change alone
        if planned[0].status not in (OK, OK_OFFSET):
            return None
        if change.old_path is not None and (change.rename or change.new_path is None):
            out[change.old_path] = None
        if change.new_path is not None and change.patch is not None:
            out[change.new_path] = planned[0].after
        elif change.new_path is not None:  # renamed without hunks, or binary: the bytes it starts from
            out[change.new_path] = read(change.old_path) if change.old_path is not None else None
    return out


RULES = (pr_overlap,)
