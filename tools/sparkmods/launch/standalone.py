"""The standalone launch script: needs only docker on every node and ssh from the head to workers.

It does by itself what launch-cluster.sh would do, following the same mod contract: start one
container per node (head first), copy each mod to /workspace/mods/<name> (workers get `dir/*`,
so top-level dotfiles stay behind, as with launch-cluster.sh's scp), run its run.sh as root
with WORKSPACE_DIR set, form the Ray cluster (head, then workers) or the no-Ray ranks, and run
vllm serve on the head in the foreground. Any exit - failure, Ctrl-C, vllm serve ending -
removes every container it started; a re-run first removes what an earlier run left.

Environment and secrets reach the containers through `docker run --env-file /dev/stdin`, so
values are never split, never on a command line, and never written into the script.

Node access: the script runs on the head; other nodes are reached with `ssh` (SPARKMODS_SSH),
whose remote command is quoted for any POSIX login shell there (dash included), not bash only.
For tests without real machines, SPARKMODS_DOCKER_NETWORK=NET makes every node a container on
the local Docker network NET whose address is the node's IP (no ssh): a stand-in, not production.
"""

from __future__ import annotations

import re
import string
from typing import List, Sequence

from sparkmods.launch.nodewords import (
    FOLLOWER,
    NODE_ENV,
    RANK_FLAGS,
    RAY_ALIVE_NODES,
    RAY_EXECUTOR,
    RAY_HEAD,
    RAY_WORKER,
)
from sparkmods.launch.plan import LaunchPlan
from sparkmods.launch.shell import array, assign, header, q, rows

__all__ = ["render_standalone", "serve_argv", "container_prefix", "RAY_PORT", "MASTER_PORT"]

RAY_PORT = 6379
MASTER_PORT = 29501

# The shell expression of each placeholder of nodewords inside the script's functions.
_SHELL_VALUES = {"head": "${nodes[0]}", "node": "$ip", "ray_port": "$ray_port", "nnodes": "${#nodes[@]}",
                 "rank": "$i", "master_port": "$master_port"}


def _shell_words(template: Sequence[str]) -> str:
    """`template` as script text: literal parts quoted, each placeholder its double-quoted variable."""
    words = []
    for word in template:
        parts = []
        for literal, field, _, _ in string.Formatter().parse(word):
            if literal:
                parts.append(q(literal))
            if field is not None:
                parts.append(f'"{_SHELL_VALUES[field]}"')
        words.append("".join(parts))
    return " ".join(words)

