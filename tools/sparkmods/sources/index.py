"""The package-index side: a project page (PEP 691 JSON or PEP 503 HTML), its versions, and
the one wheel per version we read.

Pages are cached on disk so `offline=True` works. Online, a page is re-fetched unless the
server's Cache-Control max-age still holds, or the caller pins one version that the cached
page already lists (released files never change, so a pin needs no fresh listing).

A page is input from a server we do not control: a PEP 691 document is checked key by key
(types, required keys) and a vllm wheel's sha256 must be exactly 64 lowercase hex digits,
because it names the wheel's cache folder. Anything else is one line naming the page URL.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Type, TypeVar, Union
from urllib.parse import unquote, urldefrag, urljoin, urlparse

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from sparkmods.errors import SparkmodsError
from sparkmods.sources.cache import cache_root, digest, is_sha256, read_bytes, write_atomic
from sparkmods.sources.fetchstats import stats

log = logging.getLogger("sparkmods.sources")
T = TypeVar("T")

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


def _index_file(page_url: str, filename: str, url: str, sha256: Optional[str], size: Optional[int],
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
    if sha256 is not None and not is_sha256(sha256):
        raise SparkmodsError(f"{page_url}: {filename} (vllm {version}): sha256 {sha256[:80]!r} is not 64 "
                             f"lowercase hex digits; refusing this index")
    rank = _rank(filename, build, {t.platform for t in tags})
    return IndexFile(filename, url, version, sha256, size, yanked, rank)


def _kind(value: object) -> str:
    """A JSON value's type in words (never the value: it may be huge)."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    names = {str: "a string", int: "a number", float: "a fractional number", list: "a list", dict: "an object"}
    return names.get(type(value), type(value).__name__)


class _Json:
    """Reads a PEP 691 document; every type error is one line naming the page and the key."""

    def __init__(self, page_url: str) -> None:
        self.page_url = page_url

    def bad(self, what: str) -> SparkmodsError:
        return SparkmodsError(f"{self.page_url}: not a valid PEP 691 project page: {what}")

    def need(self, value: object, want: Type[T], where: str, wanted: str) -> T:
        """value, refused unless it is a `want` (a bool is no number here)."""
        if not isinstance(value, want) or (isinstance(value, bool) and want is not bool):
            raise self.bad(f"{where} is {_kind(value)}, want {wanted}")
        return value

    def files(self, body: bytes) -> List[IndexFile]:
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise self.bad(f"not JSON ({str(exc)[:100]})") from None
        doc = self.need(doc, dict, "the document", "an object")
        meta = self.need(doc.get("meta", {}), dict, "meta", "an object")
        api = self.need(meta.get("api-version", "1.0"), str, "meta.api-version", "a string")
        if api.split(".")[0] != "1":
            raise SparkmodsError(f"{self.page_url}: simple API version {api[:20]} is not supported (want 1.x)")
        entries = self.need(doc.get("files"), list, "files", "a list")
        return [f for i, entry in enumerate(entries) for f in [self.entry(entry, f"files[{i}]")] if f]

    def entry(self, item: object, where: str) -> Optional[IndexFile]:
        entry = self.need(item, dict, where, "an object")
        for key in ("filename", "url"):
            self.need(entry.get(key), str, f"{where}.{key}", "a string")
        hashes = self.need(entry.get("hashes"), dict, f"{where}.hashes", "an object")
        for name, value in hashes.items():
            self.need(value, str, f"{where}.hashes.{str(name)[:20]}", "a string")
        size = entry.get("size")
        if size is not None:
            self.need(size, int, f"{where}.size", "a number of bytes")
            if size < 0:
                raise self.bad(f"{where}.size is negative")
        yanked = entry.get("yanked", False)
        if not isinstance(yanked, (bool, str)):
            raise self.bad(f"{where}.yanked is {_kind(yanked)}, want true, false or a reason")
        return _index_file(self.page_url, entry["filename"], _joined(self.page_url, entry["url"]),
                           hashes.get("sha256"), size, yanked is not False)


def _joined(page_url: str, url: str) -> str:
    """urljoin(page_url, url), without parsing both for the plain absolute URLs an index
    gives (for such a URL urljoin returns it unchanged; a per-commit page has thousands)."""
    if url.startswith(("https://", "http://")) and not any(c in url for c in "?#;\t\r\n"):
        return url
    return urljoin(page_url, url)


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
    if "json" in content_type:
        return _Json(page_url).files(body)
    files: List[IndexFile] = []
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
        found = _index_file(page_url, name, url, sha, None, "data-yanked" in attrs)
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
        self._best: Optional[Dict[Version, IndexFile]] = None

    def versions(self, include_yanked: bool = False) -> List[Version]:
        """Versions that have a wheel (and a non-yanked one unless asked), oldest first."""
        return sorted({f.version for f in self.files if include_yanked or not f.yanked})

    def wheel(self, version: Version) -> IndexFile:
        """The preferred wheel of version (non-yanked ones first); KeyError when none.

        The choice per version is made once for the whole page: a per-commit nightly index
        lists thousands of builds, and a range selects many of them."""
        if self._best is None:
            best: Dict[Version, IndexFile] = {}
            for f in self.files:
                held = best.get(f.version)
                if held is None or _preference(f) > _preference(held):
                    best[f.version] = f
            self._best = best
        return self._best[version]


def _preference(f: IndexFile) -> Tuple:
    return (not f.yanked, f.rank)


def _cached_entry(path: Path) -> Optional[dict]:
    """The cached page record, or None when absent or unreadable (then it is fetched again)."""
    raw = read_bytes(path)
    try:
        entry = json.loads(raw) if raw else None
    except (ValueError, RecursionError):
        return None
    keys: Dict[str, Union[type, Tuple[type, ...]]] = {"fetched": (int, float), "max_age": int, "body": str, "content_type": str, "final_url": str}
    if not isinstance(entry, dict) or not all(isinstance(entry.get(k), t) for k, t in keys.items()):
        return None
    return entry


def fetch_page(index_url: str, *, offline: bool, pinned: Optional[Version] = None) -> ProjectPage:
    """The vllm page of index_url: from the cache when offline/fresh/pinned-and-listed, else fetched."""
    url = project_url(index_url)
    entry_path = cache_root() / "index" / f"{digest(url)}.json"
    entry = _cached_entry(entry_path)
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
    from sparkmods.sources import http  # the HTTP layer (ssl, http.client) only once a request is due

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
