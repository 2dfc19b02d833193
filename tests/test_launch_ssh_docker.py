"""The standalone launch script's ssh path, for real: `--nodes A,B` where B is a second machine
reached only through OpenSSH.

A is this machine (the script runs on the head; A is this machine's address on a fresh Docker
network). B is a container on that network running a real sshd and the docker CLI
(tests/sshnode.py), with its own host key and a generated client key; the script reaches it with
its default ssh options (BatchMode, strict host keys) plus `-F` for a config that names the key and
a known_hosts file, what a user keeps in ~/.ssh. Nothing tells the script B is special: no
SPARKMODS_DOCKER_NETWORK. Observed on B: sshd's log (the key login), the docker argv that arrived
through ssh, and the worker's own report of its vLLM files after the mods, the same mods run.sh
applied on A. Refusals: B unreachable, B's key unknown, our key refused: one line naming B and
what to do, and nothing started anywhere.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

from sshnode import SshNode, client_config, ensure_ssh_node_image, free_network, keygen, ssh_node
from test_launch_docker import REAL_MODS, Launch, assert_node_patched, launch, launch_image, serve_args, vllm_py_files  # noqa: F401

pytestmark = pytest.mark.docker

MODS = ("launch-demo", *REAL_MODS)
MTP_FLAG = re.compile(r" \\\n\s+--speculative-config '[^\n]*'")  # MTP across nodes needs Ray


@pytest.fixture(scope="module")
def node_image(docker_engine) -> str:
    return ensure_ssh_node_image(docker_engine)


@pytest.fixture
def keys(tmp_path) -> Tuple[Path, Path]:
    """(client key, node host key), fresh for each test."""
    folder = tmp_path / "keys"
    folder.mkdir()
    return keygen(folder / "client_ed25519"), keygen(folder / "host_ed25519")


@pytest.fixture
def head_and_node(docker_engine, launch, node_image, keys) -> Iterator[Tuple[str, SshNode]]:
    """(A, B): A this machine's address on a fresh Docker network, B an ssh node there.

    The script is not told about the network: it reaches B through ssh only.
    """
    client_key, host_key = keys
    with free_network(docker_engine, f"{launch.prefix}-net") as subnet:
        hosts = list(subnet.hosts())
        with ssh_node(docker_engine, node_image, f"sparkmods-sshnode-{uuid.uuid4().hex[:8]}", f"{launch.prefix}-net",
                      str(hosts[10]), Path(f"{client_key}.pub"), host_key) as node:
            yield str(hosts[0]), node  # the engine gives this machine the first address


def ssh_setting(launch: Launch, identity: Path, known: str) -> str:
    """SPARKMODS_SSH: the script's default options plus `-F` (key and known_hosts, as in ~/.ssh)."""
    known_hosts = launch.tmp / "known_hosts"
    known_hosts.write_text(known)
    return f"ssh -F {client_config(launch.tmp, identity, known_hosts)} -o BatchMode=yes -o ConnectTimeout=10"


def two_node_script(launch: Launch, head: str, node: str) -> None:
    launch.recipe.write_text(MTP_FLAG.sub("", launch.recipe.read_text()))
    launch.generate("--nodes", f"{head},{node}", "--no-ray")


def reports_by_ip(launch: Launch) -> dict:
    return {r["env"]["VLLM_HOST_IP"]: r for r in launch.reports()}


def calls_for(calls: List[List[str]], container: str) -> List[List[str]]:
    return [c for c in calls if container in c]


