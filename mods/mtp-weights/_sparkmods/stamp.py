"""run.sh's quick answer on a tree the mod is already applied to, before the engine is imported.

Launchers run run.sh on every container start, and almost always the mod is already on. The
full decision (lock, journal, parse the patches, plan every hunk) costs the import of the
whole runtime; this module imports only what Python has loaded anyway plus hashlib and fcntl.

After a run that leaves the mod applied (the decision said `applied`, under the tree's lock),
applier.py writes `<site>/.sparkmods/<mod>/stamp`: a marshal of every input that decision read
(the runtime's own sources, manifest.json, the variant's patches and install sources, the
dist-info METADATA the version came from, each vLLM file and workspace install by sha256) and
the lines it printed. `quick()` repeats the run's message only when every one of those inputs
is byte-identical now, the lock is free (taken without waiting), no journal or temp file of an
interrupted run is left, and the command line and environment are the plain ones; anything
else returns None and the full path decides, exactly as before. The stamp is a cache: it is
written with a rename but not fsynced, and a missing, damaged or stale one only costs the full
path.
"""

import fcntl
import hashlib
import marshal
import os
import sys

STAMP_NAME = "stamp"
_VERSION = 1
_TMP_SUFFIX = ".sparkmods-tmp"  # engine.TMP_SUFFIX (not imported: engine is what we avoid)
_STATE_DIR, _JOURNAL, _LOCK = ".sparkmods", ".journal.json", ".lock"
_ARGS = {(): "apply", ("apply",): "apply", ("check",): "check"}
# Settings only the full path reads (and validates): their presence sends a run there.
_FULL_PATH_ENV = ("SPARKMODS_LOCK_TIMEOUT", "SPARKMODS_FAULT_AFTER", "SPARKMODS_FAULT_SIGNAL")


def _read(path: str) -> "bytes | None":
    """A regular file's bytes reached without any symlink; None when absent; raises
    OSError for anything else (a symlink, a folder) so that the caller gives up."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if (st.st_mode & 0o170000) != 0o100000:
        raise OSError(f"{path}: not a regular file")
    with open(path, "rb") as fh:
        return fh.read()


def _sha(data: "bytes | None") -> "str | None":
    return None if data is None else hashlib.sha256(data).hexdigest()


def mod_inputs(mod_dir: str, rels: "list[str]") -> str:
    """sha256 over the named mod files (each name and content)."""
    digest = hashlib.sha256()
    for rel in rels:
        data = _read(os.path.join(mod_dir, rel))
        if data is None:
            raise OSError(f"{rel}: missing")
        digest.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


def runtime_files(mod_dir: str) -> "list[str]":
    """The mod's runtime copy and manifest: their bytes decide as much as the patches do."""
    names = sorted(n for n in os.listdir(os.path.join(mod_dir, "_sparkmods")) if n.endswith((".py", ".json")))
    return [f"_sparkmods/{n}" for n in names]


def dist_infos(site: str) -> "list[tuple[str, str | None]]":
    """(folder, sha256 of its METADATA) of every vllm-*.dist-info: what the version is read from."""
    names = sorted(n for n in os.listdir(site) if n.startswith("vllm-") and n.endswith(".dist-info"))
    return [(n, _sha(_read(os.path.join(site, n, "METADATA")))) for n in names]


def _within(site: str, rel: str) -> str:
    """site/rel, refused (OSError) unless it is reached without symlinks or `..`."""
    path = os.path.join(site, rel)
    if rel.startswith("/") or ".." in rel.split("/") or os.path.realpath(path) != os.path.normpath(path):
        raise OSError(f"{rel}: not a plain path under {site}")
    return path


def _no_leftovers(site: str, folders: "set[str]") -> bool:
    """No journal, and no temp file of ours beside the vLLM files or in the state folder
    (what recover and sweep would settle or remove first)."""
    state = os.path.join(site, _STATE_DIR)
    if os.path.lexists(os.path.join(state, _JOURNAL)):
        return False
    for folder in folders:
        if any(n.startswith(".") and n.endswith(_TMP_SUFFIX) for n in os.listdir(folder)):
            return False
    return not any(n.endswith(_TMP_SUFFIX) for _, _, names in os.walk(state) for n in names)


