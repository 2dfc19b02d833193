"""Judge a community mod by running it, the way launch-cluster.sh --apply-mod runs it, against a
target's vLLM files in a throwaway container, and report what it changed.

The launcher copies the mod folder to /workspace/mods/<name> and runs
`export WORKSPACE_DIR=$PWD && cd /workspace/mods/<name> && chmod +x run.sh && ./run.sh` as root
from the image's WORKDIR (/workspace/vllm), with vLLM in /usr/local/lib/python3.12/dist-packages.
Here each target's vllm/ tree (its text files, from a cache of release trees) is baked once into
an image on top of the sandbox image; a run is a container of it with no network, no
capabilities beyond file ownership, bounded memory and processes, and a tmpfs /tmp, removed
afterwards. Whatever the mod writes lands in the container's own throwaway layer, which
`docker diff` lists: the status is `applied` (vllm/ files changed), `no-change` (exit 0, nothing
written: the silent skip), `failed` (non-zero exit), `wrote-outside-vllm` (anything written
outside vllm/ and the mod's own folder; bytecode caches aside) or `timed-out`.

Results carry statuses, exit codes, vLLM paths and the output's last line (the mod's own words,
for the terminal only: callers that commit results keep counts).
"""

from __future__ import annotations

import hashlib
import io
import itertools
import os
import re
import shlex
import shutil
import stat
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from sparkmods.errors import SparkmodsError
from sparkmods.sources.base import check_member
from sparkmods.sources.cache import cache_root

if TYPE_CHECKING:
    from docker import DockerClient
    from docker.models.containers import Container

    from sparkmods.sources.base import VllmSource

__all__ = ["APPLIED", "NO_CHANGE", "FAILED", "OUTSIDE", "TIMED_OUT", "RUN_STATUSES", "SITE_DIR", "DEFAULT_IMAGE",
           "RunResult", "release_tree", "run_mod", "agrees", "sandbox_image", "fingerprint"]

APPLIED, NO_CHANGE, FAILED, OUTSIDE, TIMED_OUT = "applied", "no-change", "failed", "wrote-outside-vllm", "timed-out"
RUN_STATUSES = (APPLIED, NO_CHANGE, FAILED, OUTSIDE, TIMED_OUT)

SITE_DIR = "/usr/local/lib/python3.12/dist-packages"  # the community image's site-packages
WORKSPACE = "/workspace"
WORKDIR = "/workspace/vllm"  # the image's WORKDIR: $WORKSPACE_DIR for run.sh
MODS_DIR = "/workspace/mods"
DEFAULT_IMAGE = "sparkmods-sandbox:latest"
TREE_REPO = "sparkmods-sandbox-tree"  # the sandbox image with one vLLM tree in it
IMAGE_ENV = "SPARKMODS_SANDBOX_IMAGE"
DEFAULT_TIMEOUT = 120.0

# What a release tree holds: the text members of vllm/ (sources, configs, templates), not its
# binaries (compiled extensions, executables: no mod edits them, nothing in the sandbox could
# load them, and they are most of a wheel's bytes); each file and the whole bounded.
MAX_FILE = 8 << 20
MAX_TREE = 512 << 20
_TEXT_SUFFIXES = (".py", ".pyi", ".typed", ".json", ".jinja", ".j2", ".txt", ".md", ".yaml", ".yml", ".toml",
                  ".cfg", ".ini", ".csv", ".sh", ".js", ".css", ".html", ".cu", ".cuh", ".h", ".hpp", ".c",
                  ".cc", ".cpp", ".proto")
_TREE_FORMAT = 2  # bump when what a cached tree holds changes
RUN_VERSION = 1  # bump when a change here can change a run's status (stored community cells re-run)
_LOG_LINES = 20  # of a run's output only the end is read back: its last line is all a result keeps

# Static verdict -> the run statuses that agree with it (run.sh as the reader understood it).
_AGREE = {"ok": {APPLIED}, "ok-offset": {APPLIED}, "drift": {APPLIED}, "skipped": {NO_CHANGE, APPLIED},
          "applied": {NO_CHANGE}}


