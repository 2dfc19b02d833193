#!/usr/bin/env bash
# Make a Docker engine answer on this machine, for the docker-marked tests (CI and developers).
#
# Installs what the test images need (the Debian package that ships dockerd; debootstrap and
# Debian's archive keyring for the base rootfs; shellcheck for run.sh linting), then starts dockerd
# in the background when no engine answers. Idempotent: a second run with an engine up does nothing. Runs as root on
# Debian/Ubuntu-like machines; systemd is used when it is PID 1, a plain background dockerd
# otherwise (containers, CI VMs without an init).
#
# Environment:
#   SPARKMODS_DOCKERD_LOG      where a dockerd we start logs (default /var/log/sparkmods-dockerd.log)
#   SPARKMODS_DOCKER_TIMEOUT   seconds to wait for `docker info` to answer (default 90)
set -euo pipefail

readonly LOG="${SPARKMODS_DOCKERD_LOG:-/var/log/sparkmods-dockerd.log}"
readonly TIMEOUT="${SPARKMODS_DOCKER_TIMEOUT:-90}"
# Packages that ship dockerd, in order of preference (Debian/Ubuntu's own, then Docker's repository).
readonly ENGINE_PACKAGES=(docker.io docker-ce)
STARTED_PID=""  # the dockerd this script started, if any

say() { echo "setup-docker: $*"; }
die() { echo "setup-docker: error: $*" >&2; exit 1; }

engine_answers() { timeout 20 docker info >/dev/null 2>&1; }

has_candidate() {
    local candidate
    candidate="$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}')"
    [[ -n "$candidate" && "$candidate" != "(none)" ]]
}

install_packages() {
    local wanted=()
    command -v debootstrap >/dev/null || wanted+=(debootstrap)
    command -v shellcheck >/dev/null || wanted+=(shellcheck)
    # ssh and ssh-keygen: the launch tests reach a second node (an sshd container) over real ssh.
    command -v ssh-keygen >/dev/null || wanted+=(openssh-client)
    # debootstrap checks Debian's Release signature with this keyring (not preinstalled on Ubuntu).
    [[ -e /usr/share/keyrings/debian-archive-keyring.gpg ]] || wanted+=(debian-archive-keyring)
    local need_engine=false
    command -v dockerd >/dev/null || need_engine=true
    if [[ ${#wanted[@]} -eq 0 && "$need_engine" == false ]]; then
        return 0
    fi
    command -v apt-get >/dev/null || die "apt-get not found: install dockerd, debootstrap, shellcheck and the OpenSSH client by hand"
    export DEBIAN_FRONTEND=noninteractive
    say "apt-get update"
    apt-get update -qq || say "apt-get update reported errors; trying to install anyway"
    if [[ "$need_engine" == true ]]; then
        local pkg engine=""
        for pkg in "${ENGINE_PACKAGES[@]}"; do
            if has_candidate "$pkg"; then engine="$pkg"; break; fi
        done
        [[ -n "$engine" ]] || die "no apt package provides dockerd (tried ${ENGINE_PACKAGES[*]}); enable Debian main or Docker's apt repository"
        wanted+=("$engine")
    fi
    say "installing ${wanted[*]}"
    apt-get install -y -qq --no-install-recommends "${wanted[@]}" >/dev/null \
        || die "apt-get install ${wanted[*]} failed (see the apt output above)"
    command -v dockerd >/dev/null || die "dockerd still missing after installing ${wanted[*]}"
}

# The pid of a dockerd that is already starting (so we wait for it instead of starting another).
running_dockerd_pid() {
    local pid
    [[ -r /var/run/docker.pid ]] || return 1
    pid="$(cat /var/run/docker.pid)"
    [[ -n "$pid" && -d "/proc/$pid" ]] || return 1
    [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == dockerd ]] || return 1
    echo "$pid"
}

start_engine() {
    if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null; then
        say "starting docker with systemctl"
        systemctl start docker || die "systemctl start docker failed; see: journalctl -u docker"
        return 0
    fi
    local pid
    if pid="$(running_dockerd_pid)"; then
        say "dockerd (pid $pid) is already starting; waiting for it"
        return 0
    fi
    mkdir -p "$(dirname "$LOG")"
    say "starting dockerd in the background (log: $LOG)"
    # setsid: the daemon must outlive this script and the shell (or CI step) that ran it.
    setsid dockerd >>"$LOG" 2>&1 </dev/null &
    STARTED_PID=$!
}

wait_for_engine() {
    local deadline=$((SECONDS + TIMEOUT))
    until engine_answers; do
        if [[ -n "$STARTED_PID" ]] && ! kill -0 "$STARTED_PID" 2>/dev/null; then
            tail -n 25 "$LOG" >&2
            die "dockerd exited during startup; see $LOG"
        fi
        if ((SECONDS >= deadline)); then
            if [[ -r "$LOG" ]]; then tail -n 25 "$LOG" >&2; fi
            die "no Docker engine answered 'docker info' within ${TIMEOUT}s (dockerd log: $LOG)"
        fi
        sleep 1
    done
}

main() {
    [[ $EUID -eq 0 ]] || die "must run as root (try: sudo $0)"
    install_packages
    command -v docker >/dev/null || die "the docker CLI is missing (the engine package did not ship it)"
    if engine_answers; then
        say "Docker engine already answers"
    else
        start_engine
        wait_for_engine
    fi
    say "ready: $(docker info --format 'engine {{.ServerVersion}}, storage {{.Driver}}, cgroup v{{.CgroupVersion}}')"
}

main "$@"
