"""`VllmSource`: one read-only view of "a vLLM", whatever it is stored in."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Dict, Iterable, List, Optional

from sparkmods.errors import SparkmodsError
from sparkmods.runtime.engine import UnsafePath, check_relpath


def is_safe_member(name: str) -> bool:
    """False for names that would escape the tree, by run.sh's own rule (engine.check_relpath):
    absolute, drive-letter, with a `..` part or a control character."""
    try:
        check_relpath(name)
    except UnsafePath:
        return False
    return True


def check_member(label: str, path: str) -> str:
    """A requested package path, refused with one line when it could escape the tree."""
    if not is_safe_member(path) or "\\" in path:
        raise SparkmodsError(f"{label}: refusing path {path!r} (want a package path such as vllm/config.py)")
    return path


class VllmSource(ABC):
    """A vLLM as a read-only tree of package paths (`vllm/...`, `vllm-X.dist-info/...`)."""

    def __init__(self, label: str, version: str, commit: Optional[str] = None,
                 sha256: Optional[str] = None) -> None:
        self.label = label  # the spec it came from, e.g. pypi:0.19.1
        self.version = version
        self.commit = commit
        self.sha256 = sha256  # the wheel's sha256 from the index, when known

    @abstractmethod
    def read(self, path: str) -> Optional[bytes]:
        """The file's bytes, or None when this vLLM has no such file."""

    @abstractmethod
    def list_files(self) -> List[str]:
        """Every file path, sorted: a wheel's members, a folder's vllm/ and dist-info, a commit's
        or an image's vllm/ (an image streams the whole folder: slow)."""

    def prefetch(self, paths: Iterable[str]) -> None:  # noqa: B027 - a default that does nothing, not an abstract method
        """Fetch many files at once so later read() calls are served locally.

        Local sources read quickly one by one, so by default there is nothing to do.
        """

    def warm(self) -> None:  # noqa: B027 - a default that does nothing, not an abstract method
        """Fetch ahead, in the background, what any later read needs first, holding nothing
        (a remote wheel: its central directory, into the cache); by default nothing."""

    def content_key(self) -> Optional[str]:
        """A name for exactly these bytes (a wheel's sha256, a git tree id) under which check
        results may be stored and reused; None (the default) when there is none, as for a
        folder or an image, which can change under the same name."""
        return None

    def release(self) -> None:  # noqa: B027 - a default that does nothing, not an abstract method
        """Drop what was held in memory to answer reads (zip directories, fetched members):
        called when a check of this source is done. Later reads load it again."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.label} version={self.version}>"


class MemorySource(VllmSource):
    """A vLLM held in memory as package path -> text: what rebase experiments (the benchmark,
    the rule tests) feed to the same code that reads wheels and trees."""

    def __init__(self, version: str, files: Dict[str, str]) -> None:
        super().__init__(f"memory:{version}", version)
        self.files = {path: text.encode() for path, text in files.items()}

    def read(self, path: str) -> Optional[bytes]:
        return self.files.get(path)

    def list_files(self) -> List[str]:
        return sorted(self.files)
