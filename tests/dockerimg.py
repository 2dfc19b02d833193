"""Real Docker images for the docker-marked tests: a Debian base, vLLM-like images, a Ray image.

No registry is reachable from CI, so the base image is a `debootstrap` rootfs imported with
`docker import`. Every image is tagged by a hash of what went into it, so a machine builds each
one once; the rootfs tarball and the Ray wheels are cached under ~/.cache/sparkmods/docker/
(override with SPARKMODS_DOCKER_CACHE). Builds hold a file lock so parallel pytest workers wait
for one another instead of building twice.

The vLLM images mimic the community image where our code must not assume anything: vLLM lives
in /usr/local/lib/python3.12/dist-packages although the interpreter is Debian's 3.11 (a .pth file
puts that folder on sys.path), WORKDIR is /workspace/vllm, /workspace/build-metadata.yaml is
optional. `run_mod_like_launch_cluster` applies a mod the way launch-cluster.sh --apply-mod does.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import docker
import docker.errors
import pytest
import yaml
from docker.models.containers import Container

BASE_REPO = "sparkmods-test-base"
RAY_REPO = "sparkmods-test-ray"
RAY_VERSION = "2.60.0"
SITE_DIR = "/usr/local/lib/python3.12/dist-packages"  # the community image's layout
WORKDIR = "/workspace/vllm"
MODS_DIR = "/workspace/mods"
CONTENT_LABEL = "org.sparkmods.content"
STAGE_LABEL = "org.sparkmods.stage"

DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = os.environ.get("SPARKMODS_DEBIAN_MIRROR", "http://deb.debian.org/debian")
DEBOOTSTRAP_INCLUDE = ["python3"]  # bash is Essential: minbase always has it
# Rootfs paths (globs) that tests never need: apt indexes and caches, docs, translations.
ROOTFS_TRIM = [
    "var/cache/apt/*.bin", "var/cache/apt/archives/*.deb", "var/lib/apt/lists/*_*",
    "usr/share/doc/*", "usr/share/man/*", "usr/share/info/*", "usr/share/locale/*",
]
PTH_NAME = "sparkmods-py312-site.pth"
BASE_CHANGES = [
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["bash"]',
]
BUILD_RECIPE_VERSION = 1  # bump when the build steps below change in a way the hashes miss

VllmFiles = Union[Mapping[str, bytes], Path]


def cache_dir() -> Path:
    """Where rootfs tarballs, .deb files and wheels are kept between runs."""
    path = Path(os.environ.get("SPARKMODS_DOCKER_CACHE", Path.home() / ".cache" / "sparkmods" / "docker"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


@contextmanager
def _build_lock() -> Iterator[None]:
    """One image build at a time per machine (pytest-xdist workers share the cache)."""
    with open(cache_dir() / "build.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _image_exists(client: docker.DockerClient, ref: str) -> bool:
    try:
        client.images.get(ref)
    except docker.errors.ImageNotFound:
        return False
    return True


# --- the base image ---------------------------------------------------------------------------

def base_image_tag() -> str:
    """`sparkmods-test-base:<hash of the recipe>`; the same recipe gives the same tag."""
    recipe = (BUILD_RECIPE_VERSION, DEBIAN_SUITE, "minbase", DEBOOTSTRAP_INCLUDE, platform.machine(),
              ROOTFS_TRIM, SITE_DIR, BASE_CHANGES)
    return f"{BASE_REPO}:{_digest(*recipe)[:12]}"


def _unmount_below(root: Path) -> None:
    """Undo mounts a failed debootstrap left in root, so deleting root cannot reach the host."""
    prefix = str(root.resolve()) + "/"
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts]
    for point in sorted((p for p in points if p.startswith(prefix)), reverse=True):
        subprocess.run(["umount", "-l", point], check=False)


def _trim_rootfs(root: Path) -> None:
    for pattern in ROOTFS_TRIM:
        for path in root.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()


def _add_site_dir_pth(root: Path) -> None:
    """Let the image's python3 see SITE_DIR, as the 3.12 interpreter of the real image would
    (nothing to do where the interpreter is that one: Ubuntu 24.04's)."""
    out = subprocess.run(["chroot", str(root), "python3", "-c", "import site; print(site.getsitepackages()[0])"],
                         check=True, capture_output=True, text=True).stdout.strip()
    if out == SITE_DIR:
        return
    site_dir = root / out.lstrip("/")
    site_dir.mkdir(parents=True, exist_ok=True)
    (site_dir / PTH_NAME).write_text(SITE_DIR + "\n")


def build_rootfs_tarball(dest: Path, include: Sequence[str] = tuple(DEBOOTSTRAP_INCLUDE), *,
                         suite: str = DEBIAN_SUITE, mirror: str = DEBIAN_MIRROR,
                         extra: Sequence[str] = (), script: Optional[str] = None) -> None:
    """debootstrap a minimal Debian with the packages include (and their dependencies) into the tarball dest.

    Needs root. Other images (tests/sshnode.py) pass a longer include list for their own rootfs;
    the sandbox image passes Ubuntu's suite, mirror, keyring (extra) and debootstrap script.
    """
    if os.geteuid() != 0:
        raise RuntimeError(f"building {dest.name} needs root (debootstrap); run the docker tests as root "
                           "or copy a tarball built elsewhere to that path")
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap not found: run ci/setup-docker.sh as root")
    work = Path(tempfile.mkdtemp(prefix="rootfs-", dir=dest.parent))
    root = work / "root"
    debs = cache_dir() / "debs"
    debs.mkdir(exist_ok=True)
    cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(include)}",
           f"--cache-dir={debs}", *extra, suite, str(root), mirror] + ([script] if script else [])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
            raise RuntimeError(f"debootstrap {suite} from {mirror} failed "
                               f"(set SPARKMODS_DEBIAN_MIRROR or SPARKMODS_UBUNTU_MIRROR for another mirror):\n{tail}")
        _trim_rootfs(root)
        _add_site_dir_pth(root)
        partial = work / "rootfs.tar"
        subprocess.run(["tar", "--numeric-owner", "--exclude=./dev/*", "-C", str(root), "-cf", str(partial), "."],
                       check=True)
        os.replace(partial, dest)
    finally:
        _unmount_below(root)
        shutil.rmtree(work, ignore_errors=True)