@dataclass
class RunResult:
    """What one run of a mod did to one vLLM tree."""

    status: str
    exit_code: Optional[int]
    last_line: str  # the output's last non-empty line (the mod's own words: terminal only)
    changed: List[Tuple[str, str]] = field(default_factory=list)  # (added|modified|deleted, vllm/... path)
    outside: List[str] = field(default_factory=list)  # container paths written outside vllm/
    seconds: float = 0.0
    after: Dict[str, Optional[bytes]] = field(default_factory=dict)  # with keep=True: changed files' new bytes

    def reason(self, timeout: float = DEFAULT_TIMEOUT) -> str:
        """One line for a table."""
        files = ", ".join(f"{p} ({op})" for op, p in self.changed[:4]) + (
            f" (+{len(self.changed) - 4} more)" if len(self.changed) > 4 else "")
        if self.status == TIMED_OUT:
            return f"still running after {timeout:g} s: killed"
        if self.status == OUTSIDE:
            more = f" (+{len(self.outside) - 3} more)" if len(self.outside) > 3 else ""
            return f"wrote outside vllm/: {', '.join(self.outside[:3])}{more}" + (
                f"; exit {self.exit_code}" if self.exit_code else "")
        if self.status == FAILED:
            return f"exit {self.exit_code}: {self.last_line}" + (f"; after changing {files}" if files else "")
        if self.status == APPLIED:
            return f"changed {files}"
        return "exit 0 and nothing written: the mod skipped itself"


def agrees(static_status: str, run_status: str) -> bool:
    """Whether the static reading of run.sh and its run tell the same story."""
    return run_status in _AGREE.get(static_status, {FAILED})


def sandbox_image(explicit: Optional[str] = None) -> str:
    return explicit or os.environ.get(IMAGE_ENV) or DEFAULT_IMAGE


def fingerprint(image: str) -> str:
    """Changes with RUN_VERSION or the image's name: stored cells of another run re-run."""
    return hashlib.sha256(f"{RUN_VERSION}:{image}".encode()).hexdigest()[:12]


# --- release trees -------------------------------------------------------------------------------

def _tree_members(names: List[str]) -> List[str]:
    return [n for n in names if n.startswith("vllm/") and n.endswith(_TEXT_SUFFIXES)]


def _private_dir(path: Path) -> Path:
    """path, created 0700; refused when another user owns it or may write into it."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise SparkmodsError(f"{path}: not a private folder of this user (owner {info.st_uid}, mode "
                             f"{stat.S_IMODE(info.st_mode):o}); remove it or set SPARKMODS_CACHE_DIR")
    return path


def _write_tree(source: VllmSource, dest: Path) -> None:
    names = _tree_members(source.list_files())
    if not names:
        raise SparkmodsError(f"{source.label}: no vllm/ files to run a mod against")
    source.prefetch(names)
    total = 0
    for name in names:
        check_member(source.label, name)
        data = source.read(name)
        if data is None:
            continue
        total += len(data)
        if len(data) > MAX_FILE or total > MAX_TREE:
            raise SparkmodsError(f"{source.label}: {name}: vLLM tree over {MAX_FILE >> 20} MiB a file or "
                                 f"{MAX_TREE >> 20} MiB in all; refusing to unpack it")
        path = dest / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    meta = dest / f"vllm-{source.version}.dist-info" / "METADATA"
    meta.parent.mkdir(parents=True)
    meta.write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {source.version}\n", encoding="utf-8")


def release_tree(source: VllmSource, scratch: Optional[Path] = None) -> Path:
    """The site-packages tree of this target (vllm/ and a dist-info), cached on disk by the
    target's content key; a target without one (a folder, an image) is unpacked into scratch."""
    key = source.content_key()
    if key is None:
        if scratch is None:
            raise SparkmodsError(f"{source.label}: no content key, and no scratch folder to unpack it into")
        dest = scratch / "tree"
        _write_tree(source, dest)
        return dest
    trees = _private_dir(cache_root() / "trees")
    dest = trees / f"{hashlib.sha256(key.encode()).hexdigest()[:40]}-{_TREE_FORMAT}"
    if (dest / ".complete").is_file():
        return dest / "site"
    partial = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=trees))
    try:
        _write_tree(source, partial / "site")
        (partial / ".complete").write_text(source.label + "\n", encoding="utf-8")
        try:
            os.rename(partial, dest)
        except OSError:  # another process finished it first
            if not (dest / ".complete").is_file():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return dest / "site"


