"""The launch script that drives eugr's launch-cluster.sh.

launch-cluster.sh starts the containers, applies each `--apply-mod` (head first, then workers),
copies `--launch-script` into the head container and runs it; in no-Ray mode it appends the
per-node rank flags to the LAST line, so our serve command is one line and the last one. In the
foreground (no `-d`) it stops the containers itself on exit or Ctrl-C, which is what makes the
script leave nothing behind.

The launcher is updated (`git pull`) independently of the scripts we write, and its options
differ between versions: some have `--ray` and `--no-ray` (no-Ray the multi-node default),
some only `--no-ray` (Ray the default), some neither (several nodes always meant Ray) and stop
on either as an unknown argument. So the script asks the launcher when it runs: it reads the
usage text `launch-cluster.sh --help` prints and passes only options listed there, or stops
before starting anything, naming what to update. The usage text rather than a grep of the
script's option parser, because it is the launcher's documented interface (it lists exactly
the options its parser takes in every version we know), it works through a wrapper or a
symlink, and it does not depend on how the `case` arms are spelled. `--help` is safe to run:
every version handles it while parsing, before reading .env or touching docker or ssh.

Containers are named (`--name`, SPARKMODS_CONTAINER, default `sparkmods-<recipe>`): the script
stops that cluster first, so every run starts fresh containers (the launcher runs them with
`--rm`) and the mods are applied to an unmodified vLLM each time; a cluster started under the
launcher's default name is left alone.
"""

from __future__ import annotations

from typing import Sequence

from sparkmods.launch.plan import LaunchPlan
from sparkmods.launch.shell import array, assign, header, q
from sparkmods.launch.standalone import container_prefix

__all__ = ["render_cluster"]

_BODY = r'''
container=${SPARKMODS_CONTAINER:-$container}
if [[ "$launch_cluster" != */* ]]; then
    launch_cluster=$(command -v -- "$launch_cluster") || launch_cluster=""
fi
if [[ -z "$launch_cluster" || ! -x "$launch_cluster" ]]; then
    echo "sparkmods-launch: error: launch-cluster.sh not found; set SPARKMODS_LAUNCH_CLUSTER to its path" >&2
    exit 2
fi

# What this launcher understands, from the usage text it prints (with exit status 1) for --help.
usage_text=$("$launch_cluster" --help </dev/null 2>&1 || true)
offers() { grep -Eq -- "(^|[^[:alnum:]-])$1([^[:alnum:]-]|\$)" <<<"$usage_text"; }
missing=()
need() { offers "$1" || missing+=("$1"); }
need --apply-mod
need --launch-script
need -e
need --name
node_args=()
hint=""
case $mode in
    solo)
        need --solo
        node_args=(--solo) ;;
    ray)
        need -n
        node_args=(-n "$node_list")
        # A launcher without --ray runs several nodes with Ray: nothing to pass then.
        if offers --ray; then node_args+=(--ray); fi ;;
    no-ray)
        need -n
        need --no-ray
        node_args=(-n "$node_list" --no-ray)
        hint=", or write the script again with --ray" ;;
esac
if [[ ${#missing[@]} -gt 0 ]]; then
    echo "sparkmods-launch: error: $launch_cluster does not offer ${missing[*]} (not in its --help):" \
        "update it (git pull in its folder)$hint; nothing was started" >&2
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

args=("${node_args[@]}" --name "$container" -t "$image")
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

echo "sparkmods-launch: stopping the cluster an earlier run left ($container)" >&2
"$launch_cluster" "${node_args[@]}" --name "$container" -t "$image" stop || true
# Foreground: launch-cluster.sh stops the containers itself when vllm serve ends or on Ctrl-C.
"$launch_cluster" "${args[@]}"
'''


def render_cluster(plan: LaunchPlan, launcher: str, about: Sequence[str]) -> str:
    """The whole script; `launcher` is launch-cluster.sh's path (SPARKMODS_LAUNCH_CLUSTER overrides it)."""
    serve_lines = ["#!/bin/bash", plan.serve.line()]
    lines = header(about) + [
        f"launch_cluster=${{SPARKMODS_LAUNCH_CLUSTER:-{q(launcher)}}}",
        assign("image", plan.image),
        assign("container", container_prefix(plan)),
        "# solo, ray or no-ray; the launcher flags for it are chosen when the script runs.",
        assign("mode", plan.mode),
        assign("node_list", ",".join(plan.nodes)),
        array("mods", [str(p) for p in plan.mod_dirs], per_line=1),
        array("env_args", [f"{k}={v}" for k, v in plan.env.items()], per_line=1),
        array("pass_env", plan.pass_env),
        "# The launch script run in the head container: vllm serve is its last line.",
        array("serve_lines", serve_lines, per_line=1),
    ]
    return "\n".join(lines) + "\n" + _BODY