def ensure_base_image(client: docker.DockerClient) -> str:
    """The base image tag, building the rootfs and importing it if this machine lacks them."""
    tag = base_image_tag()
    with _build_lock():
        if _image_exists(client, tag):
            return tag
        tarball = cache_dir() / f"rootfs-{tag.split(':')[1]}.tar"
        if not tarball.exists():
            build_rootfs_tarball(tarball)
        repo, version = tag.split(":")
        client.api.import_image(src=str(tarball), repository=repo, tag=version, changes=BASE_CHANGES)
        client.images.get(tag).tag(repo, "latest")
    return tag


# --- building on top of the base --------------------------------------------------------------

def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
    tar.addfile(info)


def _build(client: docker.DockerClient, tag: str, dockerfile: str, files: Mapping[str, bytes],
           dirs: Tuple[str, ...] = (), extra: Optional[Mapping[str, Path]] = None) -> None:
    """docker build from an in-memory context: Dockerfile, files, empty dirs, host files (extra)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        _add_bytes(tar, "Dockerfile", dockerfile.encode())
        for name in dirs:
            _add_dir(tar, name)
        for name, data in sorted(files.items()):
            _add_bytes(tar, name, data)
        for name, path in sorted((extra or {}).items()):
            tar.add(str(path), arcname=name)
    buf.seek(0)
    try:
        client.images.build(fileobj=buf, custom_context=True, tag=tag, rm=True, forcerm=True, pull=False)
    except docker.errors.BuildError as exc:
        log = "".join(str(chunk.get("stream", chunk.get("error", ""))) for chunk in exc.build_log)
        raise RuntimeError(f"docker build of {tag} failed: {exc.msg}\n{log[-3000:]}") from exc


def _site_files(vllm_files: VllmFiles) -> Dict[str, bytes]:
    """vllm_files as {site-relative path: bytes}; a folder's own vllm-*.dist-info is left out."""
    if isinstance(vllm_files, Path):
        if not (vllm_files / "vllm").is_dir():
            raise ValueError(f"{vllm_files}: not a site-packages tree (no vllm/ folder)")
        return {p.relative_to(vllm_files).as_posix(): p.read_bytes()
                for p in sorted(vllm_files.rglob("*"))
                if p.is_file() and not re.match(r"vllm-[^/]*\.dist-info/", p.relative_to(vllm_files).as_posix())
                and "__pycache__" not in p.parts}
    files = dict(vllm_files)
    for name in files:
        if name.startswith("/") or ".." in name.split("/") or not name.startswith("vllm/"):
            raise ValueError(f"vllm_files key {name!r}: use a package path such as vllm/__init__.py")
    return files


