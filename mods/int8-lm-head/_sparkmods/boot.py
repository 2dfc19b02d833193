"""run.sh's entry point: the runtime from compiled code kept outside the mod and vLLM.

run.sh starts Python with PYTHONDONTWRITEBYTECODE=1 so that nothing is ever written into the
mod folder or vLLM's tree, which left Python compiling these modules from source on every
run. Here each runtime module's code object is kept in the user's cache instead
($SPARKMODS_CACHE_DIR, else $XDG_CACHE_HOME/sparkmods, else ~/.cache/sparkmods, folder
`runtime-code/`), one file per module holding (interpreter magic, source path, source bytes,
code). An entry is used only when all of those equal what this run would compile, so an
edited, moved or other runtime is never run from a stale entry. A cache that cannot be
created or written (read-only home, another user's folder) only costs the compile.
"""

import importlib.machinery
import importlib.util
import marshal
import os
import sys
import zlib
from pathlib import Path
from typing import Optional, Sequence

PACKAGE = __name__.rpartition(".")[0]  # "_sparkmods" inside a mod


def cache_dir() -> Optional[Path]:
    """The folder for compiled runtime code, or None when there is no home to put it in."""
    explicit = os.environ.get("SPARKMODS_CACHE_DIR")
    xdg = os.environ.get("XDG_CACHE_HOME")
    try:
        base = Path(explicit) if explicit else (Path(xdg) if xdg else Path.home() / ".cache") / "sparkmods"
    except RuntimeError:  # no $HOME and no passwd entry
        return None
    return base.expanduser() / "runtime-code"


class CachedSourceLoader(importlib.machinery.SourceFileLoader):
    """A source loader whose code comes from the cache folder when the entry matches exactly."""

    def __init__(self, fullname: str, path: str, cache: Path) -> None:
        super().__init__(fullname, path)
        self.cache = cache

    def get_code(self, fullname: str):  # type: ignore[override]
        path = self.get_filename(fullname)
        source = self.get_data(path)
        entry = self.cache / f"{fullname}-{zlib.crc32(path.encode()):08x}.code"
        want = (importlib.util.MAGIC_NUMBER, path, source)
        try:
            magic, held_path, held_source, code = marshal.loads(entry.read_bytes())
            if (magic, held_path, held_source) == want:
                return code
        except (OSError, ValueError, EOFError, TypeError):
            pass  # absent, unreadable, or from another interpreter: compile
        code = self.source_to_code(source, path)
        _store(self.cache, entry, marshal.dumps(want + (code,)))
        return code


def _store(cache: Path, entry: Path, data: bytes) -> None:
    """Write entry atomically into a folder of our own; any failure leaves the cache alone."""
    tmp = entry.with_name(f".{entry.name}.{os.getpid()}.tmp")
    try:
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
        if cache.stat().st_uid != os.getuid():
            return  # never run code from (or leave code in) a folder another user controls
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, entry)
    except OSError:
        pass
    finally:  # also after a KeyboardInterrupt (a SIGINT while run.sh starts); gone after the replace
        try:
            tmp.unlink()
        except OSError:
            pass


class _RuntimeFinder:
    """Finds this package's modules and loads them through CachedSourceLoader."""

    def __init__(self, folder: Path, cache: Path) -> None:
        self.folder, self.cache = folder, cache

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None, target: object = None):
        head, _, leaf = fullname.rpartition(".")
        source = self.folder / f"{leaf}.py"
        if head != PACKAGE or not source.is_file():
            return None
        loader = CachedSourceLoader(fullname, str(source), self.cache)
        return importlib.util.spec_from_file_location(fullname, str(source), loader=loader)


def install() -> None:
    """Load the rest of the runtime through the cache (when the cache folder is ours)."""
    cache = cache_dir()
    if cache is None:
        return
    try:
        if cache.exists() and cache.stat().st_uid != os.getuid():
            return
    except OSError:
        return
    sys.meta_path.insert(0, _RuntimeFinder(Path(__file__).resolve().parent, cache))


def main() -> int:
    """`run.sh [apply|check|revert] [--dry-run]`."""
    install()
    from .applier import main as run_applier

    return run_applier()