_BODY = r'''
container=${SPARKMODS_CONTAINER:-$container}
hf_cache=${SPARKMODS_HF_CACHE:-$HOME/.cache/huggingface}
network=${SPARKMODS_DOCKER_NETWORK:-}
gpus=${SPARKMODS_GPUS-all}
ray_timeout=${SPARKMODS_RAY_TIMEOUT:-180}
read -r -a ssh_cmd <<<"${SPARKMODS_SSH:-ssh -o BatchMode=yes -o ConnectTimeout=10}"
read -r -a base_docker_args <<<"${SPARKMODS_DOCKER_RUN_ARGS:---privileged --ipc host --shm-size 16g --ulimit memlock=-1}"
read -r -a extra_docker_args <<<"${SPARKMODS_DOCKER_ARGS:-}"

log() { printf 'sparkmods-launch: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# True when commands for this node run here: the node is this machine, or (test stand-in)
# every node is a container on a local Docker network.
is_local() {
    local ip=$1 addr
    if [[ -n "$network" || "$ip" == local || "$ip" == localhost || "$ip" == 127.0.0.1 ]]; then
        return 0
    fi
    for addr in $(hostname -I 2>/dev/null); do
        if [[ "$addr" == "$ip" ]]; then return 0; fi
    done
    return 1
}

# posix_words WORD...: one string that any POSIX shell (dash as well as bash) reads back as
# exactly these words: each in single quotes, an embedded ' written '\''. The login shell
# on the far side of ssh may be dash, and printf %q output ($'\n' for a newline) is bash-only.
posix_words() {
    local word quoted='' sq="'" esc="'\\''"
    for word in "$@"; do quoted+="'${word//$sq/$esc}' "; done
    printf '%s' "$quoted"
}

# on_node IP CMD [ARG...]: run CMD on the node's host, through ssh unless the node is local.
on_node() {
    local ip=$1
    shift
    if is_local "$ip"; then
        "$@"
    else
        "${ssh_cmd[@]}" -- "$ip" "$(posix_words "$@")"
    fi
}

ctr() { printf '%s-%s' "$container" "$1"; }

# KEY=VALUE lines for docker's --env-file: the recipe env, then secrets passed by name if set.
env_file_lines() {
    local kv name
    for kv in "${env_lines[@]}"; do printf '%s\n' "$kv"; done
    for name in "${pass_env[@]}"; do
        if [[ -n "${!name:-}" ]]; then printf '%s=%s\n' "$name" "${!name}"; fi
    done
}

remove_containers() {
    local i
    for i in "${!nodes[@]}"; do
        on_node "${nodes[$i]}" docker rm -f "$(ctr "$i")" >/dev/null 2>&1 || true
    done
}

started=false
cleanup() {
    local status=$?
    trap - EXIT INT TERM HUP
    if [[ "$started" == true ]]; then
        log "removing the containers"
        remove_containers
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# check_login IP: one ssh login to a worker before anything starts. ssh's verdict, its last
# line (no route, host key verification failed, key refused), says which it was; the lines
# before it (a changed-host-key banner, warnings) would not fit on the one line.
check_login() {
    local ip=$1 why
    if why=$("${ssh_cmd[@]}" -- "$ip" true 2>&1 </dev/null); then return 0; fi
    why=$(printf '%s\n' "$why" | tr -d '\r' | grep -v '^[[:space:]]*$' | tail -n 1 || true)
    die "cannot log in to node $ip with ${ssh_cmd[*]} (${why:-ssh failed}): the head needs key login there" \
        "without a prompt and the node's host key in known_hosts (run ssh $ip true once by hand)," \
        "or set SPARKMODS_SSH; nothing was started"
}

preflight() {
    local ip name
    command -v tar >/dev/null || die "tar is needed to copy the mods"
    for name in "${pass_env[@]}"; do
        if [[ "${!name:-}" == *$'\n'* ]]; then die "\$$name holds a newline; docker --env-file cannot pass it"; fi
    done
    for ip in "${nodes[@]}"; do
        if ! is_local "$ip"; then check_login "$ip"; fi
        on_node "$ip" docker version --format '{{.Server.Version}}' >/dev/null 2>&1 \
            || die "no Docker engine answers on node $ip: install or start docker there for the login user; nothing was started"
    done
}

start_node() {
    local i=$1 ip=${nodes[$1]}
    local run=(docker run -d --name "$(ctr "$i")" --entrypoint "" "${base_docker_args[@]}"
        -v "$hf_cache:/root/.cache/huggingface" --env-file /dev/stdin)
    if [[ -n "$gpus" ]]; then run+=(--gpus "$gpus"); fi
    # vLLM binds its distributed traffic to this address (Sparks have several interfaces).
    if [[ "$mode" != solo ]]; then run+=(-e @NODE_ENV@); fi
    if [[ -n "$network" ]]; then
        run+=(--network "$network" --ip "$ip" --hostname "node-$i")
    else
        run+=(--network host)
    fi
    run+=("${extra_docker_args[@]}" "$image" sleep infinity)
    env_file_lines | on_node "$ip" "${run[@]}" >/dev/null || die "could not start a container on node $ip"
    log "node $ip: container $(ctr "$i") started"
}

# The --apply-mod contract: /workspace/mods/<name>, run.sh run as root from there, WORKSPACE_DIR
# set to the directory docker exec starts in. main() applies every mod to the head, then to each
# worker, in the recipe's order.
apply_mod() {
    local i=$1 dir=$2 ip=${nodes[$1]} c base entries=() entry
    c=$(ctr "$i")
    base=$(basename "$dir")
    if [[ "$i" -eq 0 ]]; then
        entries=(.)
    else
        for entry in "$dir"/*; do entries+=("$(basename "$entry")"); done
    fi
    on_node "$ip" docker exec "$c" rm -rf "/workspace/mods/$base"
    on_node "$ip" docker exec "$c" mkdir -p "/workspace/mods/$base"
    tar -C "$dir" -cf - "${entries[@]}" | on_node "$ip" docker exec -i "$c" tar -C "/workspace/mods/$base" -xf - \
        || die "could not copy mod $base to node $ip"
    # shellcheck disable=SC2016  # expanded inside the container, on purpose
    on_node "$ip" docker exec "$c" bash -c \
        'export WORKSPACE_DIR=$PWD && cd "/workspace/mods/$1" && chmod +x run.sh && ./run.sh' bash "$base" \
        || die "mod $base failed on node $ip"
    log "node $ip: mod $base applied"
}

alive_ray_nodes() {
    on_node "${nodes[0]}" docker exec "$(ctr 0)" python3 -c @RAY_ALIVE_NODES@ 2>/dev/null | tail -n 1
}

# join_ray I: node I joins the head; a node that times out while its raylet starts (a busy
# machine) gets its half-started Ray stopped and two more tries before the launch gives up.
join_ray() {
    local i=$1 ip=${nodes[$1]} attempt
    for attempt in 1 2 3; do
        if on_node "$ip" docker exec "$(ctr "$i")" @RAY_WORKER@ >/dev/null; then return 0; fi
        log "node $ip: joining the Ray head failed (try $attempt of 3)"
        on_node "$ip" docker exec "$(ctr "$i")" ray stop --force >/dev/null 2>&1
    done
    die "node $ip could not join the Ray head at ${nodes[0]}:$ray_port"
}

start_ray() {
    local head=${nodes[0]} i deadline count
    on_node "$head" docker exec "$(ctr 0)" @RAY_HEAD@ >/dev/null || die "ray start --head failed on $head"
    for i in "${!nodes[@]}"; do
        if [[ "$i" -ne 0 ]]; then join_ray "$i"; fi
    done
    deadline=$((SECONDS + ray_timeout))
    until count=$(alive_ray_nodes) && [[ "$count" == "${#nodes[@]}" ]]; do
        if ((SECONDS >= deadline)); then
            die "Ray shows ${count:-no} of ${#nodes[@]} nodes after ${ray_timeout}s"
        fi
        sleep 2
    done
    log "Ray cluster formed: ${#nodes[@]} nodes"
}

# foreground CMD...: run CMD in a process group of its own and wait for it, so that Ctrl-C (the
# terminal signals its foreground group) and SIGTERM reach only this script, whose traps then
# always run and exit 130/143 after removing the containers (which ends CMD). Sharing our group,
# a docker CLI that exits normally on SIGINT can win the race, and bash then carries on as if
# vllm serve had ended by itself: exit 0 instead of 130. `set -m` gives the job its own group.
foreground() {
    set -m
    "$@" &
    set +m
    wait "$!"
}

serve() {
    local i
    case "$mode" in
        solo | ray)
            foreground on_node "${nodes[0]}" docker exec "$(ctr 0)" "${serve_argv[@]}"
            ;;
        no-ray)
            for i in "${!nodes[@]}"; do
                if [[ "$i" -ne 0 ]]; then
                    on_node "${nodes[$i]}" docker exec -d "$(ctr "$i")" "${serve_argv[@]}" @RANK_FLAGS@ @FOLLOWER@
                fi
            done
            i=0
            foreground on_node "${nodes[0]}" docker exec "$(ctr 0)" "${serve_argv[@]}" @RANK_FLAGS@
            ;;
    esac
}

main() {
    local i mod
    preflight
    log "removing containers an earlier run left"
    remove_containers
    started=true
    for i in "${!nodes[@]}"; do start_node "$i"; done
    for i in "${!nodes[@]}"; do
        for mod in "${mods[@]}"; do apply_mod "$i" "$mod"; done
    done
    if [[ "$mode" == ray ]]; then start_ray; fi
    log "starting vllm serve on ${nodes[0]} ($mode)"
    serve
}

main "$@"
'''