def default_build_metadata(version: str, base_image: str = "nvcr.io/nvidia/pytorch:26.01-py3") -> dict:
    """build-metadata.yaml fields as the community image writes them (commit from +g<hash>, date from .dYYYYMMDD)."""
    commit = re.search(r"\+g([0-9a-f]+)", version)
    day = re.search(r"\.d(\d{4})(\d\d)(\d\d)\b", version)
    return {
        "vllm_version": version,
        "vllm_commit": commit.group(1) if commit else None,
        "build_date": f"{day.group(1)}-{day.group(2)}-{day.group(3)}T00:00:00Z" if day else None,
        "base_image": base_image,
        "build_args": {"vllm_ref": commit.group(1) if commit else f"v{version}"},
    }


def build_vllm_image(tag: str, vllm_files: VllmFiles, version: str, build_metadata: Optional[dict] = None,
                     *, base: Optional[str] = None, client: Optional[docker.DockerClient] = None) -> str:
    """An image with the given vLLM files and a vllm-<version>.dist-info under SITE_DIR.

    vllm_files maps package paths (vllm/...) to bytes, or is a site-packages folder. base defaults to
    the test base image (pass the Ray image for launch tests). Rebuilt only when the content changes.
    """
    site = _site_files(vllm_files)
    client = client or docker.from_env()
    base = base or ensure_base_image(client)
    site[f"vllm-{version}.dist-info/METADATA"] = f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n\n".encode()
    files = {f"site/{name}": data for name, data in site.items()}
    if build_metadata is not None:
        files["workspace/build-metadata.yaml"] = yaml.safe_dump(build_metadata, sort_keys=False).encode()
    content = _digest(BUILD_RECIPE_VERSION, client.images.get(base).id, SITE_DIR,
                      {name: hashlib.sha256(data).hexdigest() for name, data in files.items()})
    with _build_lock():
        try:
            if client.images.get(tag).labels.get(CONTENT_LABEL) == content:
                return tag
        except docker.errors.ImageNotFound:
            pass
        dockerfile = (f"FROM {base}\nCOPY site/ {SITE_DIR}/\nCOPY workspace/ /workspace/\n"
                      f"WORKDIR {WORKDIR}\nLABEL {CONTENT_LABEL}={content}\n")
        _build(client, tag, dockerfile, files, dirs=("workspace", "workspace/vllm", "workspace/mods"))
    return tag


# --- the Ray image ----------------------------------------------------------------------------

