"""The Docker test infrastructure works: images as our code will meet them, mods applied as the launcher does."""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
from pathlib import Path
from typing import Dict, Set

import pytest
import yaml

import dockerimg
from dockerimg import (
    SITE_DIR,
    build_vllm_image,
    default_build_metadata,
    mod_archive,
    run_mod_like_launch_cluster,
    running_container,
)
from modfactory import make_site
from sparkmods.sources import open_targets

docker = pytest.mark.docker

WHEEL_VERSION = "0.19.1"
# The files come from the 0.19.1 release; the image calls itself a community dev build, whose
# local version (+g<commit>.d<date>) is what our dist-info and build-metadata handling must survive.
IMAGE_VERSION = "0.19.1.dev0+g2a69949bd.d20260404"
REAL_FILES = [
    "vllm/__init__.py",
    "vllm/model_executor/layers/logits_processor.py",
    "vllm/model_executor/layers/quantization/inc.py",
]
RUNTIME = Path(__file__).resolve().parents[1] / "tools" / "sparkmods" / "runtime"


def _real_source():
    """vLLM WHEEL_VERSION through the sources layer: a local wheel when there is one
    ($SPARKMODS_TEST_VLLM_WHEEL or the shared /tmp/wheels copy), else PyPI by range requests."""
    wheel = os.environ.get("SPARKMODS_TEST_VLLM_WHEEL") or next(
        iter(sorted((Path("/tmp/wheels") / WHEEL_VERSION).glob(f"vllm-{WHEEL_VERSION}-*.whl"))), None)
    return open_targets(f"wheel:{wheel}" if wheel else f"pypi:{WHEEL_VERSION}")[0]


@pytest.fixture(scope="module")
def real_files() -> Dict[str, bytes]:
    source = _real_source()
    source.prefetch(REAL_FILES)
    files = {name: source.read(name) for name in REAL_FILES}
    assert all(files.values()), f"{source.label} lacks one of {REAL_FILES}"
    return files


@pytest.fixture(scope="module")
def vllm_image(docker_engine, real_files) -> str:
    return build_vllm_image("sparkmods-test-vllm:infra", real_files, IMAGE_VERSION,
                            default_build_metadata(IMAGE_VERSION), client=docker_engine)


def _exec(container, *cmd: str) -> str:
    code, out = container.exec_run(list(cmd))
    text = out.decode(errors="replace")
    assert code == 0, f"{cmd} exited {code}: {text}"
    return text


def _listing(container, folder: str) -> Set[str]:
    """'relative/path type' for everything below folder (type f, d or l, as find prints it)."""
    return set(_exec(container, "find", folder, "-mindepth", "1", "-printf", "%P %y\n").split("\n")) - {""}


def _read(container, path: str) -> bytes:
    stream, _ = container.get_archive(path)
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
        return tar.extractfile(tar.getmembers()[0]).read()


@docker
def test_base_image_is_small_debian_with_python_and_bash(docker_engine, base_image):
    out = docker_engine.containers.run(
        base_image, ["bash", "-c", 'python3 -c "import sys; print(sys.version_info[0])"; echo "bash=$BASH_VERSION"'],
        remove=True).decode()
    assert out.split()[0] == "3" and "bash=5" in out
    assert docker_engine.images.get(base_image).attrs["Size"] < 200 * 2**20
    assert dockerimg.ensure_base_image(docker_engine) == base_image  # cached: same tag, no rebuild


@docker
def test_vllm_image_looks_like_the_community_image(docker_engine, vllm_image, real_files):
    probe = ("import importlib.metadata as m, importlib.util as u, json, os, sys;"
             "print(json.dumps([u.find_spec('vllm').origin, m.version('vllm'), os.getcwd(), sys.version_info[:2]]))")
    with running_container(docker_engine, vllm_image) as box:
        origin, version, cwd, pyver = json.loads(_exec(box, "python3", "-c", probe))
        assert origin == f"{SITE_DIR}/vllm/__init__.py"
        assert version == IMAGE_VERSION
        assert cwd == "/workspace/vllm"
        assert pyver != [3, 12]  # SITE_DIR's 3.12 is a layout fact, not the interpreter: no path may assume it
        logits = "vllm/model_executor/layers/logits_processor.py"
        assert _read(box, f"{SITE_DIR}/{logits}") == real_files[logits]
        meta = yaml.safe_load(_read(box, "/workspace/build-metadata.yaml"))
        assert meta["vllm_commit"] == "2a69949bd" and meta["build_args"]["vllm_ref"] == "2a69949bd"
        assert _exec(box, "ls", "-A", "/workspace/mods") == ""
        # Our runtime's locator (stdlib only, the runtime package as a mod ships it) finds vLLM
        # from the interpreter alone.
        box.put_archive("/tmp", _tar({f"runtime/{f.name}": f.read_bytes() for f in RUNTIME.glob("*.py")}))
        found = _exec(box, "python3", "-c", "import sys; sys.path.insert(0, '/tmp'); from runtime import locate;"
                      "i = locate.find_vllm(); print(i.site, i.version)").split()
        assert found == [SITE_DIR, IMAGE_VERSION]


@docker
def test_vllm_image_is_rebuilt_only_when_its_content_changes(docker_engine, vllm_image, real_files):
    first = docker_engine.images.get(vllm_image).id
    same = build_vllm_image(vllm_image, real_files, IMAGE_VERSION, default_build_metadata(IMAGE_VERSION),
                            client=docker_engine)
    assert docker_engine.images.get(same).id == first
    other = build_vllm_image("sparkmods-test-vllm:infra-nometa", real_files, IMAGE_VERSION, client=docker_engine)
    assert docker_engine.images.get(other).id != first
    with running_container(docker_engine, other) as box:
        code, _ = box.exec_run(["test", "-e", "/workspace/build-metadata.yaml"])
        assert code == 1