def record(mod_dir: str, site: str, variant: str, version: str, mod_files: "list[str]",
           vllm_files: "list[str]", installs: "list[tuple[str, bytes]]", notes: str) -> None:
    """Write the stamp for a mod the caller has just found applied (under the tree's lock)."""
    name = os.path.basename(mod_dir)
    rels = runtime_files(mod_dir) + sorted(set(mod_files))
    stamp = {"v": _VERSION, "mod": name, "variant": variant, "vllm": version, "inputs": rels,
             "digest": mod_inputs(mod_dir, rels), "dist": dist_infos(site),
             "files": [(rel, _sha(_read(_within(site, rel)))) for rel in sorted(vllm_files)],
             "installs": [(dest, hashlib.sha256(data).hexdigest()) for dest, data in installs],
             "notes": notes}
    target = os.path.join(site, _STATE_DIR, name, STAMP_NAME)
    tmp = os.path.join(os.path.dirname(target), f".{STAMP_NAME}{_TMP_SUFFIX}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(marshal.dumps(stamp))
        os.replace(tmp, target)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def _site() -> "str | None":
    """Where vllm/ is, in the two plain cases (PYTHON_ROOT is the site-packages, or the
    first sys.path entry holding it); None leaves the search to locate.find_vllm."""
    root = os.environ.get("PYTHON_ROOT")
    for entry in [root] if root else sys.path:
        if entry and os.path.isfile(os.path.join(entry, "vllm", "__init__.py")):
            return os.path.realpath(entry)
    return None


def _workspace() -> "str | None":
    """$WORKSPACE_DIR, else the cwd, when it prints as applier's Path() prints it."""
    workspace = os.environ.get("WORKSPACE_DIR") or os.getcwd()
    return workspace if workspace == os.path.normpath(workspace) else None


def _verified(stamp: dict, mod_dir: str, site: str, workspace: str) -> bool:
    """Every input of the stamped decision is as it was then."""
    if stamp.get("v") != _VERSION or stamp["mod"] != os.path.basename(mod_dir) or not stamp["dist"]:
        return False
    if stamp["inputs"][:len(runtime_files(mod_dir))] != runtime_files(mod_dir):
        return False
    if mod_inputs(mod_dir, stamp["inputs"]) != stamp["digest"] or dist_infos(site) != stamp["dist"]:
        return False
    paths = {rel: _within(site, rel) for rel, _ in stamp["files"]}
    if any(_sha(_read(paths[rel])) != sha for rel, sha in stamp["files"]):
        return False
    if not _no_leftovers(site, {os.path.dirname(p) for p in paths.values()}):
        return False
    for dest, sha in stamp["installs"]:
        path = os.path.join(workspace, dest)
        if not os.path.isfile(path) or _sha(_read(os.path.realpath(path))) != sha:
            return False
    return True


def quick(argv: "list[str]", mod_dir: str) -> "int | None":
    """0 after printing what the full path would print on an applied tree; None: take it."""
    if tuple(a for a in argv if a != "--dry-run") not in _ARGS or argv.count("--dry-run") > 1:
        return None
    if any(os.environ.get(k) is not None for k in _FULL_PATH_ENV):
        return None
    site, workspace = _site(), _workspace()
    if site is None or workspace is None:
        return None
    name = os.path.basename(mod_dir)
    try:
        fd = os.open(os.path.join(site, _STATE_DIR, _LOCK), os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by another run: the full path waits
        stamp = marshal.loads(_read(os.path.join(site, _STATE_DIR, name, STAMP_NAME)) or b"")
        if not isinstance(stamp, dict) or not _verified(stamp, mod_dir, site, workspace):
            return None
    except (OSError, ValueError, EOFError, TypeError, KeyError, IndexError):
        return None
    finally:
        os.close(fd)
    lines = [f"already applied (variant {stamp['variant']}) to vLLM {stamp['vllm']}"]
    lines += [f"{dest} already installed in {workspace}" for dest, _ in stamp["installs"]]
    if stamp["notes"]:
        lines.append(stamp["notes"])
    sys.stdout.write("".join(f"[{name}] {line}\n" for line in lines))
    sys.stdout.flush()
    return 0