def _image_python(client: docker.DockerClient, image: str) -> Tuple[str, Tuple[int, int], str]:
    """(python X.Y, glibc (major, minor), machine) of image, to pick wheels that run in it."""
    out = client.containers.run(image, ["python3", "-c", "import platform, sys; print(sys.version_info[0], "
                                        "sys.version_info[1], platform.libc_ver()[1], platform.machine())"],
                                remove=True).decode().split()
    glibc = tuple(int(n) for n in out[2].split("."))
    return f"{out[0]}.{out[1]}", (glibc[0], glibc[1]), out[3]


def download_wheels(requirements: List[str], python: str, glibc: Tuple[int, int], machine: str) -> Path:
    """Wheels for requirements (and pip itself) that install on that Python and glibc, cached.

    Downloaded on the host: build containers may lack the host's proxy CA, and a cached wheelhouse
    makes rebuilds offline.
    """
    key = _digest(requirements, python, glibc, machine)[:12]
    dest = cache_dir() / "wheels" / key
    if dest.is_dir():
        return dest
    dest.parent.mkdir(exist_ok=True)
    nodot = python.replace(".", "")
    platforms = [f"manylinux2014_{machine}"] + [f"manylinux_2_{m}_{machine}" for m in range(17, glibc[1] + 1)]
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--python-version", python,
           "--implementation", "cp", "--abi", f"cp{nodot}", "--abi", "abi3", "--abi", "none"]
    cmd += [arg for plat in platforms for arg in ("--platform", plat)]
    partial = Path(tempfile.mkdtemp(prefix="wheels-", dir=dest.parent))
    try:
        proc = subprocess.run(cmd + ["-d", str(partial), "pip", *requirements], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"pip download {' '.join(requirements)} for cp{nodot} {machine} failed:\n"
                               f"{proc.stderr[-2000:]}")
        os.replace(partial, dest)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return dest


def ensure_ray_image(client: docker.DockerClient, ray_version: str = RAY_VERSION) -> str:
    """`sparkmods-test-ray:<hash>`: the base image plus `pip install ray==ray_version`."""
    base = ensure_base_image(client)
    base_id = client.images.get(base).id
    tag = f"{RAY_REPO}:{_digest(BUILD_RECIPE_VERSION, base_id, ray_version)[:12]}"
    with _build_lock():
        if _image_exists(client, tag):
            return tag
        wheels = download_wheels([f"ray=={ray_version}"], *_image_python(client, base))
        pip_wheel = next(wheels.glob("pip-*.whl")).name
        # Install in a throw-away stage so the wheel files do not stay in a layer of the result.
        dockerfile = (
            f"FROM {base} AS install\nLABEL {STAGE_LABEL}=ray-install\nCOPY wheels/ /tmp/wheels/\n"
            f"RUN python3 /tmp/wheels/{pip_wheel}/pip install --no-index --find-links /tmp/wheels --no-cache-dir"
            f" --break-system-packages --root-user-action=ignore --disable-pip-version-check ray=={ray_version}\n"
            f"FROM {base}\nCOPY --from=install /usr/local /usr/local\n"
        )
        _build(client, tag, dockerfile, {}, extra={"wheels": wheels})
        # The classic builder keeps the install stage as an untagged image: drop it.
        client.images.prune(filters={"dangling": True, "label": f"{STAGE_LABEL}=ray-install"})
        client.images.get(tag).tag(RAY_REPO, "latest")
    return tag


# --- containers and mods ----------------------------------------------------------------------

@contextmanager
def running_container(client: docker.DockerClient, image: str, **run_kwargs) -> Iterator[Container]:
    """A container idling like launch-cluster.sh's (`sleep infinity`), removed afterwards."""
    container = client.containers.run(image, ["sleep", "infinity"], detach=True, **run_kwargs)
    try:
        yield container
    finally:
        container.remove(force=True)


@dataclass(frozen=True)
class ModRun:
    exit_code: int
    output: str  # stdout and stderr, interleaved as the launcher's terminal shows them


