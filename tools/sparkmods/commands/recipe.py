"""`sparkmods recipe check [RECIPE ...]`: the recipe schema check, for CI and recipe authors;
`sparkmods recipe sparkrun [--check]`: the recipes' sparkrun twins (launch/sparkrun/).

Checks what holds for any launch: the v1 schema, known mods, every placeholder defined, a
command that is one `vllm serve`, and the target-independent rules (JSON flags, launcher-owned
flags, prefix caching on hybrid Qwen3.5, secrets). With --vllm it also runs the target rules
and the mod check against every vLLM named (repeatable), as `sparkmods launch` would.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Sequence

from sparkmods.commands import help_for
from sparkmods.errors import SparkmodsError
from sparkmods.outputfile import write_atomic
from sparkmods.sources.options import add_cache_arg, add_target_args

if TYPE_CHECKING:  # imported when a recipe is checked, not when the command line is parsed
    from sparkmods.launch.pervllm import TargetProblem
    from sparkmods.launch.vllmfacts import VllmFacts

_REPO_RECIPES = Path(__file__).resolve().parents[3] / "launch" / "recipes"
# Placeholder addresses for checking cluster_only recipes; never written anywhere.
_CHECK_NODES = ("192.0.2.1", "192.0.2.2")


def register(sub: "argparse._SubParsersAction") -> None:
    p = sub.add_parser("recipe", help=help_for("recipe"))
    rsub = p.add_subparsers(dest="recipe_command", metavar="ACTION")
    rsub.required = True
    c = rsub.add_parser("check", help="schema-check recipes (default: launch/recipes/*.yaml)")
    c.add_argument("recipes", nargs="*", metavar="RECIPE")
    c.add_argument("--mods-dir", metavar="DIR",
                   help="where the recipes' mods/<name> folders are (default: the mods/ folder above each "
                        "recipe, else $SPARKMODS_MODS_DIR, ./mods or this collection's)")
    c.add_argument("--json", action="store_true")
    add_target_args(c, default=None)  # with --vllm: also the mods and target rules on every vLLM named
    add_cache_arg(c)
    c.set_defaults(func=run_check)
    s = rsub.add_parser("sparkrun", help="write launch/sparkrun/ (the recipes in sparkrun's format) from launch/recipes/")
    s.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 when a file there is missing, stale or has no source recipe")
    s.set_defaults(func=run_sparkrun)


def default_recipes() -> List[Path]:
    for folder in (Path.cwd() / "launch" / "recipes", _REPO_RECIPES):
        found = sorted(folder.glob("*.yaml"))
        if found:
            return found
    raise SparkmodsError("no recipes given and none found in ./launch/recipes")


def check_one(path: Path, targets: Sequence["VllmFacts"], mods_dir: Optional[Path]) -> List["TargetProblem"]:
    """The recipe's problems on every target; a schema error is one problem, not an exception."""
    from sparkmods.launch.pervllm import TargetProblem, validate_on
    from sparkmods.launch.plan import LaunchOptions, build_plan
    from sparkmods.launch.recipe import load_recipe
    from sparkmods.launch.rules import Problem
    from sparkmods.launch.vllmopen import check_with_engine

    try:
        recipe = load_recipe(path)
        opts = LaunchOptions(nodes=_CHECK_NODES) if recipe.cluster_only else LaunchOptions()
        plan = build_plan(recipe, opts, mods_dir=mods_dir)
    except SparkmodsError as exc:
        return [TargetProblem(Problem("schema", str(exc).replace(f"{path}: ", "", 1)))]
    return validate_on(plan, targets, check_with_engine).findings


def run_check(args: argparse.Namespace) -> int:
    from sparkmods.checking import resultcache
    from sparkmods.launch.rules import ERROR
    from sparkmods.launch.vllmfacts import VllmFacts
    from sparkmods.modsdir import mods_root
    from sparkmods.sources.options import open_sources

    resultcache.start(reuse=not args.no_cache)
    paths = [Path(p) for p in args.recipes] or default_recipes()
    for path in paths:  # what names no recipe at all is bad input (exit 2), not a finding
        if not path.is_file():
            raise SparkmodsError(f"{path}: {'not a regular file' if path.exists() else 'no such file'}; "
                                 "name a recipe (.yaml)")
    targets = [VllmFacts(s) for s in open_sources(args)]
    mods_dir = mods_root(args.mods_dir) if args.mods_dir else None
    report = {str(p): check_one(p, targets, mods_dir) for p in paths}
    bad = sum(1 for findings in report.values() if any(f.problem.severity == ERROR for f in findings))
    if args.json:
        doc = {"targets": [t.label for t in targets],
               "recipes": {k: [f.to_dict() for f in v] for k, v in report.items()}}
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for name, problems in report.items():
            for problem in problems:
                print(f"{name}: {problem}")
        on = f" on {len(targets)} vLLMs" if len(targets) > 1 else ""
        print(f"{len(paths)} recipes checked{on}, {len(paths) - bad} ok, {bad} with errors")
    return 1 if bad else 0


def run_sparkrun(args: argparse.Namespace) -> int:
    """Generate (or, with --check, compare) the sparkrun twin of every recipe in launch/recipes/."""
    from sparkmods.launch.sparkrun import SPARKRUN_DIR, plan_twins

    sources = default_recipes()
    root = sources[0].parents[2]
    out_dir = root / SPARKRUN_DIR
    twins = plan_twins(sources, out_dir)
    wanted = {t.path.name for t in twins}
    extra = sorted(p for p in out_dir.glob("*.yaml") if p.name not in wanted) if out_dir.is_dir() else []
    stale = [t for t in twins if not t.path.is_file() or t.path.read_text(encoding="utf-8") != t.text]
    if args.check:
        for twin in stale:
            print(f"{twin.path}: {'stale' if twin.path.exists() else 'missing'}: run `sparkmods recipe sparkrun`")
        for path in extra:
            print(f"{path}: no recipe {path.name} in {sources[0].parent}: delete it or add the recipe")
        print(f"{len(twins)} sparkrun recipes, {len(stale)} to write, {len(extra)} without a source")
        return 1 if stale or extra else 0
    out_dir.mkdir(exist_ok=True)
    for twin in stale:
        write_atomic(twin.path, twin.text)
    for path in extra:
        path.unlink()
    print(f"{len(twins)} sparkrun recipes in {out_dir}: {len(stale)} written, {len(extra)} removed")
    return 0