def test_node_b_is_reached_over_ssh_and_modded_like_a(launch, docker_engine, head_and_node, keys, vllm_py_files):
    head, node = head_and_node
    two_node_script(launch, head, node.ip)
    ssh = ssh_setting(launch, keys[0], node.known_hosts_line())
    done = launch.run(SPARKMODS_SSH=ssh, STANDIN_WAIT_REPORTS="2")  # the head ends only once B's rank reported
    assert done.returncode == 0, done.stderr

    assert re.search(rf"Accepted publickey for root from {re.escape(head)} ", node.sshd_log()), node.sshd_log()
    worker, head_ctr = f"{launch.prefix}-1", f"{launch.prefix}-0"
    calls = node.docker_calls()
    assert calls_for(calls, head_ctr) == [], "the head's container was handled on B"
    mine = calls_for(calls, worker)
    assert ["rm", "-f", worker] in mine  # a re-run's leftovers removed first, then started fresh
    started = next(c for c in mine if c[:2] == ["run", "-d"])
    assert started[started.index("--network") + 1] == "host" and f"VLLM_HOST_IP={node.ip}" in started
    applied = [c for c in mine if c[:2] == ["exec", worker] and "./run.sh" in " ".join(c)]
    assert [c[-1] for c in applied] == list(MODS)
    serve = next(c for c in mine if c[:3] == ["exec", "-d", worker])
    assert serve[3:5] == ["vllm", "serve"] and "--headless" in serve

    said = [line for line in done.stdout.splitlines() if line.startswith("[")]  # the mods' run.sh, head then B
    assert said[:len(said) // 2] == said[len(said) // 2:], "B's run.sh output differs from A's"
    assert {m for m in MODS if f"[{m}] applied variant" in done.stdout or f"[{m}] installed" in done.stdout} == set(MODS)
    for ip in (head, node.ip):
        assert [m for m in MODS if f"sparkmods-launch: node {ip}: mod {m} applied" in done.stderr] == list(MODS)

    by_ip = reports_by_ip(launch)
    assert sorted(by_ip) == sorted([head, node.ip])
    assert_node_patched(by_ip[node.ip]["node"], False, launch, vllm_py_files)
    assert_node_patched(by_ip[head]["node"], True, launch, vllm_py_files)
    b_args, a_args = serve_args(by_ip[node.ip]["argv"]), serve_args(by_ip[head]["argv"])
    assert (b_args["--node-rank"], a_args["--node-rank"]) == ("1", "0")
    assert b_args["--master-addr"] == a_args["--master-addr"] == head
    assert by_ip[node.ip]["env"]["HF_TOKEN"] == by_ip[head]["env"]["HF_TOKEN"], "the secret reached B through ssh"
    assert launch.containers(docker_engine) == [], "containers left after vllm serve ended"
    assert ["rm", "-f", worker] == node.docker_calls()[-1], "B's container not removed through ssh at the end"


@pytest.mark.parametrize("case, says", [
    ("unreachable", r"port 22: (No route to host|Connection timed out)"),
    ("unknown-host-key", r"Host key verification failed\."),
    ("key-refused", r"Permission denied \(publickey\)"),
])
def test_a_node_ssh_cannot_log_in_to_stops_before_anything_starts(case, says, launch, docker_engine, head_and_node,
                                                                  keys):
    head, node = head_and_node
    target, known, identity = node.ip, node.known_hosts_line(), keys[0]
    if case == "unreachable":
        target = re.sub(r"\.\d+$", ".250", node.ip)  # an address on the network where nothing answers
        known = f"{target} {node.host_key_pub}\n"
    elif case == "unknown-host-key":
        known = ""
    else:
        identity = keygen(launch.tmp / "keys" / "other_ed25519")
    two_node_script(launch, head, target)
    done = launch.run(SPARKMODS_SSH=ssh_setting(launch, identity, known))
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"sparkmods-launch: error: cannot log in to node {target} with ssh ")
    assert re.search(says, lines[0]), lines[0]  # ssh's own reason, kept on the line
    assert not re.search(r"\s\)", lines[0]), "ssh's line breaks left blanks in the message"
    assert lines[0].endswith("or set SPARKMODS_SSH; nothing was started")
    assert launch.containers(docker_engine) == [] and launch.reports() == []
    assert node.docker_calls() == []