_SCRIPT_BODY = (_BODY.replace("@NODE_ENV@", _shell_words(NODE_ENV))
                .replace("@RAY_ALIVE_NODES@", q(RAY_ALIVE_NODES))
                .replace("@RAY_HEAD@", _shell_words(RAY_HEAD))
                .replace("@RAY_WORKER@", _shell_words(RAY_WORKER))
                .replace("@RANK_FLAGS@", _shell_words(RANK_FLAGS))
                .replace("@FOLLOWER@", _shell_words(FOLLOWER)))


def container_prefix(plan: LaunchPlan) -> str:
    """`sparkmods-<recipe file stem>`: one name per recipe, suffixed -0 (head), -1, ... per node."""
    stem = re.sub(r"[^a-z0-9_.-]+", "-", plan.recipe.path.stem.lower()).strip("-.") or "recipe"
    return f"sparkmods-{stem}"


def serve_argv(plan: LaunchPlan) -> List[str]:
    """The head's serve argv; Ray mode names the executor (launch-cluster.sh would add it too)."""
    return plan.serve.argv(RAY_EXECUTOR if plan.mode == "ray" else ())


def render_standalone(plan: LaunchPlan, about: Sequence[str]) -> str:
    lines = header(about) + [
        assign("image", plan.image),
        assign("container", container_prefix(plan)),
        assign("mode", plan.mode),
        "# Head first. The script runs on the head; the others are reached with ssh.",
        array("nodes", list(plan.nodes) or ["local"]),
        array("mods", [str(p) for p in plan.mod_dirs], per_line=1),
        array("env_lines", [f"{k}={v}" for k, v in plan.env.items()], per_line=1),
        array("pass_env", plan.pass_env),
        rows("serve_argv", plan.serve.grouped(serve_argv(plan))),
        assign("ray_port", RAY_PORT),
        assign("master_port", MASTER_PORT),
    ]
    return "\n".join(lines) + "\n" + _SCRIPT_BODY