def _owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def mod_archive(mod_dir: Path, worker: bool) -> bytes:
    """The mod folder's content as a tar, as it reaches a node.

    Head: `docker cp dir/.` (everything, symlinks kept). Worker: `scp -r dir/*` first, so top-level
    dotfiles are dropped and symlinks are followed.
    """
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", dereference=worker) as tar:
        for entry in sorted(mod_dir.iterdir()):
            if worker and entry.name.startswith("."):
                continue
            tar.add(str(entry), arcname=entry.name, filter=_owned_by_root)
    return buf.getvalue()


def run_mod_like_launch_cluster(container: Container, mod_dir: Path, *, worker: bool = True) -> ModRun:
    """Apply mod_dir to container exactly as `launch-cluster.sh --apply-mod` does.

    Copies it to /workspace/mods/<basename> (worker copy semantics by default: the stricter one),
    then runs `export WORKSPACE_DIR=$PWD && cd ... && chmod +x run.sh && ./run.sh` as root from the
    container's WORKDIR.
    """
    mod_dir = Path(mod_dir)
    if not (mod_dir / "run.sh").is_file():
        raise ValueError(f"{mod_dir}: a mod folder must contain run.sh")
    dest = f"{MODS_DIR}/{mod_dir.name}"
    code, out = container.exec_run(["mkdir", "-p", dest], workdir="/")
    if code != 0:
        raise RuntimeError(f"mkdir -p {dest} in {container.name} failed: {out.decode(errors='replace')}")
    container.put_archive(dest, mod_archive(mod_dir, worker))
    script = f"export WORKSPACE_DIR=$PWD && cd {dest} && chmod +x run.sh && ./run.sh"
    code, out = container.exec_run(["bash", "-c", script], user="root")
    return ModRun(code, out.decode(errors="replace"))


# --- pytest fixtures (import them in tests/conftest.py) ---------------------------------------

@pytest.fixture(scope="session")
def docker_engine() -> docker.DockerClient:
    """A client of a Docker engine that answers; skip (or fail in CI) when there is none."""
    try:
        client = docker.from_env(timeout=300)
        client.ping()
    except docker.errors.DockerException as exc:
        where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        reason = f"no Docker engine answers at {where} ({str(exc)[:160]}); run ci/setup-docker.sh as root"
        if os.environ.get("SPARKMODS_REQUIRE_DOCKER") == "1":
            pytest.fail(reason + " (SPARKMODS_REQUIRE_DOCKER=1)")
        pytest.skip(reason)
    return client


@pytest.fixture(scope="session")
def base_image(docker_engine: docker.DockerClient) -> str:
    """Tag of the Debian + python3 base image (built once per machine)."""
    return ensure_base_image(docker_engine)


@pytest.fixture(scope="session")
def ray_image(docker_engine: docker.DockerClient) -> str:
    """Tag of the base image with Ray installed (built once per machine)."""
    return ensure_ray_image(docker_engine)


# --- the sandbox image (sparkmods check --community runs mods in it) --------------------------

SANDBOX_REPO = "sparkmods-sandbox"
# The community image is Ubuntu 24.04 (its Python 3.12 reports /usr/local/lib/python3.12/dist-packages
# through sysconfig and site, which mods use to find vLLM), so the sandbox is too.
UBUNTU_SUITE = "noble"
UBUNTU_MIRROR = os.environ.get("SPARKMODS_UBUNTU_MIRROR", "http://archive.ubuntu.com/ubuntu")
UBUNTU_SCRIPT = "/usr/share/debootstrap/scripts/gutsy"  # debootstrap's script for every Ubuntu suite
# Ubuntu's archive key, for a Debian host that lacks ubuntu-keyring: the package, pinned by hash,
# over HTTPS, and only the key with this fingerprint is trusted.
UBUNTU_KEYRING_DEB = ("https://archive.ubuntu.com/ubuntu/pool/main/u/ubuntu-keyring/ubuntu-keyring_2023.11.28.1_all.deb",
                      "36de43b15853ccae0028e9a767613770c704833f82586f28eb262f0311adb8a8")