# --- one run ------------------------------------------------------------------------------------

def _owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _bounded_read(path: Path) -> bytes:
    if path.stat().st_size > MAX_FILE:
        raise SparkmodsError(f"{path}: over {MAX_FILE >> 20} MiB; refusing to read it")
    return path.read_bytes()


def _client() -> DockerClient:
    import docker
    import docker.errors
    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except docker.errors.DockerException as exc:
        raise SparkmodsError(f"no Docker engine answers ({str(exc)[:120]}); running a community mod needs one "
                             "(or pass --static to read run.sh without running it)") from None
    return client


def check_image(image: str, client: Optional[DockerClient] = None) -> None:
    """A one-line error when the sandbox image is missing."""
    import docker.errors
    client = client or _client()
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise SparkmodsError(f"no sandbox image {image!r}: build it with `python3 ci/sandbox_image.py` (Debian, "
                             f"python3, bash, patch, git) or pass --sandbox-image IMAGE") from None


def _tree_digest(tree: Path) -> str:
    """The tree's content hash; stored beside a cached release tree (which never changes)."""
    stored = tree.parent / ".digest"
    cached = tree.parent.parent == cache_root() / "trees" and (tree.parent / ".complete").is_file()
    if cached and stored.is_file():
        return stored.read_text(encoding="ascii").strip()
    h = hashlib.sha256()
    for folder, dirs, names in os.walk(tree):
        dirs.sort()
        for name in sorted(names):
            path = Path(folder) / name
            h.update(f"{path.relative_to(tree).as_posix()}\0{path.stat().st_size}\0".encode())
            h.update(_bounded_read(path))
    if cached:
        stored.write_text(h.hexdigest() + "\n", encoding="ascii")
    return h.hexdigest()


def tree_image(tree: Path, image: str, client: Optional[DockerClient] = None) -> str:
    """An image of `image` with `tree` at SITE_DIR, built once per content: each run starts from it
    and writes into its own throwaway layer, so no run copies the tree."""
    import docker.errors
    client = client or _client()
    base = client.images.get(image).id
    if base is None:
        raise SparkmodsError(f"{image}: the Docker engine gives no id for it")
    tag = f"{TREE_REPO}:{hashlib.sha256((base + _tree_digest(tree)).encode()).hexdigest()[:20]}"
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        dockerfile = (f"FROM {base}\nCOPY site/ {SITE_DIR}/\nCOPY mods/ {MODS_DIR}/\nWORKDIR {WORKDIR}\n"
                      f"LABEL org.sparkmods.tree-of={image}\n").encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
        mods = tarfile.TarInfo("mods")
        mods.type, mods.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(mods)
        tar.add(str(tree), arcname="site")
    buf.seek(0)
    try:
        client.images.build(fileobj=buf, custom_context=True, tag=tag, rm=True, forcerm=True, pull=False)
    except docker.errors.BuildError as exc:
        raise SparkmodsError(f"building the image of a vLLM tree on {image} failed: {exc.msg}") from None
    return tag


def _leaves(changes: List[dict]) -> List[dict]:
    """docker diff's entries without the folders it lists only because something below changed."""
    paths = sorted(c["Path"] for c in changes)
    parents = {p for p, q in itertools.pairwise(paths) if q.startswith(p.rstrip("/") + "/")}
    return [c for c in changes if c["Path"] not in parents]


