"""sparkrun's two-host plan for our recipes, with real ssh to both hosts (issue 13, item 2).

`sparkrun run @spark-vllm-mods/RECIPE --hosts A,B --tp 2 --dry-run`, as launch/README.md shows it,
with the real sparkrun from PyPI (the registry and environment of tests/test_sparkrun_network.py).
Even a dry run logs in to the hosts to plan: it lists their containers and asks the head whether
the image exists, and runs its own nightly image instead when the recipe's `vllm-node` is not
there. So A and B are sshd nodes (tests/sshnode.py, key login, strict host keys, set through
sparkrun's `ssh.options`) whose docker is this machine's engine, which holds a vLLM image
(vLLM 0.19.1's files) under a name unique to the test, given with `--image`.

Asserted: the plan copies and runs every mod of the recipe on both hosts (head rank 0, worker
rank 1), serves the command `sparkmods launch` builds for two nodes (tensor parallel 2) with the
head's rank arguments, and runs exactly the image the head was asked about over ssh; then
`sparkmods recipe check --vllm image:<that image>` passes, so our mods are checked against the
vLLM sparkrun will start. Without `--image` the plan names another image than the recipe's
container: the one to check is the one the plan prints.
"""

from __future__ import annotations

import json
import re
import shlex
import uuid
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest
import yaml

from launchdocker import IMAGE_VERSION
from sparkmods.cli import main
from sparkmods.launch.plan import LaunchOptions, build_plan
from sparkmods.launch.recipe import load_recipe
from sparkmods.launch.sparkrun import HF_MOUNT
from sparkrunenv import SOURCES, registry, serve_command
from sshnode import SshNode, client_config, ensure_ssh_node_image, free_network, keygen, ssh_node

pytestmark = [pytest.mark.network, pytest.mark.docker]

RECIPE_IMAGE = "vllm-node"  # every recipe's container


@pytest.fixture(scope="module")
def node_image(docker_engine) -> str:
    return ensure_ssh_node_image(docker_engine)


@pytest.fixture
def hosts(docker_engine, node_image, sparkrun, tmp_path) -> Iterator[Tuple[SshNode, SshNode]]:
    """(head, worker): two sshd nodes on a fresh network, sparkrun configured to log in to both."""
    client_key, host_key = keygen(tmp_path / "client_ed25519"), keygen(tmp_path / "host_ed25519")
    tag = uuid.uuid4().hex[:8]
    with free_network(docker_engine, f"sparkmods-sparkrun-{tag}") as subnet:
        ips = [str(ip) for ip in list(subnet.hosts())[10:12]]
        with ssh_node(docker_engine, node_image, f"sparkmods-sparkrun-{tag}-a", f"sparkmods-sparkrun-{tag}", ips[0],
                      Path(f"{client_key}.pub"), host_key) as head, \
             ssh_node(docker_engine, node_image, f"sparkmods-sparkrun-{tag}-b", f"sparkmods-sparkrun-{tag}", ips[1],
                      Path(f"{client_key}.pub"), host_key) as worker:
            known_hosts = tmp_path / "known_hosts"
            known_hosts.write_text(head.known_hosts_line() + worker.known_hosts_line())
            config_file = sparkrun.home / ".config" / "sparkrun" / "config.yaml"
            config = (yaml.safe_load(config_file.read_text()) if config_file.exists() else None) or {}
            config["ssh"] = {"options": ["-F", str(client_config(tmp_path, client_key, known_hosts))]}
            config_file.write_text(yaml.safe_dump(config))
            yield head, worker


@pytest.fixture
def image(docker_engine, launch_image) -> Iterator[str]:
    """The vLLM 0.19.1 test image under a name no other test uses; the name is dropped afterwards."""
    repo, tag = "sparkmods-test-sparkrun", uuid.uuid4().hex[:8]
    docker_engine.images.get(launch_image).tag(repo, tag)
    yield f"{repo}:{tag}"
    docker_engine.images.remove(f"{repo}:{tag}")


