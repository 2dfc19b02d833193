"""`open_targets(spec)`: turn one `--vllm` target string into VllmSources."""

from __future__ import annotations

import logging
import os
import re
from typing import Callable, Dict, List, Optional

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from sparkmods.errors import SparkmodsError
from sparkmods.sources.base import VllmSource
from sparkmods.sources.index import DEFAULT_INDEX, ProjectPage, fetch_page
from sparkmods.sources.remote import RemoteWheel
from sparkmods.sources.siblings import Siblings

log = logging.getLogger("sparkmods.sources")

FORMS = ("VERSION, pypi:VERSION, latest, '>=0.18', index:URL[#VERSION], wheel:PATH, dir:PATH[#VERSION], "
         "git:PATH[@REF], image:NAME")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*$")


def default_index(index_url: Optional[str]) -> str:
    """The argument, else $SPARKMODS_INDEX_URL, else PyPI."""
    return index_url or os.environ.get("SPARKMODS_INDEX_URL") or DEFAULT_INDEX


def _local_openers() -> Dict[str, Callable[[str, str], VllmSource]]:
    # Imported here: gitpython and docker cost import time only when such a target is named.
    from sparkmods.sources.gitrepo import open_git
    from sparkmods.sources.image import open_image
    from sparkmods.sources.tree import open_dir
    from sparkmods.sources.wheel import open_wheel
    return {"wheel": open_wheel, "dir": open_dir, "git": open_git, "image": open_image}


def open_targets(spec: str, *, index_url: Optional[str] = None, offline: bool = False,
                 prereleases: bool = False) -> List[VllmSource]:
    """Every vLLM the spec names; a range expands to each release in it, oldest first."""
    text = spec.strip()
    if not text:
        raise SparkmodsError(f"empty vLLM target; use one of {FORMS}")
    scheme, colon, rest = text.partition(":")
    if colon and scheme in ("wheel", "dir", "git", "image"):
        if not rest.strip():
            raise SparkmodsError(f"vLLM target {text!r} names no {scheme}; use {scheme}:...")
        return [_local_openers()[scheme](rest.strip(), text)]
    if colon and scheme == "index":
        url, _, selector = rest.partition("#")
        if not url.startswith(("http://", "https://")):
            raise SparkmodsError(f"vLLM target {text!r}: index: needs an http(s) URL, "
                                 f"e.g. index:https://host/simple#0.19.1")
        return _from_index(url, selector, f"index:{url}#", offline=offline,
                           prereleases=prereleases or not selector.strip(), where=text)
    if colon and scheme == "pypi":
        if not rest.strip():  # not silently the latest: a version was about to be named
            raise SparkmodsError(f"vLLM target {text!r} names no version; use pypi:VERSION (or latest)")
        return _from_index(default_index(index_url), rest, "pypi:", offline=offline,
                           prereleases=prereleases, where=text)
    if colon and _SCHEME.match(scheme):
        raise SparkmodsError(f"unknown vLLM target {text!r}; use one of {FORMS}")
    return _from_index(default_index(index_url), text, "pypi:", offline=offline,
                       prereleases=prereleases, where=text)


def _from_index(index_url: str, selector: str, prefix: str, *, offline: bool, prereleases: bool,
                where: str) -> List[VllmSource]:
    selector = selector.strip()
    pinned = _as_version(selector)
    if pinned is not None:
        page = fetch_page(index_url, offline=offline, pinned=pinned)
        return [_wheel(page, _find(page, pinned, selector), prefix, offline)]
    if selector in ("", "latest"):
        page = fetch_page(index_url, offline=offline)
        versions = [v for v in page.versions() if prereleases or not v.is_prerelease]
        if not versions:
            raise SparkmodsError(f"{where}: {page.url} has no vllm release (pre-releases need --pre)")
        return [_wheel(page, versions[-1], prefix, offline)]
    try:
        wanted = SpecifierSet(selector)
    except InvalidSpecifier:
        raise SparkmodsError(f"bad vLLM target {where!r}: not a version or a range like '>=0.18'; "
                             f"use one of {FORMS}") from None
    page = fetch_page(index_url, offline=offline)
    versions = list(wanted.filter(page.versions(), prereleases=prereleases))
    if not versions:
        raise SparkmodsError(f"{where}: no vllm release on {page.url} is in {selector!r}"
                             + ("" if prereleases else " (pre-releases need --pre)"))
    siblings = Siblings()  # the range's wheels share member contents and asked paths
    return [_wheel(page, v, prefix, offline, siblings) for v in versions]


def _as_version(selector: str) -> Optional[Version]:
    if not selector or selector == "latest" or selector[0] in "<>=!~":
        return None
    try:
        return Version(selector)
    except InvalidVersion:
        return None


def _find(page: ProjectPage, pinned: Version, selector: str) -> Version:
    """pinned itself, or the one listed build whose public version it is (nightly +local labels)."""
    listed = page.versions(include_yanked=True)
    if pinned in listed:
        return pinned
    same = [v for v in listed if pinned.local is None and Version(v.public) == pinned]
    if len(same) == 1:
        return same[0]
    newest = listed[-1] if listed else "none"
    hint = f"; several builds match: {', '.join(map(str, same))}" if same else ""
    raise SparkmodsError(f"vllm {selector} is not on {page.url} (newest there: {newest}){hint}")


def _wheel(page: ProjectPage, version: Version, prefix: str, offline: bool,
           siblings: Optional[Siblings] = None) -> RemoteWheel:
    chosen = page.wheel(version)
    if chosen.yanked:
        log.warning("vllm %s is yanked on %s; reading it because it was named exactly", version, page.url)
    text = str(version)
    return RemoteWheel(f"{prefix}{text}", text, chosen.url, filename=chosen.filename,
                       sha256=chosen.sha256, size=chosen.size, offline=offline, siblings=siblings)
