"""`image:NAME`: the vLLM inside a Docker image, read without running anything.

A container is created but never started; files come out through the archive API
(get_archive). Site-packages is searched for, never assumed: PYTHONPATH entries, then
lib/python3.X/{dist,site}-packages under the image's PATH prefixes and the usual ones.
The version comes from /workspace/build-metadata.yaml (community image), else
vllm/_version.py, else the vllm-*.dist-info METADATA found by listing site-packages.
"""

from __future__ import annotations

import io
import logging
import posixpath
import re
import tarfile
import weakref
from typing import TYPE_CHECKING, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import docker
import docker.errors
import yaml

from sparkmods.errors import SparkmodsError
from sparkmods.sources import http
from sparkmods.sources.base import VllmSource, check_member
from sparkmods.sources.remote import commit_of
from sparkmods.sources.wheel import metadata_version

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer
    from docker.models.containers import Container

log = logging.getLogger("sparkmods.sources")

BUILD_METADATA = "/workspace/build-metadata.yaml"
PREFIXES = ("/usr/local", "/usr", "/opt/conda", "/opt/venv", "/venv", "/root/.local")
PYTHONS = tuple(f"python3.{minor}" for minor in range(14, 7, -1))
_LINKS = 8  # symlinks followed per read
# `__version__ = version = '0.18.0'` (setuptools-scm 8), `__version__ = "..."`, `version: str = "..."`
_VERSION_LINE = re.compile(rb"""^(?:__version__|version)\s*(?::\s*\w+\s*)?=\s*(?:(?:__version__|version)\s*=\s*)?"""
                           rb"""['"]([^'"]+)['"]""", re.M)
_DIST_META = re.compile(r"^[^/]+/vllm-[^/]+\.dist-info/METADATA$")


