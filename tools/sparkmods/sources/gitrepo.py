"""`git:PATH[@REF]`: any commit of a vLLM git repository, read from the object database.

No checkout happens, so the repository (bare or not) and its working tree stay untouched.
The version is what vLLM's own build (setuptools_scm, guess-next-dev) would call that
commit: the nearest `vX.Y.Z` tag, and for a commit past it the next version as a dev build,
`0.19.1rc1.dev15+g50cd5674b` for 15 commits after `v0.19.1rc0`. A clone without release tags
(a fork's) gets setuptools_scm's fallback, `0.1.dev<commits>+g<hash>`; mods then choose their
variant by content (runtime/modcheck.py).
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import List, Optional

import git
from packaging.version import InvalidVersion, Version

from sparkmods.errors import SparkmodsError
from sparkmods.sources.base import VllmSource, check_member

_DESCRIBED = re.compile(r"^v(?P<tag>.+)-(?P<distance>\d+)-g(?P<abbrev>[0-9a-f]+)$")


def next_version(tag: Version) -> str:
    """setuptools_scm's guess: bump the pre-release number, else the last release part."""
    epoch = f"{tag.epoch}!" if tag.epoch else ""
    if tag.pre is not None:
        return f"{epoch}{tag.base_version.split('!')[-1]}{tag.pre[0]}{tag.pre[1] + 1}"
    release = list(tag.release)
    release[-1] += 1
    return epoch + ".".join(map(str, release))


def describe_version(repo: git.Repo, rev: str, label: str) -> str:
    """The PEP 440 version of rev from the nearest reachable vX.Y.Z tag."""
    try:
        described = repo.git.describe("--tags", "--long", "--match", "v[0-9]*", rev).strip()
    except git.GitCommandError:
        return untagged_version(repo, rev)
    match = _DESCRIBED.match(described)
    try:
        tag = Version(match.group("tag")) if match else None
    except InvalidVersion:
        tag = None
    if match is None or tag is None:
        raise SparkmodsError(f"{label}: nearest tag in {described!r} is not a version like v0.19.1")
    distance = int(match.group("distance"))
    if distance == 0:
        return str(tag)
    return f"{next_version(tag)}.dev{distance}+g{match.group('abbrev')}"


def untagged_version(repo: git.Repo, rev: str) -> str:
    """setuptools_scm's version of a commit no tag is reachable from: `0.1.dev<commits>+g<hash>`."""
    count = repo.git.rev_list("--count", rev).strip()
    return f"0.1.dev{count}+g{repo.git.rev_parse('--short', rev).strip()}"


class GitSource(VllmSource):
    def __init__(self, label: str, repo: git.Repo, commit: git.Commit, version: str) -> None:
        super().__init__(label, version, commit.hexsha)
        self._repo = repo
        self._tree = commit.tree
        self._lock = threading.Lock()  # gitpython's cat-file pipe serves one reader at a time

    def read(self, path: str) -> Optional[bytes]:
        check_member(self.label, path)
        with self._lock:
            try:
                obj = self._tree / path
            except KeyError:
                return None
            return obj.data_stream.read() if obj.type == "blob" else None

    def content_key(self) -> Optional[str]:
        """The commit's tree object id: git names the content itself."""
        return f"git-tree:{self._tree.hexsha}"

    def list_files(self) -> List[str]:
        with self._lock:
            try:
                top = self._tree / "vllm"
            except KeyError:
                return []
            return sorted(str(item.path) for item in top.traverse() if isinstance(item, git.Blob))


def _split(text: str) -> "tuple[str, str]":
    """PATH@REF -> (PATH, REF); the last '@' splits only when what precedes it exists."""
    head, at, ref = text.rpartition("@")
    if at and head and Path(head).expanduser().exists():
        return head, ref
    return text, "HEAD"


def open_git(text: str, label: str) -> GitSource:
    path_text, ref = _split(text)
    if not ref.strip():
        raise SparkmodsError(f"{label}: empty REF after '@' (use git:PATH@v0.19.1 or a commit)")
    try:
        repo = git.Repo(Path(path_text).expanduser())
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        head, at, after = text.rpartition("@")
        if path_text == text and at and head and not Path(text).expanduser().exists():
            raise SparkmodsError(f"{label}: {head} does not exist (the path before '@{after}'); "
                                 "name a git repository as git:PATH@REF") from None
        raise SparkmodsError(f"{label}: {path_text} is not a git repository") from None
    try:
        # A plain git command first: git's refusal of a repository another user owns then comes back
        # as an error, where the persistent cat-file process it would otherwise meet first dies
        # under GitPython's write (a broken pipe, or not, by timing).
        repo.git.rev_parse("--git-dir")
        commit = repo.commit(ref)
    except (git.BadName, ValueError, git.GitCommandError) as exc:
        if "dubious ownership" in str(exc):  # git's safe.directory: the repository is another user's
            raise SparkmodsError(f"{label}: git refuses to read {path_text}, which another user owns; clone it "
                                 f"(git -c safe.directory='*' clone --bare {path_text} COPY) or add it to git's "
                                 "safe.directory") from None
        raise SparkmodsError(f"{label}: no commit {ref!r} in {path_text}") from None
    version = describe_version(repo, commit.hexsha, label)
    return GitSource(label, repo, commit, version)
