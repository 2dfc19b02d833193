"""The package-index side: a project page (PEP 691 JSON or PEP 503 HTML), its versions, and
the one wheel per version we read.

Pages are cached on disk so `offline=True` works. Online, a page is re-fetched unless the
server's Cache-Control max-age still holds, or the caller pins one version that the cached
page already lists (released files never change, so a pin needs no fresh listing).
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import List, Optional, Tuple
from urllib.parse import unquote, urldefrag, urljoin, urlparse

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from sparkmods.errors import SparkmodsError
from sparkmods.sources import http
from sparkmods.sources.cache import cache_root, digest, read_bytes, write_atomic
from sparkmods.sources.fetchstats import stats

log = logging.getLogger("sparkmods.sources")

PROJECT = "vllm"
DEFAULT_INDEX = "https://pypi.org/simple"
ACCEPT = ("application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, "
          "text/html;q=0.01")
_MAX_AGE = re.compile(r"max-age=(\d+)")


@dataclass(frozen=True)
class IndexFile:
    """One wheel of the project as the index lists it."""

    filename: str
    url: str
    version: Version
    sha256: Optional[str]
    size: Optional[int]
    yanked: bool
    rank: Tuple  # higher is preferred among the wheels of one version


def _rank(filename: str, build: Tuple, platforms: set) -> Tuple:
    """manylinux x86_64 first, then aarch64, other Linux, anything else; then the highest build tag."""
    def score(p: str) -> int:
        if p.startswith("manylinux") and p.endswith("x86_64"):
            return 3
        if p.startswith("manylinux") and p.endswith("aarch64"):
            return 2
        return 1 if "linux" in p else 0
    return (max(score(p) for p in platforms), build, filename)


def _index_file(filename: str, url: str, sha256: Optional[str], size: Optional[int],
                yanked: bool) -> Optional[IndexFile]:
    """An IndexFile for a vllm wheel; None for sdists, other projects and odd names."""
    filename = unquote(filename)
    if not filename.endswith(".whl"):
        return None
    try:
        name, version, build, tags = parse_wheel_filename(filename)
    except (InvalidWheelFilename, InvalidVersion):
        return None
    if name != PROJECT:
        return None
    rank = _rank(filename, build, {t.platform for t in tags})
    return IndexFile(filename, url, version, sha256, size, yanked, rank)


class _Anchors(HTMLParser):
    """The <a> elements of a PEP 503 page (and its <base href>, if any)."""

    def __init__(self) -> None:
        super().__init__()
        self.base: Optional[str] = None
        self.anchors: List[Tuple[dict, str]] = []
        self._open: Optional[dict] = None
        self._text: List[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "base" and self.base is None:
            self.base = dict(attrs).get("href")
        elif tag == "a":
            self._open, self._text = dict(attrs), []

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._open is not None:
            self.anchors.append((self._open, "".join(self._text).strip()))
            self._open = None


def parse_page(body: bytes, content_type: str, page_url: str) -> List[IndexFile]:
    """The vllm wheels a simple-API page lists, JSON (PEP 691) or HTML (PEP 503)."""
    files: List[IndexFile] = []
    if "json" in content_type:
        try:
            doc = json.loads(body)
            major = str(doc.get("meta", {}).get("api-version", "1.0")).split(".")[0]
            entries = doc["files"]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SparkmodsError(f"{page_url}: not a PEP 691 project page ({exc})") from None
        if major != "1":
            raise SparkmodsError(f"{page_url}: simple API version {major} is not supported (want 1.x)")
        for entry in entries:
            found = _index_file(entry.get("filename", ""), urljoin(page_url, entry.get("url", "")),
                                (entry.get("hashes") or {}).get("sha256"), entry.get("size"),
                                entry.get("yanked", False) not in (False, None))
            if found:
                files.append(found)
        return files
    parser = _Anchors()
    parser.feed(body.decode("utf-8", errors="replace"))
    base = urljoin(page_url, parser.base) if parser.base else page_url
    for attrs, text in parser.anchors:
        href = attrs.get("href")
        if not href:
            continue
        url, fragment = urldefrag(urljoin(base, href))
        sha = fragment[len("sha256="):] if fragment.startswith("sha256=") else None
        name = text or urlparse(url).path.rsplit("/", 1)[-1]
        found = _index_file(name, url, sha, None, "data-yanked" in attrs)
        if found:
            files.append(found)
    return files


def project_url(index_url: str) -> str:
    """The vllm page of an index: the URL itself when it already names the project."""
    trimmed = index_url.rstrip("/")
    if canonicalize_name(trimmed.rsplit("/", 1)[-1]) == PROJECT:
        return trimmed + "/"
    return f"{trimmed}/{PROJECT}/"


class ProjectPage:
    """The vllm wheels one index page lists, by version."""

    def __init__(self, url: str, files: List[IndexFile]) -> None:
        self.url = url
        self.files = files

    def versions(self, include_yanked: bool = False) -> List[Version]:
        """Versions that have a wheel (and a non-yanked one unless asked), oldest first."""
        return sorted({f.version for f in self.files if include_yanked or not f.yanked})

    def wheel(self, version: Version) -> IndexFile:
        """The preferred wheel of version (non-yanked ones first)."""
        choices = [f for f in self.files if f.version == version]
        return max(choices, key=lambda f: (not f.yanked, f.rank))


def fetch_page(index_url: str, *, offline: bool, pinned: Optional[Version] = None) -> ProjectPage:
    """The vllm page of index_url: from the cache when offline/fresh/pinned-and-listed, else fetched."""
    url = project_url(index_url)
    entry_path = cache_root() / "index" / f"{digest(url)}.json"
    raw = read_bytes(entry_path)
    entry = json.loads(raw) if raw else None
    if entry is not None:
        fresh = time.time() - entry["fetched"] < entry.get("max_age", 0)
        if offline or fresh or pinned is not None:
            page = ProjectPage(url, parse_page(entry["body"].encode("utf-8"), entry["content_type"],
                                               entry["final_url"]))
            if offline or fresh or pinned in page.versions(include_yanked=True):
                stats.add(cache_hits=1)
                return page
    if offline:
        raise SparkmodsError(f"offline and the index page {url} is not in the cache ({cache_root()}); "
                             f"run once without --offline")
    response = http.get(url, accept=ACCEPT)
    content_type = response.headers.get("content-type", "text/html")
    page = ProjectPage(url, parse_page(response.body, content_type, response.url))
    if not page.files:
        raise SparkmodsError(f"{url}: the index lists no vllm wheels")
    cache_control = response.headers.get("cache-control", "")
    max_age = None if re.search(r"no-cache|no-store", cache_control) else _MAX_AGE.search(cache_control)
    entry = {"url": url, "final_url": response.url, "content_type": content_type, "fetched": time.time(),
             "max_age": int(max_age.group(1)) if max_age else 0,
             "body": response.body.decode("utf-8", errors="replace")}
    write_atomic(entry_path, json.dumps(entry).encode("utf-8"))
    return page