def plan(sparkrun, source: Path, head: SshNode, worker: SshNode, *extra: str) -> str:
    done = sparkrun("-v", "run", f"@{registry()}/{source.stem}", "--hosts", f"{head.ip},{worker.ip}", "--tp", "2",
                    *extra, "--dry-run", "--no-auto-detect")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    return out


def planned_images(out: str) -> List[str]:
    """The image of the plan summary and of the launcher banner, in that order."""
    return re.findall(r"^Image:\s+(\S+)$", out, re.M)


def head_serve(out: str) -> List[str]:
    block = out.split("Serve command (head, rank 0):", 1)[1].split("\n  Step", 1)[0]
    return shlex.split(block.replace("\\\n", " "))


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_two_hosts_get_our_mods_tp_2_and_the_image_our_check_reads(sparkrun, hosts, image, source, capsys):
    head, worker = hosts
    out = plan(sparkrun, source, head, worker, "--image", image)

    assert ["image", "inspect", image] in head.docker_calls(), "the head was not asked about the image over ssh"
    for node in (head, worker):
        assert ["ps", "--no-trunc", "--format", "{{json .}}"] in node.docker_calls()
        assert "Accepted publickey for root from " in node.sshd_log()
    assert f"image '{image}' found; using it" in out
    assert planned_images(out) == [image, image]

    names = [Path(m).name for m in load_recipe(source).mods]
    roles = re.findall(r"pre_exec context: host=(\S+) rank=(\d)/2 role=(\w+)", out)
    assert roles == [(head.ip, "0", "head"), (worker.ip, "1", "worker")]
    copies = re.findall(r"pre_exec\[\d+\] copy \S+/mods/(\S+) -> \S+_node_(\d):/workspace/mods/(\S+) on (\S+)", out)
    runs = re.findall(r"pre_exec\[\d+\] on ([^/\s]+)/\S+_node_(\d) \([^)]*\): export WORKSPACE_DIR=\$PWD && "
                      r"cd /workspace/mods/(\S+) && chmod \+x run\.sh && \./run\.sh", out)
    per_host = [(ip, rank, name) for ip, rank in ((head.ip, "0"), (worker.ip, "1")) for name in names]
    assert [(ip, rank, dest) for _, rank, dest, ip in copies] == per_host and runs == per_host
    assert all(src == dest for src, _, dest, _ in copies), "a mod copied from another folder than the registry's mods/"

    ours = build_plan(load_recipe(source), LaunchOptions(nodes=(head.ip, worker.ip), ray=False)).serve.argv()
    assert ours[ours.index("--tensor-parallel-size") + 1] == "2"
    theirs = [word.replace("$HF_HOME", HF_MOUNT) for word in serve_command(out)]
    assert theirs == ours
    rank_args = [word.replace("$HF_HOME", HF_MOUNT) for word in head_serve(out)][len(ours):]
    assert rank_args[:6] == ["--nnodes", "2", "--node-rank", "0", "--master-addr", head.ip]

    capsys.readouterr()
    assert main(["recipe", "check", str(source), "--vllm", f"image:{planned_images(out)[-1]}", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["targets"] == [f"vLLM {IMAGE_VERSION} (image:{image})"]  # the vLLM inside what sparkrun runs
    assert report["recipes"] == {str(source): []}


def test_without_the_recipes_image_on_the_head_the_plan_names_the_image_to_check(sparkrun, hosts, docker_engine):
    head, worker = hosts
    if docker_engine.images.list(name=RECIPE_IMAGE):
        pytest.skip(f"this engine has a {RECIPE_IMAGE} image: sparkrun would run it")
    out = plan(sparkrun, SOURCES[0], head, worker)
    assert ["image", "inspect", RECIPE_IMAGE] in head.docker_calls()
    banner = planned_images(out)[-1]
    assert banner != RECIPE_IMAGE and re.search(
        rf"'{RECIPE_IMAGE}', which is not present on head '{re.escape(head.ip)}'; running [^']*'{re.escape(banner)}' instead", out)
