"""Judge a community mod by running it, the way launch-cluster.sh --apply-mod runs it, against a
target's vLLM files in a throwaway container, and report what it changed.

The launcher copies the mod folder to /workspace/mods/<name> and runs
`export WORKSPACE_DIR=$PWD && cd /workspace/mods/<name> && chmod +x run.sh && ./run.sh` as root
from the image's WORKDIR (/workspace/vllm), with vLLM in /usr/local/lib/python3.12/dist-packages.
Here the container has no network, a read-only root file system, a small /tmp, and two writable
folders: that site-packages (the target's vllm/ tree and its dist-info, copied from a cache of
release trees) and /workspace (WORKDIR plus the mod's copy). Comparing both before and after
gives the status: `applied` (vllm/ files changed), `no-change` (exit 0, nothing written: the silent
skip), `failed` (non-zero exit), `wrote-outside-vllm` (anything else written or tried: a read-only
file system error counts) and `timed-out`.

A mod's own text never leaves the container run: results carry statuses, exit codes, vLLM paths
and the output's last line (for the terminal only; callers that commit results keep counts).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

from sparkmods.errors import SparkmodsError
from sparkmods.sources.base import check_member
from sparkmods.sources.cache import cache_root

__all__ = ["APPLIED", "NO_CHANGE", "FAILED", "OUTSIDE", "TIMED_OUT", "RUN_STATUSES", "SITE_DIR", "DEFAULT_IMAGE",
           "RunResult", "release_tree", "run_mod", "agrees", "sandbox_image", "fingerprint"]

APPLIED, NO_CHANGE, FAILED, OUTSIDE, TIMED_OUT = "applied", "no-change", "failed", "wrote-outside-vllm", "timed-out"
RUN_STATUSES = (APPLIED, NO_CHANGE, FAILED, OUTSIDE, TIMED_OUT)

SITE_DIR = "/usr/local/lib/python3.12/dist-packages"  # the community image's site-packages
WORKSPACE = "/workspace"
WORKDIR = "/workspace/vllm"  # the image's WORKDIR: $WORKSPACE_DIR for run.sh
MODS_DIR = "/workspace/mods"
DEFAULT_IMAGE = "sparkmods-sandbox:latest"
IMAGE_ENV = "SPARKMODS_SANDBOX_IMAGE"
DEFAULT_TIMEOUT = 120.0

# What a release tree may hold: every member of vllm/ but compiled extensions (no mod edits
# them, and nothing in the sandbox could load them), each file and the whole bounded.
MAX_FILE = 8 << 20
MAX_TREE = 512 << 20
_SKIP_SUFFIXES = (".so", ".cubin", ".fatbin")
_TREE_FORMAT = 1  # bump when what a cached tree holds changes
_READ_ONLY = "Read-only file system"

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
            where = ", ".join(self.outside[:3]) if self.outside else f"tried ({_READ_ONLY})"
            return f"wrote outside vllm/: {where}" + (f"; exit {self.exit_code}" if self.exit_code else "")
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
    """Changes when this module or the image's name does: cached cells judged otherwise re-run."""
    return hashlib.sha256(Path(__file__).read_bytes() + image.encode()).hexdigest()[:12]


# --- release trees -------------------------------------------------------------------------------

def _tree_members(names: List[str]) -> List[str]:
    return [n for n in names if n.startswith("vllm/") and not n.endswith(_SKIP_SUFFIXES) and not n.endswith("/")]


def _private_dir(path: Path) -> Path:
    """path, created 0700; refused when another user owns it or may write into it."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise SparkmodsError(f"{path}: not a private folder of this user (owner {info.st_uid}, mode "
                             f"{stat.S_IMODE(info.st_mode):o}); remove it or set SPARKMODS_CACHE_DIR")
    return path


def _write_tree(source, dest: Path) -> None:
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


def release_tree(source, scratch: Optional[Path] = None) -> Path:
    """The site-packages tree of this target (vllm/ and a dist-info), cached on disk by the
    target's content key; a target without one (a folder, an image) is unpacked into scratch."""
    key = source.content_key()
    if key is None or not re.fullmatch(r"[0-9A-Za-z._-]{1,128}", key):
        if scratch is None:
            raise SparkmodsError(f"{source.label}: no content key, and no scratch folder to unpack it into")
        dest = scratch / "tree"
        _write_tree(source, dest)
        return dest
    trees = _private_dir(cache_root() / "trees")
    dest = trees / f"{key}-{_TREE_FORMAT}"
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

def _files(root: Path) -> Iterator[Tuple[str, os.stat_result]]:
    """Every non-directory under root (symlinks not followed), as (relative path, lstat)."""
    for folder, dirs, names in os.walk(root):
        for name in names + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            path = os.path.join(folder, name)
            yield os.path.relpath(path, root), os.lstat(path)


def _same(a: Path, b: Path) -> bool:
    if a.is_symlink() or b.is_symlink():
        return a.is_symlink() and b.is_symlink() and os.readlink(a) == os.readlink(b)
    return a.read_bytes() == b.read_bytes()


