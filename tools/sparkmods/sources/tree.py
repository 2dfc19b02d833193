"""`dir:PATH[#VERSION]`: a folder holding `vllm/`, a source tree or a site-packages folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

from sparkmods.errors import SparkmodsError
from sparkmods.runtime.engine import UnsafePath, plain_path
from sparkmods.runtime.locate import LocateError, read_version
from sparkmods.runtime.pep440 import InvalidVersion, Version
from sparkmods.sources.base import VllmSource, check_member
from sparkmods.sources.remote import commit_of


class DirSource(VllmSource):
    def __init__(self, label: str, root: Path, version: str, commit: Optional[str]) -> None:
        super().__init__(label, version, commit)
        self.root = root

    def read(self, path: str) -> Optional[bytes]:
        """The file's bytes, None when absent; a link on the way is refused in one line, as a
        mod's run.sh refuses it (runtime/engine.plain_path), so check never says `ok` where
        the mod would refuse to apply."""
        try:
            target = plain_path(self.root, check_member(self.label, path))
        except UnsafePath as exc:
            raise SparkmodsError(f"{self.label}: {str(exc).replace('; nothing was changed', '')}") from None
        try:
            with open(target, "rb") as fh:
                return fh.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def list_files(self) -> List[str]:
        tops = [self.root / "vllm"] + sorted(self.root.glob("vllm-*.dist-info"))
        found: List[str] = []
        for top in tops:
            for folder, dirs, files in os.walk(top):
                dirs[:] = [d for d in dirs if d != "__pycache__"]
                rel = Path(folder).relative_to(self.root).as_posix()
                found.extend(f"{rel}/{f}" for f in files)
        return sorted(found)


def _version_of(root: Path, label: str) -> "tuple[str, Optional[str]]":
    """(version, commit): dist-info or vllm/_version.py, else the git checkout's HEAD."""
    try:
        version = read_version(root)
        return version, commit_of(version)
    except LocateError as exc:
        reason = str(exc)
    if (root / ".git").exists():
        import git  # gitpython: only for source checkouts

        from sparkmods.sources.gitrepo import describe_version
        repo = git.Repo(root)
        return describe_version(repo, "HEAD", label), repo.head.commit.hexsha
    raise SparkmodsError(f"{label}: cannot tell the vLLM version ({reason}); name it: dir:{root}#0.19.1")


def open_dir(text: str, label: str) -> DirSource:
    path_text, _, version = text.partition("#")
    root = Path(path_text).expanduser()
    if not (root / "vllm").is_dir():
        raise SparkmodsError(f"{label}: {root} has no vllm/ folder "
                             f"(want a vLLM source tree or a site-packages folder holding vllm/)")
    if version.strip():
        try:
            Version(version.strip())
        except InvalidVersion as exc:
            raise SparkmodsError(f"{label}: {exc}") from None
        return DirSource(label, root, version.strip(), commit_of(version.strip()))
    found, commit = _version_of(root, label)
    return DirSource(label, root, found, commit)
