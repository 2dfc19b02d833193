"""A second machine for the standalone launch script's ssh path: a container running a real
OpenSSH server and the docker CLI, reachable by its address on a Docker network.

The script reaches workers only through `ssh NODE 'docker ...'`; this node is what it finds
there: sshd (key login for root, strict host keys on the client side) and Debian's docker CLI.
That CLI talks to this machine's engine through the mounted socket, so the containers the node
starts are ordinary containers of the test engine (host networking there means this machine's
network, which is why the ssh tests use the no-Ray layout). A thin `/usr/local/bin/docker`
appends each argv it is given to DOCKER_LOG, as one JSON line, before running the real CLI:
the tests read that log to see what reached the node through ssh.

Image: a debootstrap rootfs like the base image's, with openssh-server and docker.io from the
Debian archive (tests/dockerimg.py builds and caches it the same way), plus the wrapper. Host
keys are not baked in: each node gets the one a test generates, so its known_hosts line is
known before the node starts.
"""

from __future__ import annotations

import io
import ipaddress
import json
import os
import platform
import random
import shutil
import socket
import subprocess
import tarfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Mapping
from urllib.parse import urlparse

import docker
import docker.errors
import docker.types
from docker.models.containers import Container

from dockerimg import (
    BASE_CHANGES,
    BUILD_RECIPE_VERSION,
    DEBIAN_SUITE,
    DEBOOTSTRAP_INCLUDE,
    ROOTFS_TRIM,
    _add_bytes,
    _build,
    _build_lock,
    _digest,
    _image_exists,
    build_rootfs_tarball,
    cache_dir,
)

ROOTFS_REPO = "sparkmods-test-sshnode-rootfs"
NODE_REPO = "sparkmods-test-sshnode"
NODE_PACKAGES = (*DEBOOTSTRAP_INCLUDE, "openssh-server", "docker.io")
DOCKER_LOG = "/var/log/sparkmods-node-docker.jsonl"
SSHD_LOG = "/var/log/sparkmods-sshd.log"
HOST_KEY = "/etc/ssh/sparkmods_host_ed25519_key"
SSHD_START_TIMEOUT = 120  # seconds; only a bound on waiting for port 22, no assertion on speed

WRAPPER = f"""#!/bin/sh
# Test tap: record the argv that reached this node, then run the real docker CLI unchanged.
python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" >>{DOCKER_LOG}
exec /usr/bin/docker "$@"
"""
DOCKERFILE = """FROM {rootfs}
COPY docker /usr/local/bin/docker
RUN chmod 755 /usr/local/bin/docker && rm -f /etc/ssh/ssh_host_* && mkdir -p /run/sshd \\
    && install -d -m 700 /root/.ssh
"""
# UsePAM=no: Debian's PAM stack for sshd writes /proc/self/loginuid, which an unprivileged
# container refuses, and that refusal would fail every login. Key login for root is sshd's default.
SSHD_ARGV = ["/usr/sbin/sshd", "-D", "-h", HOST_KEY, "-E", SSHD_LOG, "-o", "UsePAM=no",
             "-o", "PasswordAuthentication=no", "-o", "LogLevel=VERBOSE"]


def ensure_ssh_node_image(client: docker.DockerClient) -> str:
    """`sparkmods-test-sshnode:<hash>`, building the rootfs and the wrapper layer once per machine."""
    key = _digest(BUILD_RECIPE_VERSION, DEBIAN_SUITE, "minbase", NODE_PACKAGES, platform.machine(), ROOTFS_TRIM,
                  BASE_CHANGES)[:12]
    rootfs = f"{ROOTFS_REPO}:{key}"
    tag = f"{NODE_REPO}:{_digest(key, WRAPPER, DOCKERFILE)[:12]}"
    with _build_lock():
        if _image_exists(client, tag):
            return tag
        if not _image_exists(client, rootfs):
            tarball = cache_dir() / f"rootfs-sshnode-{key}.tar"
            if not tarball.exists():
                build_rootfs_tarball(tarball, NODE_PACKAGES)
            client.api.import_image(src=str(tarball), repository=ROOTFS_REPO, tag=key, changes=BASE_CHANGES)
        _build(client, tag, DOCKERFILE.format(rootfs=rootfs), {"docker": WRAPPER.encode()})
    return tag


