"""`sparkmods recipe check [RECIPE ...]`: the recipe schema check, for CI and recipe authors.

Checks what holds for any launch: the v1 schema, known mods, every placeholder defined, a
command that is one `vllm serve`, and the target-independent rules (JSON flags, launcher-owned
flags, prefix caching on hybrid Qwen3.5, secrets). With --vllm it also runs the target rules
and the mod check against that vLLM, as `sparkmods launch` would.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List, Optional

from sparkmods.errors import SparkmodsError
from sparkmods.launch.plan import LaunchOptions, build_plan
from sparkmods.launch.recipe import load_recipe
from sparkmods.launch.rules import ERROR, Problem, validate
from sparkmods.launch.target import TargetFacts
from sparkmods.launch.target_open import check_with_engine

_REPO_RECIPES = Path(__file__).resolve().parents[3] / "launch" / "recipes"
# Placeholder addresses for checking cluster_only recipes; never written anywhere.
_CHECK_NODES = ("192.0.2.1", "192.0.2.2")


def register(sub: "argparse._SubParsersAction") -> None:
    p = sub.add_parser("recipe", help="recipe tools (run-recipe.sh v1 YAML)")
    rsub = p.add_subparsers(dest="recipe_command", metavar="ACTION")
    rsub.required = True
    c = rsub.add_parser("check", help="schema-check recipes (default: launch/recipes/*.yaml)")
    c.add_argument("recipes", nargs="*", metavar="RECIPE")
    c.add_argument("--vllm", metavar="SPEC", help="also check mods and target rules against this one vLLM")
    c.add_argument("--index-url", help="package index for --vllm")
    c.add_argument("--offline", action="store_true", help="read --vllm from the on-disk cache only")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=run_check)


def default_recipes() -> List[Path]:
    for folder in (Path.cwd() / "launch" / "recipes", _REPO_RECIPES):
        found = sorted(folder.glob("*.yaml"))
        if found:
            return found
    raise SparkmodsError("no recipes given and none found in ./launch/recipes")


def _open(args: argparse.Namespace) -> Optional[TargetFacts]:
    if not args.vllm:
        return None
    from sparkmods.sources import open_targets

    sources = open_targets(args.vllm, index_url=args.index_url, offline=args.offline)
    if len(sources) != 1:
        raise SparkmodsError(f"--vllm {args.vllm!r} names {len(sources)} vLLM releases; name exactly one")
    return TargetFacts(sources[0])


def check_one(path: Path, facts: Optional[TargetFacts]) -> List[Problem]:
    """The recipe's problems; a schema error is one problem, not an exception."""
    try:
        recipe = load_recipe(path)
        opts = LaunchOptions(nodes=_CHECK_NODES) if recipe.cluster_only else LaunchOptions()
        plan = build_plan(recipe, opts)
    except SparkmodsError as exc:
        return [Problem("schema", str(exc).replace(f"{path}: ", "", 1))]
    return validate(plan, facts, check_with_engine if facts else None).problems


def run_check(args: argparse.Namespace) -> int:
    paths = [Path(p) for p in args.recipes] or default_recipes()
    facts = _open(args)
    report = {str(p): check_one(p, facts) for p in paths}
    bad = sum(1 for problems in report.values() if any(p.severity == ERROR for p in problems))
    if args.json:
        doc = {"target": facts.label if facts else None,
               "recipes": {k: [p.to_dict() for p in v] for k, v in report.items()}}
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for path, problems in report.items():
            for problem in problems:
                print(f"{path}: {problem}")
        print(f"{len(paths)} recipes checked, {len(paths) - bad} ok, {bad} with errors")
    return 1 if bad else 0
