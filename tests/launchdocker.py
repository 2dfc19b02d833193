"""The standalone launch script's Docker world: an image of a real vLLM release's Python files on
Ray with a recording `vllm` stand-in (tests/fixtures/vllm-standin.py), a recipe repository with a
test mod and the real int8-lm-head and chat-template mods, and what a node must hold once patched.
Its fixtures (vllm_py_files, launch_image, launch) are registered in conftest.py."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
import textwrap
import uuid
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import docker
import docker.errors
import pytest

from dockerimg import build_vllm_image, default_build_metadata
from modfactory import make_mod, unified
from sparkmods.cli import main
from sparkmods.runtime.manifest import load_manifest
from sparkmods.runtime.modcheck import check_mod
from sparkmods.sources import open_targets
from sparkmods.sync import sync

REPO = Path(__file__).resolve().parents[1]
STANDIN = Path(__file__).resolve().parent / "fixtures" / "vllm-standin.py"
WHEEL_VERSION = "0.19.1"
IMAGE_VERSION = "0.19.1.dev0+g2a69949bd.d20260404"  # a community-style source build of 0.19.1's files
PATCHED_FILE = "vllm/logger.py"  # what the test mod changes
REAL_MODS = ("int8-lm-head", "chat-template")
MARK = "# sparkmods launch test: applied\n"
SECRET = "hf_launch_test_secret"
TEMPLATE = "qwen3.5-sparkmods.jinja"
RECIPE = textwrap.dedent('''\
    recipe_version: "1"
    name: Launch test
    container: {image}
    mods:
      - mods/launch-demo
      - mods/int8-lm-head
      - mods/chat-template
    defaults:
      port: 8000
      host: 0.0.0.0
      tensor_parallel: 1
    env:
      LAUNCH_TEST_NOTE: two words, one value
    command: |
      vllm serve /models/Qwen3.5-launch-test \\
        --host {{host}} --port {{port}} \\
        --tensor-parallel-size {{tensor_parallel}} \\
        --no-enable-prefix-caching \\
        --chat-template {template} \\
        --speculative-config '{{{{"method": "mtp", "num_speculative_tokens": 2}}}}'
    ''')


def _vllm_source():
    """The release's files: the shared wheel copy when present, else range reads from PyPI."""
    wheels = sorted((Path("/tmp/wheels") / WHEEL_VERSION).glob(f"vllm-{WHEEL_VERSION}-*.whl"))
    return open_targets(f"wheel:{wheels[0]}" if wheels else f"pypi:{WHEEL_VERSION}")[0]


@pytest.fixture(scope="module")
def vllm_py_files() -> Dict[str, bytes]:
    source = _vllm_source()
    names = [n for n in source.list_files() if n.startswith("vllm/") and n.endswith(".py")]
    source.prefetch(names)
    return {n: source.read(n) for n in names}