class _Stream(io.RawIOBase):
    """A file over the archive API's chunk iterator, for tarfile's streaming mode."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        super().__init__()
        self._chunks = chunks
        self._rest = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        while not self._rest:
            try:
                self._rest = next(self._chunks)
            except StopIteration:
                return 0
        view = memoryview(buffer)
        n = min(len(view), len(self._rest))
        view[:n], self._rest = self._rest[:n], self._rest[n:]
        return n


def candidate_sites(env: Iterable[str]) -> List[str]:
    """Folders that may hold vllm/, most likely first (PATH order decides which python wins)."""
    values = dict(e.split("=", 1) for e in env if "=" in e)
    sites = [p.rstrip("/") for p in values.get("PYTHONPATH", "").split(":") if p.startswith("/")]
    prefixes = [p[: -len("/bin")] for p in values.get("PATH", "").split(":") if p.endswith("/bin") and len(p) > 4]
    for prefix in dict.fromkeys(prefixes + list(PREFIXES)):
        sites += [f"{prefix}/lib/{py}/{kind}" for py in PYTHONS for kind in ("dist-packages", "site-packages")]
    sites.append("/usr/lib/python3/dist-packages")
    return list(dict.fromkeys(sites))


class ImageSource(VllmSource):
    def __init__(self, label: str, container: Container, site: str) -> None:
        self._container = container
        self._finalizer = weakref.finalize(self, _remove, container)
        self.site = site
        self._files: Dict[str, Optional[bytes]] = {}
        super().__init__(label, version="")
        self.version, self.commit = self._version()

    # -- reading through the archive API ----------------------------------------------
    def _get(self, path: str) -> Optional[bytes]:
        """Content of an absolute path in the image (symlinks followed), None if absent or a folder."""
        for _ in range(_LINKS):
            try:
                chunks, _ = self._container.get_archive(path)
            except docker.errors.NotFound:
                return None
            with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
                member = next(iter(tar), None)
                if member is None or member.isdir():
                    return None
                if not member.issym():
                    content = tar.extractfile(member)
                    return None if content is None else content.read()  # None: a device or fifo
                path = posixpath.normpath(posixpath.join(posixpath.dirname(path), member.linkname))
        return None

    def _walk(self, folder: str, keep: Callable[[str], bool]) -> Tuple[List[str], Dict[str, bytes]]:
        """Names of the regular files under folder, and the content of those `keep` accepts.

        The archive is streamed (only kept files stay in memory) and always read to its end,
        so the engine's connection is released.
        """
        chunks, _ = self._container.get_archive(folder)
        names: List[str] = []
        kept: Dict[str, bytes] = {}
        with tarfile.open(fileobj=io.BufferedReader(_Stream(chunks)), mode="r|") as tar:
            for member in tar:
                if member.isfile():
                    names.append(member.name)
                    if keep(member.name):
                        content = tar.extractfile(member)
                        assert content is not None  # a regular file has content
                        kept[member.name] = content.read()
        for _ in chunks:
            pass
        return names, kept

    def read(self, path: str) -> Optional[bytes]:
        check_member(self.label, path)
        if path not in self._files:
            self._files[path] = self._get(f"{self.site}/{path}")
        return self._files[path]

    def prefetch(self, paths: Iterable[str]) -> None:
        todo = [check_member(self.label, p) for p in dict.fromkeys(paths) if p not in self._files]
        futures = {p: http.pool().submit(self._get, f"{self.site}/{p}") for p in todo}
        for path, future in futures.items():
            self._files[path] = future.result()

    def list_files(self) -> List[str]:
        """Streams the whole vllm/ folder out of the image (compiled libraries too): slow, rarely needed."""
        names, _ = self._walk(f"{self.site}/vllm", lambda name: False)
        return sorted(n for n in names if "__pycache__" not in n.split("/"))

    # -- version ----------------------------------------------------------------------
    def _version(self) -> Tuple[str, Optional[str]]:
        meta = self._get(BUILD_METADATA)
        if meta is not None:
            try:
                doc = yaml.safe_load(meta) or {}
            except yaml.YAMLError as exc:
                raise SparkmodsError(f"{self.label}: {BUILD_METADATA} is not YAML ({exc})") from None
            if isinstance(doc, dict) and doc.get("vllm_version"):
                version = str(doc["vllm_version"])
                return version, (str(doc["vllm_commit"]) if doc.get("vllm_commit") else commit_of(version))
        version = _module_version(self._get(f"{self.site}/vllm/_version.py")) or self._dist_info_version()
        return version, commit_of(version)

    def _dist_info_version(self) -> str:
        log.warning("%s: no build metadata or vllm/_version.py; listing %s for vllm's dist-info (slow)",
                    self.label, self.site)
        _, metas = self._walk(self.site, lambda name: bool(_DIST_META.match(name)))
        versions = {v for v in (metadata_version(data.decode("utf-8", "replace")) for data in metas.values()) if v is not None}
        if len(versions) != 1:
            what = "no" if not versions else f"several ({', '.join(sorted(versions))})"
            raise SparkmodsError(f"{self.label}: cannot tell the vLLM version: no {BUILD_METADATA} or "
                                 f"vllm/_version.py, and {what} vllm-*.dist-info in {self.site}")
        return versions.pop()

    def close(self) -> None:
        """Remove the helper container now (otherwise it goes when the source is collected)."""
        self._finalizer()


def _module_version(text: Optional[bytes]) -> Optional[str]:
    """The version a setuptools-scm vllm/_version.py records."""
    if text is None:
        return None
    found = _VERSION_LINE.search(text)
    return found.group(1).decode() if found else None


def _remove(container: Container) -> None:
    try:
        container.remove(force=True)
    except docker.errors.DockerException:
        pass  # already gone, or the engine went away: nothing left to clean


# Without an engine the image's vLLM can still be checked as the release it was built from.
NO_ENGINE_HINT = "start Docker, or name the vLLM release the image holds instead (--vllm 0.21.0), or a dir:/wheel: target"


def absent_image_hint(name: str) -> str:
    """How to get an image the engine lacks. A name without a registry path (`vllm-node`) is one
    built on this machine, as the community image is by eugr/spark-vllm-docker's build script:
    `docker pull` would ask Docker Hub for an image that does not exist there."""
    if "/" in name:
        return f"docker pull {name}, or build it"
    return (f"the community image is built, not pulled: ./build-and-copy.sh -t {name} in your "
            f"spark-vllm-docker checkout")


def open_image(name: str, label: str) -> ImageSource:
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        raise SparkmodsError(f"{label}: no Docker engine answers ({exc.__class__.__name__}); {NO_ENGINE_HINT}") from None
    try:
        image = client.images.get(name)
    except docker.errors.ImageNotFound:
        raise SparkmodsError(f"{label}: no image {name!r} on this Docker engine ({absent_image_hint(name)})") from None
    container = client.containers.create(image, entrypoint=["/sparkmods-never-started"], command=[],
                                         labels={"org.sparkmods.reader": "1"}, network_disabled=True)
    try:
        probes = candidate_sites(image.attrs.get("Config", {}).get("Env") or [])
        found = _first_site(container, probes)
        if found is None:
            raise SparkmodsError(f"{label}: no vllm/__init__.py in any site-packages of {name} "
                                 f"(looked in {len(probes)} folders such as {probes[0]})")
        return ImageSource(label, container, found)
    except docker.errors.DockerException as exc:
        _remove(container)
        raise SparkmodsError(f"{label}: the Docker engine failed while reading {name} ({exc})") from None
    except BaseException:
        _remove(container)
        raise


def _first_site(container: Container, sites: List[str]) -> Optional[str]:
    """The first site (in the given order) that holds vllm/__init__.py; probed in parallel."""
    def holds_vllm(site: str) -> bool:
        try:
            chunks, _ = container.get_archive(f"{site}/vllm/__init__.py")
        except docker.errors.NotFound:
            return False
        for _ in chunks:  # drain: the answer is a small tar
            pass
        return True
    futures = [(site, http.pool().submit(holds_vllm, site)) for site in sites]
    hits = [site for site, future in futures if future.result()]
    return hits[0] if hits else None