@docker
def test_vllm_image_from_a_site_tree_keeps_only_the_given_version(docker_engine, tmp_path, real_files):
    site = make_site(tmp_path / "site", version="0.18.0")  # its own dist-info must not shadow ours
    image = build_vllm_image("sparkmods-test-vllm:infra-tree", site, "0.19.1", client=docker_engine)
    with running_container(docker_engine, image) as box:
        listing = _exec(box, "ls", SITE_DIR).split()
    assert "vllm-0.19.1.dist-info" in listing and "vllm-0.18.0.dist-info" not in listing and "vllm" in listing


def test_vllm_files_must_be_package_paths():
    for bad in ("/etc/passwd", "vllm/../../etc/passwd", "torch/__init__.py"):
        with pytest.raises(ValueError, match="package path"):
            build_vllm_image("never-built", {bad: b""}, "0.19.1")


def test_default_build_metadata_reads_commit_and_date_from_a_dev_version():
    meta = default_build_metadata(IMAGE_VERSION)
    assert (meta["vllm_commit"], meta["build_date"], meta["build_args"]) == (
        "2a69949bd", "2026-04-04T00:00:00Z", {"vllm_ref": "2a69949bd"})
    assert default_build_metadata("0.19.1")["build_args"] == {"vllm_ref": "v0.19.1"}


def _tar(files: Dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


RUN_SH = """#!/bin/bash
set -eu
echo "workspace=$WORKSPACE_DIR"
echo "cwd=$PWD"
echo "uid=$(id -u)"
echo "from the mod" > "$WORKSPACE_DIR/from-mod.txt"
"""


@pytest.fixture
def mod_dir(tmp_path: Path) -> Path:
    """A tiny mod: run.sh without the exec bit (the launcher chmods it), a top-level dotfile, a nested
    dotfile and a symlink, the cases where head and worker copies differ."""
    mod = tmp_path / "tiny-mod"
    (mod / "sub").mkdir(parents=True)
    (mod / "run.sh").write_text(RUN_SH)
    (mod / "run.sh").chmod(0o644)
    (mod / ".hidden").write_text("top-level dotfile\n")
    (mod / "sub" / ".nested").write_text("nested dotfile\n")
    (mod / "sub" / "data.txt").write_text("data\n")
    (mod / "link.txt").symlink_to("sub/data.txt")
    return mod


def test_mod_archive_copies_like_scp_to_workers_and_docker_cp_on_the_head(mod_dir):
    def members(worker: bool) -> Dict[str, str]:
        with tarfile.open(fileobj=io.BytesIO(mod_archive(mod_dir, worker))) as tar:
            return {m.name: "l" if m.issym() else "d" if m.isdir() else "f" for m in tar.getmembers()}
    worker = members(True)
    assert ".hidden" not in worker and worker["sub/.nested"] == "f" and worker["link.txt"] == "f"
    head = members(False)
    assert head[".hidden"] == "f" and head["link.txt"] == "l"


@docker
def test_mod_runs_like_launch_cluster_on_a_worker(docker_engine, vllm_image, mod_dir):
    with running_container(docker_engine, vllm_image) as box:
        for _ in range(2):  # containers are reused and mods re-run: the second apply must work too
            run = run_mod_like_launch_cluster(box, mod_dir)
            assert run.exit_code == 0, run.output
            assert run.output.splitlines() == ["workspace=/workspace/vllm", "cwd=/workspace/mods/tiny-mod", "uid=0"]
        assert _read(box, "/workspace/vllm/from-mod.txt") == b"from the mod\n"
        assert _listing(box, "/workspace/mods/tiny-mod") == {
            "run.sh f", "sub d", "sub/.nested f", "sub/data.txt f", "link.txt f"}


@docker
def test_mod_copy_on_the_head_keeps_dotfiles_and_symlinks(docker_engine, vllm_image, mod_dir):
    with running_container(docker_engine, vllm_image) as box:
        assert run_mod_like_launch_cluster(box, mod_dir, worker=False).exit_code == 0
        assert {".hidden f", "link.txt l"} <= _listing(box, "/workspace/mods/tiny-mod")


@docker
def test_failing_mod_reports_its_exit_code(docker_engine, vllm_image, tmp_path):
    mod = tmp_path / "broken"
    mod.mkdir()
    (mod / "run.sh").write_text("#!/bin/bash\necho 'anchor not found' >&2\nexit 3\n")
    with running_container(docker_engine, vllm_image) as box:
        run = run_mod_like_launch_cluster(box, mod)
    assert run.exit_code == 3 and "anchor not found" in run.output


@docker
def test_ray_image_starts_a_head_and_takes_vllm_files(docker_engine, ray_image, real_files):
    image = build_vllm_image("sparkmods-test-vllm:infra-ray", real_files, IMAGE_VERSION, base=ray_image,
                             client=docker_engine)
    with running_container(docker_engine, image, shm_size="256m") as box:
        _exec(box, "ray", "start", "--head", "--num-cpus=1", "--disable-usage-stats")
        deadline = time.monotonic() + 60
        while True:  # `ray status` answers "No cluster status" until the head has reported in
            code, out = box.exec_run(["ray", "status"])
            if (code == 0 and "/1.0 CPU" in out.decode()) or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert code == 0 and "Active:" in out.decode() and "/1.0 CPU" in out.decode(), out.decode()
        assert _exec(box, "python3", "-c", "import importlib.metadata as m; print(m.version('vllm'))").strip() \
            == IMAGE_VERSION
        _exec(box, "ray", "stop")
