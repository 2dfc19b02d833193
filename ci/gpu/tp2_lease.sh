#!/usr/bin/env bash
# Two Sparks on two GPUs (issue 29): every mod under tensor parallel 2, each rank a node of its
# own, with Ray and without, against unmodified two-node baselines, on one two-GPU lease.
# The steps, in order (ci/gpu/README.md, "Two Sparks on one two-GPU lease", has the device calls):
#
#   here:   bash ci/gpu/tp2_lease.sh prepare          pieces of vLLM + its requirements + Ray in .carry-tp2/
#   there:  bash ci/gpu/tp2_lease.sh receive          one call per piece but the last (carry .carry-tp2/pNN)
#   there:  bash ci/gpu/tp2_lease.sh start [both|mp|ray]
#                                                     with the last piece: install, check, start the runs, wait
#   there:  bash ci/gpu/tp2_lease.sh wait [SECONDS]   until they end (exit 3 while some still run)
#   there:  bash ci/gpu/tp2_lease.sh pack             the results to $OUT, one archive per executor
#   here:   bash ci/gpu/tp2_lease.sh unpack FOLDER    into ci/bench/results/gpu-e2e-tp2-<executor>-<vLLM>-<gpu>/
#
# "both" runs the no-Ray groups side by side and the Ray groups one after another, all at once:
# every server has a fixed KV cache (e2e.py --share-gpu, which lease.py passes), so none of them
# profiles memory the others change, and each Ray server forms its own two-node cluster while no
# other Ray cluster exists. "mp" then "ray" is the strict order, if the lease has the time.
set -euo pipefail
cd "$(dirname "$0")/../.."

VLLM=${TP2_VLLM:-0.26.0}
CARRY=.carry-tp2
SITE=/tmp/site-$VLLM
RESULTS=${TP2_RESULTS:-ci/bench/results}
export SPARKMODS_LEASE_ROOT=/tmp/sparkmods-lease-tp2
# NVLink multicast off in everything started from here too (e2e.py sets it for every server and node).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
# No Ray: three runs side by side. Ray: one after another, the mtp-no-ray evidence's scenario first,
# so that the first group's results are written even if the lease ends during the second.
MP_GROUPS=(mtp-weights hybrid-int4-fp8 'int8-lm-head,chat-template,turboquant')
RAY_GROUPS=('mtp-weights,int8-lm-head,turboquant' 'chat-template,hybrid-int4-fp8')

die() {
    echo "tp2_lease: $*" >&2
    exit 2
}

# The machine can run two nodes: two GPUs, the second loopback address, Ray and the `vllm serve`
# entry point importable from the site. One line each; exit 2 before anything starts otherwise.
check_machine() {
    local gpus
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
    [[ "$gpus" -ge 2 ]] || die "this machine shows $gpus GPU(s) in nvidia-smi -L; the two-node runs need 2 (kind nvidia-h100-x2)"
    python3 -c "import socket; socket.socket().bind(('127.0.0.3', 0))" 2>/dev/null \
        || die "cannot bind 127.0.0.3: the second node's loopback address"
    if [[ -d "$SITE/vllm" ]]; then
        PYTHONPATH=$SITE python3 -c "import ray, vllm.entrypoints.cli.main" \
            || die "$SITE does not import ray and vllm.entrypoints.cli.main (install again)"
    fi
    nvidia-smi --query-gpu=index,name,memory.used --format=csv,noheader
}

start_runs() {
    local which=$1 args='--tp 2 --nodes 2 --executor'
    if [[ "$which" == mp || "$which" == both ]]; then
        local groups=()
        for g in "${MP_GROUPS[@]}"; do groups+=(--group "$g"); done
        python3 ci/gpu/lease.py start --release "tp2-mp-$VLLM" --site "$SITE" --e2e-args="$args mp" "${groups[@]}"
    fi
    if [[ "$which" == ray || "$which" == both ]]; then
        local groups=()
        for g in "${RAY_GROUPS[@]}"; do groups+=(--group "$g"); done
        python3 ci/gpu/lease.py start --release "tp2-ray-$VLLM" --site "$SITE" --serial --e2e-args="$args ray" \
            "${groups[@]}"
    fi
}

