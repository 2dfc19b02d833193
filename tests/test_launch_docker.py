"""The standalone launch script, run for real on the Docker engine.

Image: Debian + Ray (tests/dockerimg.py) + every Python file of a real vLLM release at the
community image's site-packages path + a `vllm` command stand-in (tests/fixtures/vllm-standin.py)
that records argv, environment and what the mods changed, because no model can run here.
Mods: the repository's real int8-lm-head (patches vLLM's logits processor, adds a module) and
chat-template (installs a file into the workspace), plus a small test mod with a top-level dotfile.

Solo: one container on this machine. Two nodes: two containers on a Docker network whose
addresses are the node IPs (SPARKMODS_DOCKER_NETWORK: the script's test stand-in for ssh to real
machines); real Ray forms the cluster, and the stand-in runs a Ray task on every node to report
that node's files, so "mods applied on both" is observed on the worker itself.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator, List

import pytest

from launchdocker import SECRET, assert_node_patched, serve_args
from sshnode import free_network

pytestmark = pytest.mark.docker


@pytest.fixture
def node_network(docker_engine, launch) -> Iterator[List[str]]:
    """A Docker network with a free /24; returns the two node addresses (head first)."""
    with free_network(docker_engine, f"{launch.prefix}-net") as subnet:
        launch.network = f"{launch.prefix}-net"
        hosts = list(subnet.hosts())
        yield [str(hosts[9]), str(hosts[10])]
        for name in launch.containers(docker_engine):
            docker_engine.containers.get(name).remove(force=True)


def test_solo_applies_the_mods_and_serves_with_the_recipe(launch, docker_engine, vllm_py_files):
    launch.generate("--solo")
    text = launch.script.read_text()
    assert SECRET not in text and f"image:{launch.recipe}" not in text
    assert "Checked against vLLM 0.19.1.dev0+g2a69949bd.d20260404 (image:" in text
    done = launch.run()
    assert done.returncode == 0, done.stderr
    (report,) = launch.reports()
    argv = report["argv"]
    assert argv[:3] == ["vllm", "serve", "/models/Qwen3.5-launch-test"]
    args = serve_args(argv)
    assert args["--tensor-parallel-size"] == "1" and "--distributed-executor-backend" not in argv
    assert json.loads(args["--speculative-config"]) == {"method": "mtp", "num_speculative_tokens": 2}
    assert report["env"]["HF_TOKEN"] == SECRET and report["env"]["LAUNCH_TEST_NOTE"] == "two words, one value"
    assert report["cwd"] == "/workspace/vllm"
    assert_node_patched(report["node"], True, launch, vllm_py_files)
    assert launch.containers(docker_engine) == [], "containers left after vllm serve ended"


def test_two_nodes_form_a_ray_cluster_and_both_are_modded(launch, docker_engine, node_network, vllm_py_files):
    head, worker = node_network
    launch.generate("--nodes", f"{head},{worker}", "--ray")
    done = launch.run()
    assert done.returncode == 0, done.stderr
    assert "Ray cluster formed: 2 nodes" in done.stderr
    (report,) = launch.reports()  # vllm serve ran once, on the head
    assert report["node"]["hostname"] == "node-0" and report["env"]["VLLM_HOST_IP"] == head
    args = serve_args(report["argv"])
    assert args["--tensor-parallel-size"] == "2" and args["--distributed-executor-backend"] == "ray"
    active = re.search(r"Active:\n((?:\s+\d+ node_\S+\n)+)", report["ray_status"])
    assert active and len(active.group(1).strip().splitlines()) == 2, report["ray_status"]
    nodes = {n["ray_node_ip"]: n for n in report["ray_nodes"]}
    assert sorted(nodes) == sorted([head, worker])
    assert_node_patched(nodes[head], True, launch, vllm_py_files)
    assert_node_patched(nodes[worker], False, launch, vllm_py_files)
    assert launch.containers(docker_engine) == []


def test_two_nodes_without_ray_start_headless_ranks(launch, docker_engine, node_network):
    head, worker = node_network
    launch.recipe.write_text(launch.recipe.read_text().replace(
        " \\\n    --speculative-config '{{\"method\": \"mtp\", \"num_speculative_tokens\": 2}}'", ""))
    launch.generate("--nodes", f"{head},{worker}", "--no-ray")
    done = launch.run(STANDIN_WAIT_REPORTS="2")  # each rank stays up until both have reported
    assert done.returncode == 0, done.stderr
    by_host = {r["node"]["hostname"]: r["argv"] for r in launch.reports()}
    assert sorted(by_host) == ["node-0", "node-1"]
    common = ["--nnodes", "2", "--master-addr", head, "--master-port", "29501"]
    for host, rank in (("node-0", "0"), ("node-1", "1")):
        args = serve_args(by_host[host])
        assert args["--node-rank"] == rank and all(args[k] == v for k, v in zip(common[::2], common[1::2]))
    assert "--headless" in by_host["node-1"] and "--headless" not in by_host["node-0"]
    assert launch.containers(docker_engine) == []


def test_a_failing_server_leaves_no_containers(launch, docker_engine):
    launch.generate("--solo")
    done = launch.run(STANDIN_EXIT="3")
    assert done.returncode == 3 and "removing the containers" in done.stderr
    assert launch.containers(docker_engine) == []


def _terminal_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def _signal_state(pid: int) -> str:
    """The script's ignored and blocked signal masks, for the message of a script that hangs."""
    status = Path(f"/proc/{pid}/status")
    lines = status.read_text().splitlines() if status.exists() else []
    return ", ".join(line.replace("\t", " ") for line in lines if line.startswith(("SigIgn", "SigBlk"))) or "no /proc"


def test_ctrl_c_leaves_no_containers(launch, docker_engine):
    launch.generate("--solo")
    # As from a terminal: SIGINT at its default and unblocked in the script, whatever the test
    # process inherited or holds (bash cannot trap a signal that was ignored when it started).
    proc = subprocess.Popen(["bash", str(launch.script)], env=launch.env(STANDIN_SLEEP="300"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_terminal_signals)
    deadline = time.monotonic() + 180
    while not launch.reports():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "vllm serve never started"
        time.sleep(0.5)
    signals = _signal_state(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends the foreground job on Ctrl-C
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        raise AssertionError(f"the script did not end within 120 s of SIGINT ({signals}):\n{err}") from None
    assert proc.returncode == 130, err
    assert launch.containers(docker_engine) == []


def test_a_rerun_replaces_what_an_earlier_run_left(launch, docker_engine, launch_image):
    launch.generate("--solo")
    docker_engine.containers.run(launch_image, ["sleep", "infinity"], name=f"{launch.prefix}-0", detach=True)
    done = launch.run()
    assert done.returncode == 0, done.stderr
    assert len(launch.reports()) == 1 and launch.containers(docker_engine) == []