def _read_back(container: Container, path: str) -> Optional[bytes]:
    """A regular file's bytes from the stopped container (None for anything else)."""
    stream, info = container.get_archive(path)
    if (info or {}).get("size", 0) > MAX_FILE:  # info: the engine's stat header, when it sends one
        raise SparkmodsError(f"the mod wrote {path}, over {MAX_FILE >> 20} MiB; refusing to read it back")
    data = b"".join(stream)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = tar.next()
        content = tar.extractfile(member) if member is not None and member.isfile() else None
        return None if content is None else content.read()


def _changes(container: Container, tree: Path, name: str, keep: bool) -> Tuple[List[Tuple[str, str]], List[str], Dict]:
    """(vllm/ changes, paths written outside vllm/, new bytes of the changed files when keep)."""
    own = f"{MODS_DIR}/{name}"
    kinds = {0: "modified", 1: "added", 2: "deleted"}
    changed, outside, after = [], [], {}
    for entry in _leaves(container.diff() or []):
        path, kind = entry["Path"], kinds.get(entry["Kind"], "modified")
        if "/__pycache__" in path or path in (own, MODS_DIR) or path.startswith(own + "/"):
            continue  # bytecode Python leaves behind, and the mod's own copy
        if not path.startswith(f"{SITE_DIR}/vllm/"):
            outside.append(path)
            continue
        rel = path[len(SITE_DIR) + 1:]
        data = None if kind == "deleted" else _read_back(container, path)
        if kind != "deleted" and data is None:
            if (tree / rel).is_dir() or kind == "modified":
                continue  # a folder whose entries came and went
        elif kind == "modified" and (tree / rel).is_file() and data == (tree / rel).read_bytes():
            continue  # rewritten with the same bytes
        changed.append((kind, rel))
        if keep and data is not None:
            after[rel] = data
    return sorted(changed, key=lambda c: c[1]), sorted(outside), after


def run_mod(mod_dir: Path, tree: Path, image: str, timeout: float = DEFAULT_TIMEOUT, client: Optional[DockerClient] = None,
            keep: bool = False, tree_tag: Optional[str] = None) -> RunResult:
    """Run mod_dir's run.sh against tree (a site-packages folder) in a throwaway container of the
    tree's image (tree_tag, else built or found by tree_image); keep: also return the changed
    vllm/ files' new bytes (None: deleted)."""
    import requests.exceptions
    name = mod_dir.name
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", name):
        raise SparkmodsError(f"{mod_dir}: a mod folder name is letters, digits, '.', '_', '+' or '-'")
    if not (mod_dir / "run.sh").is_file():
        raise SparkmodsError(f"{mod_dir}: a community mod folder must contain run.sh")
    client = client or _client()
    tag = tree_tag or tree_image(tree, image, client)
    started = time.monotonic()
    mod_path = shlex.quote(f"{MODS_DIR}/{name}")
    container = client.containers.create(
        tag, ["bash", "-c", f"export WORKSPACE_DIR=$PWD && cd {mod_path} && chmod +x run.sh && ./run.sh"],
        working_dir=WORKDIR, user="root", network_mode="none", tmpfs={"/tmp": "size=256m", "/run": "size=16m"},
        mem_limit="2g", pids_limit=512, cap_drop=["ALL"], cap_add=["CHOWN", "DAC_OVERRIDE", "FOWNER"],
        security_opt=["no-new-privileges"], labels={"org.sparkmods.sandbox": "1"})
    timed_out, code = False, None
    try:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(str(mod_dir), arcname=name, filter=_owned_by_root)
        container.put_archive(MODS_DIR, buf.getvalue())
        container.start()
        try:
            code = container.wait(timeout=timeout)["StatusCode"]
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            timed_out = True
            container.kill()
        output = container.logs(stdout=True, stderr=True, tail=_LOG_LINES).decode("utf-8", "replace")
        changed, outside, after = _changes(container, tree, name, keep)
    finally:
        container.remove(force=True)
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    last = lines[-1][:300] if lines else ""
    if timed_out:
        status = TIMED_OUT
    elif outside:
        status = OUTSIDE
    elif code != 0:
        status = FAILED
    else:
        status = APPLIED if changed else NO_CHANGE
    return RunResult(status, code, last, changed, outside, round(time.monotonic() - started, 3), after)