def _standin_layer(client: docker.DockerClient, base: str) -> str:
    """base + /usr/local/bin/vllm = the stand-in; rebuilt only when either changes."""
    script = STANDIN.read_bytes()
    content = hashlib.sha256(client.images.get(base).id.encode() + script).hexdigest()[:12]
    tag = f"sparkmods-test-launch:{content}"
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data, mode in (("Dockerfile", f"FROM {base}\nCOPY vllm /usr/local/bin/vllm\n".encode(), 0o644),
                                 ("vllm", script, 0o755)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    client.images.build(fileobj=buf, custom_context=True, tag=tag, rm=True, pull=False)
    return tag


@pytest.fixture(scope="module")
def launch_image(docker_engine, ray_image, vllm_py_files) -> str:
    vllm_tag = build_vllm_image("sparkmods-test-launch-vllm:0.19.1", vllm_py_files, IMAGE_VERSION,
                                default_build_metadata(IMAGE_VERSION), base=ray_image, client=docker_engine)
    return _standin_layer(docker_engine, vllm_tag)


class Launch:
    """A recipe repository with a real patching mod and the real chat-template mod, one script run."""

    def __init__(self, tmp_path: Path, image: str, original: bytes) -> None:
        self.tmp = tmp_path
        self.root = tmp_path / "repo"
        mods = self.root / "mods"
        demo = make_mod(mods, "launch-demo", vllm=">=0.19.0,<0.20", verified='["0.19.1"]',
                        patch=unified(PATCHED_FILE, original.decode(), original.decode() + MARK))
        (demo / ".head-only").write_text("top-level dotfiles reach the head only, as with launch-cluster.sh\n")
        for name in REAL_MODS:
            subprocess.run(["cp", "-a", str(REPO / "mods" / name), str(mods)], check=True)
            sync(mods / name)  # run.sh and the runtime as `sparkmods sync` ships them
        (self.root / "launch" / "recipes").mkdir(parents=True)
        self.recipe = self.root / "launch" / "recipes" / "launch-test.yaml"
        self.recipe.write_text(RECIPE.format(image=image, template=TEMPLATE))
        self.script = tmp_path / "launch.sh"
        self.report = tmp_path / "report"
        self.report.mkdir()
        self.prefix = f"sparkmods-test-{uuid.uuid4().hex[:8]}"
        self.network: Optional[str] = None

    def generate(self, *layout: str) -> None:
        code = main(["launch", str(self.recipe), *layout, "--standalone",
                     "--pass-env", "STANDIN_SLEEP", "--pass-env", "STANDIN_EXIT",
                     "--pass-env", "STANDIN_WAIT_REPORTS", "-o", str(self.script)])
        assert code == 0

    def env(self, **extra: str) -> Dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARKMODS_", "STANDIN_"))}
        env.update(HF_TOKEN=SECRET, SPARKMODS_CONTAINER=self.prefix, SPARKMODS_GPUS="",
                   SPARKMODS_HF_CACHE=str(self.tmp / "hf"), SPARKMODS_DOCKER_ARGS=f"-v {self.report}:/report",
                   SPARKMODS_RAY_TIMEOUT="120",
                   # The default adds --privileged and --ulimit memlock=-1 (for RDMA/NCCL); sandboxed
                   # engines (CI VMs) refuse both, and nothing here needs them.
                   SPARKMODS_DOCKER_RUN_ARGS="--ipc host --shm-size 1g")
        if self.network:
            env["SPARKMODS_DOCKER_NETWORK"] = self.network
        env.update(extra)
        return env

    def run(self, timeout: int = 300, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(self.script)], env=self.env(**extra), capture_output=True, text=True,
                              timeout=timeout)

    def reports(self) -> List[dict]:
        return [json.loads(p.read_text()) for p in sorted(self.report.glob("serve-*.json"))]

    def containers(self, client: docker.DockerClient) -> List[str]:
        return [c.name for c in client.containers.list(all=True, filters={"name": self.prefix})]


@pytest.fixture
def launch(tmp_path, docker_engine, launch_image, vllm_py_files) -> Iterator[Launch]:
    run = Launch(tmp_path, launch_image, vllm_py_files[PATCHED_FILE])
    yield run
    for name in run.containers(docker_engine):  # only if a test failed half-way
        docker_engine.containers.get(name).remove(force=True)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def expected_changes(launch: Launch, original_files: Dict[str, bytes]) -> Dict[str, str]:
    """path -> sha256 after all mods, as the host engine (sparkmods check) computes them."""
    files = dict(original_files)
    for name in ("launch-demo", *REAL_MODS):
        folder = launch.root / "mods" / name
        result = check_mod(load_manifest(folder), folder, IMAGE_VERSION, files.get)
        assert result.status == "ok", (name, result.reason)
        for path, after in result.changes().items():
            files[path] = after
    return {p: sha(data) for p, data in files.items() if original_files.get(p) != data}


def assert_node_patched(node: dict, head: bool, launch: Launch, original_files: Dict[str, bytes]) -> None:
    changed = expected_changes(launch, original_files)
    assert PATCHED_FILE in changed and "vllm/model_executor/layers/logits_processor.py" in changed
    assert {p: node["vllm_files"].get(p) for p in changed} == changed
    assert node["vllm_files"]["vllm/__init__.py"] == sha(original_files["vllm/__init__.py"])
    template = (REPO / "mods" / "chat-template" / "files" / TEMPLATE).read_bytes()
    assert node["workspace_files"][TEMPLATE] == sha(template)
    assert "run.sh" in node["mods"]["launch-demo"] and "_sparkmods.py" in node["mods"]["launch-demo"]
    assert (".head-only" in node["mods"]["launch-demo"]) is head


def serve_args(argv: List[str]) -> Dict[str, str]:
    return {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--") and not argv[i + 1].startswith("--")}