@contextmanager
def free_network(client: docker.DockerClient, name: str) -> Iterator[ipaddress.IPv4Network]:
    """A bridge network on a free random /24 (parallel tests each get their own; no fixed
    addresses), removed on exit. This machine holds the subnet's first address; nodes take others."""
    for _ in range(20):
        subnet = ipaddress.ip_network(f"172.{random.randint(18, 31)}.{random.randint(0, 255)}.0/24")
        try:
            network = client.networks.create(name, driver="bridge", ipam=docker.types.IPAMConfig(
                pool_configs=[docker.types.IPAMPool(subnet=str(subnet))]))
            break
        except docker.errors.APIError as exc:
            if "overlap" not in str(exc):
                raise
    else:
        raise RuntimeError("no free /24 for a test network")
    try:
        yield subnet
    finally:
        network.remove()


def keygen(path: Path) -> Path:
    """A fresh ed25519 key pair without a passphrase at path and path.pub."""
    if shutil.which("ssh-keygen") is None or shutil.which("ssh") is None:
        raise RuntimeError("the ssh tests need the OpenSSH client here (ssh, ssh-keygen): apt-get install openssh-client")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)], check=True)
    return path


def engine_socket(client: docker.DockerClient) -> str:
    """The host path of the engine's unix socket, to mount into the node (the node's docker uses it)."""
    where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    url = urlparse(where)
    if url.scheme != "unix":
        raise RuntimeError(f"DOCKER_HOST={where}: the ssh node mounts the engine's socket, so it needs unix://")
    return url.path


def client_config(folder: Path, identity: Path, known_hosts: Path) -> Path:
    """An ssh_config as a user would keep in ~/.ssh/config: login as root with identity, host keys
    checked against known_hosts only (no system-wide files, so the test sees nothing of this machine's)."""
    config = folder / "ssh_config"
    config.write_text(f"Host *\n  User root\n  IdentityFile {identity}\n  IdentitiesOnly yes\n"
                      f"  UserKnownHostsFile {known_hosts}\n  GlobalKnownHostsFile /dev/null\n")
    return config


def _archive(files: Mapping[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            _add_bytes(tar, name, data, mode=0o600)
    return buf.getvalue()


@dataclass(frozen=True)
class SshNode:
    container: Container
    ip: str
    host_key_pub: str  # "ssh-ed25519 AAAA... comment"

    def known_hosts_line(self) -> str:
        return f"{self.ip} {self.host_key_pub}\n"

    def _read(self, path: str) -> str:
        code, out = self.container.exec_run(["sh", "-c", f"cat {path} 2>/dev/null || true"])
        assert code == 0, out
        return out.decode(errors="replace")

    def docker_calls(self) -> List[List[str]]:
        """Every docker argv that ran on this node, in order."""
        return [json.loads(line) for line in self._read(DOCKER_LOG).splitlines()]

    def sshd_log(self) -> str:
        return self._read(SSHD_LOG)


def _wait_for_port(node_ip: str, container: Container) -> None:
    deadline = time.monotonic() + SSHD_START_TIMEOUT
    while True:
        try:
            with socket.create_connection((node_ip, 22), timeout=2):
                return
        except OSError:
            container.reload()
            if container.status != "running" or time.monotonic() > deadline:
                raise RuntimeError(f"sshd in {container.name} never listened on {node_ip}:22 "
                                   f"({container.status}):\n{container.logs().decode(errors='replace')}") from None
            time.sleep(0.5)


@contextmanager
def ssh_node(client: docker.DockerClient, image: str, name: str, network: str, ip: str, authorized: Path,
             host_key: Path) -> Iterator[SshNode]:
    """A node container at ip on network, sshd serving host_key and accepting authorized (a .pub
    file) for root; removed on exit, whatever happened."""
    host_config = client.api.create_host_config(binds=[f"{engine_socket(client)}:/var/run/docker.sock"])
    endpoints = client.api.create_networking_config({network: client.api.create_endpoint_config(ipv4_address=ip)})
    created = client.api.create_container(image, SSHD_ARGV, name=name, hostname="ssh-node",
                                           host_config=host_config, networking_config=endpoints)
    container = client.containers.get(created["Id"])
    try:
        container.put_archive("/", _archive({HOST_KEY.lstrip("/"): host_key.read_bytes(),
                                              "root/.ssh/authorized_keys": authorized.read_bytes()}))
        container.start()
        _wait_for_port(ip, container)
        yield SshNode(container, ip, Path(f"{host_key}.pub").read_text().strip())
    finally:
        container.remove(force=True)
