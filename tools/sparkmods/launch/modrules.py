"""Rules about the recipe's mods: they apply to the target, they are synced, they install what
the command uses.
"""

from __future__ import annotations

from typing import Iterator, Optional

from sparkmods.errors import SparkmodsError
from sparkmods.launch.problem import WARNING, Context, Problem
from sparkmods.runtime.manifest import MANIFEST_TOML, ManifestError, Variant, load_manifest
from sparkmods.runtime.modcheck import BASE_ENV, BaseMismatch, check_mod
from sparkmods.sync import stale_files

__all__ = ["RULES"]


def mods(ctx: Context) -> Iterator[Problem]:
    for result in ctx.mod_results:
        if not result.green:
            why = f": {result.reason}" if result.reason else ""
            variant = f" (variant {result.variant})" if result.variant else ""
            yield Problem("mods", f"mod {result.mod} is {result.status} on {ctx.where}{variant}{why}")
    checked = {r.mod for r in ctx.mod_results}
    for folder in ctx.plan.mod_dirs if ctx.facts is not None else ():
        if not (folder / MANIFEST_TOML).is_file() and folder.name not in checked:
            yield Problem("mods", f"mod {folder} has no {MANIFEST_TOML}: it cannot be checked against "
                                  f"{ctx.where}", WARNING)


def mod_files(ctx: Context) -> Iterator[Problem]:
    """The folder the launcher copies must carry an up-to-date generated run.sh and runtime."""
    for folder in ctx.plan.mod_dirs:
        if not (folder / MANIFEST_TOML).is_file():
            continue
        try:
            found = stale_files(folder)
        except SparkmodsError as exc:
            yield Problem("mod-files", str(exc))
            continue
        if found:
            more = f" (+{len(found) - 2} more)" if len(found) > 2 else ""
            yield Problem("mod-files", f"mod {folder.name} is not synced ({'; '.join(found[:2])}{more}): "
                                       f"run `sparkmods sync {folder}`")


def _workspace_files(ctx: Context) -> Optional[set]:
    """Names the recipe's mods install into $WORKSPACE_DIR on the target; None if unknown."""
    if ctx.facts is None:
        return None
    names = set()
    results = {r.mod: r for r in ctx.mod_results}
    for folder in ctx.plan.mod_dirs:
        if not (folder / MANIFEST_TOML).is_file():
            return None
        try:
            manifest = load_manifest(folder)
            result = results.get(manifest.name)
            # the variant the check chose (by content for a non-release build), else the version's
            chosen = (next((v for v in manifest.variants if v.label == result.variant), None) if result is not None
                      else manifest.select(ctx.facts.source.version))
        except (ManifestError, ValueError):
            return None
        if isinstance(chosen, Variant):
            names |= {inst.name for inst in chosen.install}
    return names


def chat_template(ctx: Context) -> Iterator[Problem]:
    name = ctx.plan.serve.get("--chat-template")
    if name is None or "/" in name or "{" in name:
        return  # an absolute/relative path or inline template: not ours to resolve
    installed = _workspace_files(ctx)
    if installed is not None and name not in installed:
        yield Problem("chat-template", f"--chat-template {name}: no mod of the recipe installs {name!r} on "
                                       f"{ctx.where} (installed: {', '.join(sorted(installed)) or 'nothing'})")


def vllm_base(ctx: Context) -> Iterator[Problem]:
    """The recipe's env names the release the build is based on (run.sh reads it): on the
    target, every mod's variant for that release must apply, or run.sh stops there."""
    base = ctx.plan.env.get(BASE_ENV)
    if base is None or ctx.facts is None:
        return
    for folder in ctx.plan.mod_dirs:
        if not (folder / MANIFEST_TOML).is_file():
            continue
        try:
            check_mod(load_manifest(folder), folder, ctx.facts.source.version, ctx.facts.source.read, base)
        except BaseMismatch as exc:
            yield Problem("vllm-base", f"mod {folder.name} on {ctx.where}: {exc}")
        except ManifestError:
            continue  # the mods rule reports it


RULES = (mods, mod_files, chat_template, vllm_base)