def _tree_changes(pristine: Path, before: Dict[str, Tuple[int, int]], after_root: Path) -> List[Tuple[str, str]]:
    """(added|modified|deleted, path) between the pristine tree and the run's copy; files whose
    size and mtime did not move are not read."""
    out: List[Tuple[str, str]] = []
    seen = set()
    for rel, info in _files(after_root):
        seen.add(rel)
        old = before.get(rel)
        if old is None:
            out.append(("added", rel))
        elif old != (info.st_size, info.st_mtime_ns) and not _same(pristine / rel, after_root / rel):
            out.append(("modified", rel))
    out += [("deleted", rel) for rel in before if rel not in seen]
    return sorted(out, key=lambda c: c[1])


def _bounded_read(path: Path) -> bytes:
    if path.stat().st_size > MAX_FILE:
        raise SparkmodsError(f"the mod wrote {path.name}, over {MAX_FILE >> 20} MiB; refusing to read it back")
    return path.read_bytes()


def _copy_mod(mod_dir: Path, dest: Path) -> None:
    """The folder's content as `docker cp dir/.` brings it: everything, symlinks kept as links."""
    dest.mkdir(parents=True)
    for entry in sorted(mod_dir.iterdir()):
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, dest / entry.name, symlinks=True)
        else:
            shutil.copy2(entry, dest / entry.name, follow_symlinks=False)


def _client():
    import docker
    import docker.errors
    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except docker.errors.DockerException as exc:
        raise SparkmodsError(f"no Docker engine answers ({str(exc)[:120]}); running a community mod needs one "
                             "(or pass --static to read run.sh without running it)") from None
    return client


def check_image(image: str, client=None) -> None:
    """A one-line error when the sandbox image is missing."""
    import docker.errors
    client = client or _client()
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise SparkmodsError(f"no sandbox image {image!r}: build it with `python3 ci/sandbox_image.py` (Debian, "
                             f"python3, bash, patch, git) or pass --sandbox-image IMAGE") from None


def run_mod(mod_dir: Path, tree: Path, image: str, timeout: float = DEFAULT_TIMEOUT, client=None,
            keep: bool = False) -> RunResult:
    """Run mod_dir's run.sh against a copy of tree (a site-packages folder) in a throwaway container;
    keep: also return the changed vllm/ files' bytes (None: deleted)."""
    import requests.exceptions
    name = mod_dir.name
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", name):
        raise SparkmodsError(f"{mod_dir}: a mod folder name is letters, digits, '.', '_', '+' or '-'")
    if not (mod_dir / "run.sh").is_file():
        raise SparkmodsError(f"{mod_dir}: a community mod folder must contain run.sh")
    client = client or _client()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sparkmods-sandbox-") as tmp:
        site, workspace = Path(tmp) / "site", Path(tmp) / "workspace"
        shutil.copytree(tree, site, symlinks=True)
        before = {rel: (i.st_size, i.st_mtime_ns) for rel, i in _files(site)}
        (workspace / "vllm").mkdir(parents=True)
        _copy_mod(mod_dir, workspace / "mods" / name)
        mod_path = shlex.quote(f"{MODS_DIR}/{name}")
        container = client.containers.create(
            image, ["bash", "-c", f"export WORKSPACE_DIR=$PWD && cd {mod_path} && chmod +x run.sh && ./run.sh"],
            working_dir=WORKDIR, user="root", network_mode="none", read_only=True,
            tmpfs={"/tmp": "size=256m", "/run": "size=16m"}, mem_limit="2g", pids_limit=512,
            cap_drop=["ALL"], cap_add=["CHOWN", "DAC_OVERRIDE", "FOWNER"], security_opt=["no-new-privileges"],
            volumes={str(site): {"bind": SITE_DIR, "mode": "rw"}, str(workspace): {"bind": WORKSPACE, "mode": "rw"}},
            labels={"org.sparkmods.sandbox": "1"})
        timed_out, code = False, None
        try:
            container.start()
            try:
                code = container.wait(timeout=timeout)["StatusCode"]
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                timed_out = True
                container.kill()
            output = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
        finally:
            container.remove(force=True)
        changed = _tree_changes(tree, before, site)
        outside = [f"{SITE_DIR}/{p}" for _, p in changed if not p.startswith("vllm/")]
        changed = [(op, p) for op, p in changed if p.startswith("vllm/")]
        after = {p: _bounded_read(site / p) if op != "deleted" else None
                 for op, p in changed if not (site / p).is_symlink()} if keep else {}
        own = f"mods/{name}/"  # the mod's copy is its own business; nothing else was there before
        outside += sorted(f"{WORKSPACE}/{rel}" for rel, _ in _files(workspace) if not rel.startswith(own))
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    last = lines[-1][:300] if lines else ""
    if timed_out:
        status = TIMED_OUT
    elif outside or (code != 0 and _READ_ONLY in output):
        status = OUTSIDE
    elif code != 0:
        status = FAILED
    else:
        status = APPLIED if changed else NO_CHANGE
    return RunResult(status, code, last, changed, outside, round(time.monotonic() - started, 3), after)
