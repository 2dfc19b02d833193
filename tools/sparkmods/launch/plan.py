"""A recipe plus the user's launch choices, resolved into one LaunchPlan both script forms render.

Resolving happens once, here: placeholder values (recipe defaults, then --set), the parallelism
the node count calls for, the serve command parsed into an argv, the mods as absolute folders.
Validation (rules.py) and rendering (cluster.py, standalone.py) only read the plan.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from sparkmods.errors import SparkmodsError
from sparkmods.launch.prdiff import PrDiff, read_pr_diff
from sparkmods.launch.recipe import Recipe, Scalar, find_repo_root, format_value, placeholders
from sparkmods.launch.servecmd import ServeCommand, ServeCommandError
from sparkmods.modsdir import mods_root

__all__ = ["LaunchOptions", "LaunchPlan", "build_plan", "CLUSTER", "STANDALONE"]

CLUSTER, STANDALONE = "launch-cluster", "standalone"
TP_KEY = "tensor_parallel"
_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.:-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class LaunchOptions:
    """What the command line chose (see commands/launch.py for the flags)."""

    nodes: Tuple[str, ...] = ()  # empty: --solo
    ray: bool = True
    form: str = CLUSTER
    image: Optional[str] = None
    sets: Tuple[Tuple[str, str], ...] = ()
    pass_env: Tuple[str, ...] = ("HF_TOKEN",)
    gpus_per_node: int = 1
    vllm_prs: Tuple[Path, ...] = ()  # PR diffs the launcher also applies (--vllm-pr)


@dataclass
class LaunchPlan:
    recipe: Recipe
    root: Path
    form: str
    image: str
    nodes: Tuple[str, ...]
    ray: bool
    serve: ServeCommand
    env: Dict[str, str]
    pass_env: Tuple[str, ...]
    mod_dirs: List[Path]
    gpus_per_node: int
    vllm_prs: Tuple[PrDiff, ...] = ()

    @property
    def solo(self) -> bool:
        return not self.nodes

    @property
    def node_count(self) -> int:
        return max(1, len(self.nodes))

    @property
    def mode(self) -> str:
        """solo, ray or no-ray: the three launch shapes."""
        return "solo" if self.solo else ("ray" if self.ray else "no-ray")


def _parse_sets(recipe: Recipe, sets: Sequence[Tuple[str, str]]) -> Dict[str, str]:
    known = placeholders(recipe.command)
    out: Dict[str, str] = {}
    for key, value in sets:
        if key not in known:
            raise SparkmodsError(f"--set {key}=...: {recipe.path.name} has no {{{key}}} placeholder "
                                 f"(it has: {', '.join(known) or 'none'})")
        out[key] = value
    return out


def _check_nodes(nodes: Sequence[str]) -> None:
    for node in nodes:
        if not _NODE.match(node):
            raise SparkmodsError(f"--nodes: {node!r} is not an IP address or host name")
    if len(set(nodes)) != len(nodes):
        raise SparkmodsError(f"--nodes: {','.join(nodes)} lists a node twice")
    if len(nodes) == 1:
        raise SparkmodsError("--nodes: one node is a solo launch: use --solo")


def build_plan(recipe: Recipe, opts: LaunchOptions, root: Optional[Path] = None,
               mods_dir: Optional[Path] = None) -> LaunchPlan:
    """Resolve everything the scripts need; bad input raises SparkmodsError (one line).

    root is the recipe repository that `mods/...` paths are relative to (default: found).
    mods_dir (--mods-dir) is where `mods/<name>` entries live instead; without it, a recipe
    with no `mods/` folder above it uses the collection's (see modsdir.mods_root).
    """
    _check_nodes(opts.nodes)
    for name in opts.pass_env:
        if not _ENV_NAME.match(name):
            raise SparkmodsError(f"--pass-env: {name!r} is not an environment variable name")
    repo = root or find_repo_root(recipe.path)
    mods = mods_dir
    if mods is None and recipe.mods and not (repo / "mods").is_dir():
        mods = mods_root()  # a recipe kept outside any collection (~/my.yaml): the collection's mods
    values: Dict[str, Scalar] = dict(recipe.defaults)
    sets = _parse_sets(recipe, opts.sets)
    if TP_KEY in values and TP_KEY not in sets:
        # run-recipe.sh forces tp=1 for solo; across nodes we default to one rank per GPU.
        values[TP_KEY] = max(1, len(opts.nodes)) * opts.gpus_per_node
    values.update(sets)
    try:
        serve = ServeCommand.parse(recipe.command, {k: format_value(v) for k, v in values.items()})
    except ServeCommandError as exc:
        raise SparkmodsError(f"{recipe.path}: {exc}") from None
    return LaunchPlan(
        recipe=recipe, root=repo, form=opts.form, image=opts.image or recipe.container,
        nodes=tuple(opts.nodes), ray=bool(opts.nodes) and opts.ray, serve=serve,
        env=recipe.env_map, pass_env=tuple(dict.fromkeys(opts.pass_env)), mod_dirs=recipe.mod_dirs(repo, mods),
        gpus_per_node=opts.gpus_per_node, vllm_prs=tuple(read_pr_diff(p) for p in opts.vllm_prs),
    )


def describe(plan: LaunchPlan) -> Mapping[str, object]:
    """The plan as plain data, for --json."""
    return {
        "recipe": str(plan.recipe.path), "name": plan.recipe.name, "form": plan.form, "image": plan.image,
        "mode": plan.mode, "nodes": list(plan.nodes), "mods": [str(p) for p in plan.mod_dirs],
        "env": sorted(plan.env), "pass_env": list(plan.pass_env), "serve": plan.serve.argv(),
    }
