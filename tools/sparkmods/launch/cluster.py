"""The launch script that drives eugr's launch-cluster.sh.

launch-cluster.sh starts the containers, applies each `--apply-mod` (head first, then workers),
copies `--launch-script` into the head container and runs it; in no-Ray mode it appends the
per-node rank flags to the LAST line, so our serve command is one line and the last one. In the
foreground (no `-d`) it stops the containers itself on exit or Ctrl-C, which is what makes the
script leave nothing behind; we stop any earlier cluster first so a re-run starts clean.
"""

from __future__ import annotations

from typing import List, Sequence

from sparkmods.launch.plan import LaunchPlan
from sparkmods.launch.shell import array, assign, header, q

__all__ = ["render_cluster", "node_args"]

_BODY = r'''
if [[ "$launch_cluster" != */* ]]; then
    launch_cluster=$(command -v -- "$launch_cluster") || launch_cluster=""
fi
if [[ -z "$launch_cluster" || ! -x "$launch_cluster" ]]; then
    echo "sparkmods-launch: error: launch-cluster.sh not found; set SPARKMODS_LAUNCH_CLUSTER to its path" >&2
    exit 2
fi

serve_script=""
cleanup() {
    trap - EXIT INT TERM HUP
    if [[ -n "$serve_script" ]]; then rm -f -- "$serve_script"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

serve_script=$(mktemp "${TMPDIR:-/tmp}/sparkmods-serve.XXXXXX")
printf '%s\n' "${serve_lines[@]}" >"$serve_script"

args=("${node_args[@]}" -t "$image")
for mod in "${mods[@]}"; do
    args+=(--apply-mod "$mod")
done
for kv in "${env_args[@]}"; do
    args+=(-e "$kv")
done
# Secrets go by name: docker reads their values from the environment, this file never holds them.
for name in "${pass_env[@]}"; do
    if [[ -n "${!name:-}" ]]; then
        args+=(-e "$name")
    fi
done
args+=(--launch-script "$serve_script")

echo "sparkmods-launch: stopping any earlier cluster" >&2
"$launch_cluster" "${node_args[@]}" -t "$image" stop || true
# Foreground: launch-cluster.sh stops the containers itself when vllm serve ends or on Ctrl-C.
"$launch_cluster" "${args[@]}"
'''


def node_args(plan: LaunchPlan) -> List[str]:
    if plan.solo:
        return ["--solo"]
    return ["-n", ",".join(plan.nodes), "--ray" if plan.ray else "--no-ray"]


def render_cluster(plan: LaunchPlan, launcher: str, about: Sequence[str]) -> str:
    """The whole script; `launcher` is launch-cluster.sh's path (SPARKMODS_LAUNCH_CLUSTER overrides it)."""
    serve_lines = ["#!/bin/bash", plan.serve.line()]
    lines = header(about) + [
        f"launch_cluster=${{SPARKMODS_LAUNCH_CLUSTER:-{q(launcher)}}}",
        assign("image", plan.image),
        array("node_args", node_args(plan)),
        array("mods", [str(p) for p in plan.mod_dirs], per_line=1),
        array("env_args", [f"{k}={v}" for k, v in plan.env.items()], per_line=1),
        array("pass_env", plan.pass_env),
        "# The launch script run in the head container: vllm serve is its last line.",
        array("serve_lines", serve_lines, per_line=1),
    ]
    return "\n".join(lines) + "\n" + _BODY
