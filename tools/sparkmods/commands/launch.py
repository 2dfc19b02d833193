"""`sparkmods launch RECIPE`: validate a recipe for a node layout, then write its launch script.

Nothing is written unless every check passes: mods against the image's vLLM (same engine as
`sparkmods check`), known-bad flag combinations, shell safety. Each problem is one line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, List, Tuple

from sparkmods.commands import help_for
from sparkmods.errors import SparkmodsError
from sparkmods.sources.options import add_cache_arg, add_target_args

if TYPE_CHECKING:  # imported when a launch is planned, not when the command line is parsed
    from sparkmods.launch.plan import LaunchOptions


def register(sub: "argparse._SubParsersAction") -> None:
    p = sub.add_parser(
        "launch", help=help_for("launch"),
        description="Write an executable bash script that launches RECIPE on one node (--solo) or several "
                    "(--nodes, Ray by default), after checking its mods and flags against the image's vLLM.")
    p.add_argument("recipe", metavar="RECIPE", help="a run-recipe.sh v1 YAML file")
    layout = p.add_mutually_exclusive_group(required=True)
    layout.add_argument("--solo", action="store_true", help="one node")
    layout.add_argument("--nodes", metavar="IP1,IP2", help="comma-separated node addresses, head first")
    ray = p.add_mutually_exclusive_group()
    ray.add_argument("--ray", dest="ray", action="store_true", default=None, help="multi-node over Ray (default)")
    ray.add_argument("--no-ray", dest="ray", action="store_false", help="multi-node with vLLM's own ranks")
    p.add_argument("--standalone", action="store_true",
                   help="a script that needs only docker and ssh instead of launch-cluster.sh")
    p.add_argument("--image", help="container image (default: the recipe's container)")
    add_target_args(p, default=None)
    add_cache_arg(p)
    p.add_argument("--mods-dir", metavar="DIR",
                   help="where the recipe's mods/<name> folders are (default: the mods/ folder above the "
                        "recipe, else $SPARKMODS_MODS_DIR, ./mods or this collection's)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a placeholder of the recipe's command (repeatable)")
    p.add_argument("--pass-env", action="append", default=[], metavar="NAME",
                   help="environment variable handed to the containers by name when set, never written "
                        "into the script (repeatable; HF_TOKEN always is)")
    p.add_argument("--launch-cluster", metavar="PATH",
                   help="launch-cluster.sh to call (default: on PATH, else beside the recipe repository)")
    p.add_argument("--gpus-per-node", type=int, default=1, metavar="N", help="GPUs per node (DGX Spark: 1)")
    p.add_argument("--vllm-pr", action="append", default=[], metavar="FILE",
                   help="a pull request's diff the launcher also applies (its --apply-vllm-pr; save "
                        "https://github.com/vllm-project/vllm/pull/N.diff): refused where it and a mod of the "
                        "recipe change the same file and cannot both apply (repeatable; not passed on)")
    p.add_argument("-o", "--output", metavar="FILE", help="script to write (default: standard output)")
    p.add_argument("--json", action="store_true", help="print the plan, checks and problems as JSON")
    p.set_defaults(func=run_launch)


def _sets(pairs: List[str]) -> Tuple[Tuple[str, str], ...]:
    out = []
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise SparkmodsError(f"--set {pair!r}: want KEY=VALUE")
        if any(c in value for c in "\n\r"):
            raise SparkmodsError(f"--set {key}: the value holds a line break; a value is one line of text")
        out.append((key, value))
    return tuple(out)


def options_from(args: argparse.Namespace) -> "LaunchOptions":
    from sparkmods.launch.plan import CLUSTER, STANDALONE, LaunchOptions

    nodes = tuple(n.strip() for n in args.nodes.split(",")) if args.nodes else ()
    if args.solo and args.ray is not None:
        raise SparkmodsError("--ray/--no-ray need --nodes: a solo launch has no cluster backend")
    if args.gpus_per_node < 1:
        raise SparkmodsError("--gpus-per-node must be at least 1")
    return LaunchOptions(
        nodes=nodes, ray=True if args.ray is None else args.ray, form=STANDALONE if args.standalone else CLUSTER,
        image=args.image, sets=_sets(args.sets),
        pass_env=("HF_TOKEN", *args.pass_env),
        gpus_per_node=args.gpus_per_node, vllm_prs=tuple(Path(p) for p in args.vllm_pr),
    )


def run_launch(args: argparse.Namespace) -> int:
    from sparkmods.checking import resultcache
    from sparkmods.launch.pervllm import validate_on
    from sparkmods.launch.plan import STANDALONE, build_plan, describe
    from sparkmods.launch.recipe import load_recipe
    from sparkmods.launch.render import about, find_launcher, named_launcher, render, write_script
    from sparkmods.launch.vllmfacts import VllmFacts
    from sparkmods.launch.vllmopen import check_with_engine, open_launch_targets
    from sparkmods.modsdir import mods_root
    from sparkmods.outputfile import check_target

    if args.output:  # before any check: a script that can never be written is no reason to fetch
        check_target(Path(args.output).expanduser(), "-o")
    if args.launch_cluster and not args.standalone:
        named_launcher(args.launch_cluster)
    resultcache.start(reuse=not args.no_cache)
    path = Path(args.recipe)
    plan = build_plan(load_recipe(path), options_from(args), mods_dir=mods_root(args.mods_dir) if args.mods_dir else None)
    sources = open_launch_targets(plan.image, args.vllm or [], index_url=args.index_url, offline=args.offline)
    checked = validate_on(plan, [VllmFacts(s) for s in sources], check_with_engine)
    text = None
    if not checked.errors:
        launcher = None if plan.form == STANDALONE else find_launcher(args.launch_cluster, plan.root)
        text = render(plan, about(plan, checked.checked), launcher)
        if args.output:
            write_script(text, Path(args.output))
    if args.json:
        doc = {"plan": describe(plan), "target": "; ".join(label for label, _ in checked.checked),
               "mods": [r.to_dict() for _, results in checked.checked for r in results],
               "problems": [f.to_dict() for f in checked.findings], "output": args.output}
        if text is not None and not args.output:
            doc["script"] = text
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for finding in checked.findings:
            print(f"{path.name}: {finding}", file=sys.stderr)
        if text is not None and not args.output:
            sys.stdout.write(text)
    return 1 if checked.errors else 0