UBUNTU_ARCHIVE_KEY = "F6ECB3762474EDA9D21B7022871920D1991BC93C"  # Ubuntu Archive Automatic Signing Key (2018)
# What community run.sh files call besides bash and coreutils: python3, patch, git apply, sed/awk/grep
# (minbase has them), curl and wget (they fail: the sandbox has no network, as a finding should).
SANDBOX_INCLUDE = ["python3", "patch", "git", "curl", "wget", "ca-certificates"]
SANDBOX_CHANGES = BASE_CHANGES[:-1] + [
    "ENV PATH=/workspace/vllm:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV VLLM_BASE_DIR=/workspace/vllm", "ENV PIP_BREAK_SYSTEM_PACKAGES=1", f"WORKDIR {WORKDIR}", 'CMD ["bash"]',
]


def sandbox_image_tag() -> str:
    recipe = (BUILD_RECIPE_VERSION, UBUNTU_SUITE, "minbase", SANDBOX_INCLUDE, platform.machine(),
              ROOTFS_TRIM, SITE_DIR, SANDBOX_CHANGES, UBUNTU_ARCHIVE_KEY)
    return f"{SANDBOX_REPO}:{_digest(*recipe)[:12]}"


def ubuntu_keyring() -> Path:
    """A keyring holding only Ubuntu's archive key (checked by fingerprint), cached."""
    dest = cache_dir() / f"ubuntu-archive-{UBUNTU_ARCHIVE_KEY[-16:]}.gpg"
    if dest.is_file():
        return dest
    url, sha = UBUNTU_KEYRING_DEB
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        deb = Path(tmp) / "keyring.deb"
        subprocess.run(["curl", "-fsS", "--proto", "=https", "-o", str(deb), url], check=True)
        if hashlib.sha256(deb.read_bytes()).hexdigest() != sha:
            raise RuntimeError(f"{url}: sha256 is not the pinned {sha}")
        subprocess.run(["dpkg-deb", "-x", str(deb), str(Path(tmp) / "x")], check=True)
        gpg = ["gpg", "--homedir", tmp, "--batch", "--no-default-keyring", "--keyring",
               str(Path(tmp) / "x/usr/share/keyrings/ubuntu-archive-keyring.gpg")]
        key = subprocess.run(gpg + ["--export", UBUNTU_ARCHIVE_KEY], check=True, capture_output=True).stdout
        if not key:
            raise RuntimeError(f"{url}: no key {UBUNTU_ARCHIVE_KEY} in ubuntu-archive-keyring.gpg")
        (Path(tmp) / "only.gpg").write_bytes(key)
        os.replace(Path(tmp) / "only.gpg", dest)
    return dest


def ensure_sandbox_image(client: docker.DockerClient) -> str:
    """`sparkmods-sandbox:<hash>` (also tagged :latest, the name sparkmods looks for), built once."""
    tag = sandbox_image_tag()
    repo, version = tag.split(":")
    with _build_lock():
        if not _image_exists(client, tag):
            tarball = cache_dir() / f"rootfs-{version}.tar"
            if not tarball.exists():
                build_rootfs_tarball(tarball, SANDBOX_INCLUDE, suite=UBUNTU_SUITE, mirror=UBUNTU_MIRROR,
                                     extra=[f"--keyring={ubuntu_keyring()}"], script=UBUNTU_SCRIPT)
            client.api.import_image(src=str(tarball), repository=repo, tag=version, changes=SANDBOX_CHANGES)
        client.images.get(tag).tag(repo, "latest")
    return tag


@pytest.fixture(scope="session")
def sandbox_image(docker_engine: docker.DockerClient) -> str:
    """Tag of the image community mods run in (built once per machine)."""
    return ensure_sandbox_image(docker_engine)