# unpack FOLDER: each archive pack wrote into the results folder named after executor, release and GPU.
unpack() {
    local from=$1 archive executor gpu dest found=0
    for archive in "$from"/e2e-tp2-*.tar.gz; do
        [[ -f "$archive" ]] || continue
        found=1
        executor=$(basename "$archive" .tar.gz)
        executor=${executor#e2e-tp2-}
        executor=${executor%%-*}
        gpu=$(tr 'A-Z' 'a-z' <"$from/device.txt" | grep -o 'h[0-9]00' | head -n 1 || true)
        dest=$RESULTS/gpu-e2e-tp2-$executor-$VLLM-${gpu:-gpu}
        mkdir -p "$dest"
        tar -xzf "$archive" -C "$dest" --strip-components=1
        echo "$dest:"
        grep -h '| FAIL |' "$dest"/*/summary.md || echo "  every check passed"
    done
    [[ "$found" == 1 ]] || die "no e2e-tp2-*.tar.gz in $from"
    # What decides the launch rule mtp-no-ray: MTP drafting over two nodes without Ray.
    local mtp
    mtp=$(compgen -G "$RESULTS/gpu-e2e-tp2-mp-$VLLM-*/mtp-weights/mtp-weights.json" | head -n 1 || true)
    if [[ -n "$mtp" ]]; then
        echo "mtp-no-ray evidence ($mtp):"
        python3 -c 'import json, sys
for c in json.load(open(sys.argv[1]))["checks"]:
    if "mtp-mod" in c["name"] or "MTP mod" in c["name"] or "acceptance" in c["name"]:
        print("  " + ("PASS" if c["passed"] else "FAIL"), c["name"] + ":", c["detail"])' "$mtp"
    fi
}

case ${1:-} in
    prepare)
        python3 ci/gpu/carry.py prepare --vllm "$VLLM" --extra ray --out "$CARRY"
        pieces=("$CARRY"/p*)
        # What travels with a call: the working tree (tracked and not-ignored files) and one piece.
        tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -n 1 | cut -f1)
        piece=$(stat -c %s "${pieces[0]}/data")
        if ((tree + piece > 64 * 1024 * 1024)); then
            die "the working tree ($((tree >> 20)) MiB) and a piece ($((piece >> 20)) MiB) exceed the 64 MiB a call" \
                "carries: commit or ignore less, or cut smaller pieces"
        fi
        echo "each call carries $(((tree + piece) >> 20)) MiB of 64 (working tree $((tree >> 20)) MiB)"
        echo "device calls (kind nvidia-h100-x2, consecutive, no pause in between):"
        for piece in "${pieces[@]:0:${#pieces[@]}-1}"; do
            echo "  carry [$piece]: bash ci/gpu/tp2_lease.sh receive"
        done
        echo "  carry [${pieces[-1]}]: bash ci/gpu/tp2_lease.sh start both"
        echo "  then: bash ci/gpu/tp2_lease.sh wait   (until it exits 0), then: bash ci/gpu/tp2_lease.sh pack"
        ;;
    receive)
        check_machine
        python3 ci/gpu/carry.py receive --from "$CARRY"
        ;;
    start)
        which=${2:-both}
        [[ "$which" =~ ^(both|mp|ray)$ ]] || die "start takes both, mp or ray, not '$which'"
        if compgen -G "$CARRY/p*" >/dev/null; then python3 ci/gpu/carry.py receive --from "$CARRY"; fi
        if [[ ! -d "$SITE/vllm" ]]; then python3 ci/gpu/carry.py install --release "$VLLM" --site "$SITE"; fi
        check_machine
        start_runs "$which"
        python3 ci/gpu/lease.py wait --seconds "${TP2_WAIT_S:-360}" || true
        ;;
    wait)
        python3 ci/gpu/lease.py wait --seconds "${2:-540}"
        ;;
    pack)
        [[ -n "${OUT:-}" ]] || die "pack writes to \$OUT, which the device call sets"
        nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 >"$OUT/device.txt"
        python3 ci/gpu/lease.py pack --to "$OUT"
        ;;
    unpack)
        [[ -n "${2:-}" && -d "${2:-}" ]] || die "unpack needs the folder the device call's files came back in"
        unpack "$2"
        ;;
    *)
        die "usage: tp2_lease.sh prepare | receive | start [both|mp|ray] | wait [SECONDS] | pack | unpack FOLDER"
        ;;
esac
