"""A mod's manifest: its variants keyed by vLLM range, validated strictly.

The hand-written source is `mod.toml`; `sparkmods sync` stores the same data as
`manifest.json` beside it so the container needs neither tomllib nor any
third-party package. Both go through `Manifest.from_dict`, so they validate identically.
Every error names the file, the key and the problem in one line.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

from .engine import PACKAGE, UnsafePath, check_relpath, confine
from .fsops import StrPath
from .pep440 import InvalidRange, InvalidVersion, Range, Version

__all__ = ["ManifestError", "Install", "Variant", "Upstream", "Manifest", "load_manifest", "MANIFEST_TOML", "MANIFEST_JSON"]

MANIFEST_TOML = "mod.toml"
MANIFEST_JSON = "manifest.json"
SCHEMA = 1


LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$")
MOD_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_WORKSPACE = "workspace:"
_SITE = "site:"


class ManifestError(ValueError):
    """A manifest problem: `<file>: <key>: <problem>`."""


@dataclass
class Install:
    """A file the mod installs: `src` inside the mod; `name` is a file name in $WORKSPACE_DIR
    (site False) or a package path inside vllm/ (site True, journaled like a patched file)."""

    src: str
    name: str
    site: bool = False


@dataclass
class Variant:
    """The patches and installs for one range of vLLM versions."""

    label: str
    vllm: Range
    patches: List[str]
    install: List[Install]
    verified: List[str]
    notes: str = ""


@dataclass
class Detect:
    """A file of vLLM that must contain a text for the upstream fix to count as present."""

    file: str
    contains: str


@dataclass
class Upstream:
    """From `since` on, vLLM carries the mod's change itself."""

    since: Version
    evidence: str
    detect: List[Detect]


@dataclass
class Manifest:
    """A validated manifest; `raw` is the table it was read from (what manifest.json holds)."""

    name: str
    summary: str
    variants: List[Variant]
    upstream: Optional[Upstream] = None
    source: str = MANIFEST_TOML
    raw: Dict[str, Any] = field(default_factory=dict)

    def select(self, version: Union[str, Version]) -> Union[Variant, Upstream, None]:
        """The variant whose range holds version; the upstream section past `since`; or None."""
        v = Version(version) if isinstance(version, str) else version
        for variant in self.variants:
            if variant.vllm.contains(v):
                return variant
        if self.upstream is not None and v.public >= self.upstream.since:
            return self.upstream
        return None

    def describe_variants(self) -> str:
        """One line listing every variant, its range and the releases it was verified on."""
        parts = [
            f"{v.label} ({v.vllm}; verified on {', '.join(v.verified) or 'nothing yet'})" for v in self.variants
        ]
        if self.upstream is not None:
            parts.append(f"upstream from {self.upstream.since}")
        return "; ".join(parts)

    @classmethod
    def from_dict(cls, data: Dict[str, Any], source: str) -> "Manifest":
        return _Validator(source).manifest(data)


class _Validator:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, problem: str) -> "ManifestError":
        return ManifestError(f"{self.source}: {key}: {problem}")

    def keys(self, table: Dict[str, Any], where: str, required: List[str], optional: List[str]) -> None:
        for key in required:
            if key not in table:
                raise self.fail(f"{where}{key}", "missing (required)")
        for key in table:
            if key not in required and key not in optional:
                raise self.fail(f"{where}{key}", f"unknown key (allowed: {', '.join(required + optional)})")

    def string(self, value: Any, key: str, form: Optional[re.Pattern[str]] = None) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, f"must be a non-empty string, got {value!r}")
        if form is not None and not form.fullmatch(value):
            raise self.fail(key, f"{value!r} does not match {form.pattern}")
        return value

    def str_list(self, value: Any, key: str) -> List[str]:
        if not isinstance(value, list):
            raise self.fail(key, f"must be a list of strings, got {type(value).__name__}")
        return [self.string(item, f"{key}[{i}]") for i, item in enumerate(value)]

    def relpath(self, value: Any, key: str) -> str:
        try:
            return check_relpath(self.string(value, key))
        except UnsafePath as exc:
            raise self.fail(key, str(exc)) from None

    def manifest(self, data: Dict[str, Any]) -> Manifest:
        if not isinstance(data, dict):
            raise self.fail("(top)", "must be a table")
        self.keys(data, "", ["schema", "name", "summary", "variant"], ["upstream"])
        if data["schema"] != SCHEMA:
            raise self.fail("schema", f"unsupported schema {data['schema']!r} (this sparkmods reads {SCHEMA})")
        name = self.string(data["name"], "name", MOD_NAME)
        summary = self.string(data["summary"], "summary")
        raw_variants = data["variant"]
        if not isinstance(raw_variants, list) or not raw_variants:
            raise self.fail("variant", "must be a non-empty array of tables ([[variant]])")
        variants = [self.variant(v, i) for i, v in enumerate(raw_variants)]
        seen: Dict[str, int] = {}
        for i, v in enumerate(variants):
            if v.label in seen:
                raise self.fail(f"variant[{i}].label", f"duplicate label {v.label!r} (also variant[{seen[v.label]}])")
            seen[v.label] = i
            for j in range(i):
                if variants[j].vllm.overlaps(v.vllm):
                    raise self.fail(
                        f"variant[{i}].vllm",
                        f"range {v.vllm} overlaps variant {variants[j].label!r} ({variants[j].vllm})",
                    )
        upstream = self.upstream(data["upstream"]) if "upstream" in data else None
        if upstream is not None:
            for i, v in enumerate(variants):
                if v.vllm.overlaps(Range(f">={upstream.since}")):
                    raise self.fail(
                        f"variant[{i}].vllm",
                        f"range {v.vllm} reaches into upstream.since {upstream.since}: end it below",
                    )
        return Manifest(name, summary, variants, upstream, self.source, data)

    def variant(self, table: Any, i: int) -> Variant:
        where = f"variant[{i}]."
        if not isinstance(table, dict):
            raise self.fail(f"variant[{i}]", "must be a table")
        self.keys(table, where, ["label", "vllm", "verified"], ["patches", "install", "notes"])
        label = self.string(table["label"], where + "label", LABEL)
        try:
            rng = Range(self.string(table["vllm"], where + "vllm"))
        except InvalidRange as exc:
            raise self.fail(where + "vllm", str(exc)) from None
        patches = [self.relpath(p, f"{where}patches[{k}]")
                   for k, p in enumerate(self.list_of(table.get("patches", []), where + "patches"))]
        installs = [self.install(t, f"{where}install[{k}]") for k, t in enumerate(self.list_of(table.get("install", []), where + "install"))]
        if not patches and not installs:
            raise self.fail(where + "patches", "a variant needs patches or install entries")
        verified = self.str_list(table["verified"], where + "verified")
        for k, text in enumerate(verified):
            try:
                version = Version(text)
            except InvalidVersion as exc:
                raise self.fail(f"{where}verified[{k}]", str(exc)) from None
            if not rng.contains(version):
                raise self.fail(f"{where}verified[{k}]", f"{text} is outside the variant's range {rng}")
        notes = self.string(table["notes"], where + "notes") if "notes" in table else ""
        return Variant(label, rng, patches, installs, verified, notes)

    def list_of(self, value: Any, key: str) -> list:
        if not isinstance(value, list):
            raise self.fail(key, f"must be an array, got {type(value).__name__}")
        return value

    def install(self, table: Any, key: str) -> Install:
        if not isinstance(table, dict):
            raise self.fail(key, "must be a table {src = ..., dest = ...}")
        self.keys(table, key + ".", ["src", "dest"], [])
        src = self.relpath(table["src"], key + ".src")
        dest = self.string(table["dest"], key + ".dest")
        if dest.startswith(_SITE):
            try:
                return Install(src, confine(dest[len(_SITE):]), site=True)
            except UnsafePath as exc:
                raise self.fail(key + ".dest", f"{exc} (site: destinations are package paths, {PACKAGE}/...)") from None
        if not dest.startswith(_WORKSPACE):
            raise self.fail(key + ".dest", f"{dest!r} must start with {_WORKSPACE!r} or {_SITE!r}")
        name = dest[len(_WORKSPACE):]
        if not name or "/" in name or "\\" in name or name in (".", ".."):
            raise self.fail(key + ".dest", f"{dest!r} must name one file in the workspace")
        return Install(src, name)

    def upstream(self, table: Any) -> Upstream:
        if not isinstance(table, dict):
            raise self.fail("upstream", "must be a table")
        self.keys(table, "upstream.", ["since", "evidence", "detect"], [])
        try:
            since = Version(self.string(table["since"], "upstream.since"))
        except InvalidVersion as exc:
            raise self.fail("upstream.since", str(exc)) from None
        evidence = self.string(table["evidence"], "upstream.evidence")
        detects = []
        for k, item in enumerate(self.list_of(table["detect"], "upstream.detect")):
            key = f"upstream.detect[{k}]"
            if not isinstance(item, dict):
                raise self.fail(key, "must be a table {file = ..., contains = ...}")
            self.keys(item, key + ".", ["file", "contains"], [])
            detects.append(Detect(self.relpath(item["file"], key + ".file"), self.string(item["contains"], key + ".contains")))
        if not detects:
            raise self.fail("upstream.detect", "needs at least one {file, contains} check")
        return Upstream(since, evidence, detects)


# Inside a mod (run.sh) this module is `_sparkmods.manifest`, and the mod's manifest is the
# manifest.json that `sparkmods sync` generated beside it: no TOML parser to load or run.
_IN_MOD = __package__ == "_sparkmods"


def load_manifest(mod_dir: StrPath) -> Manifest:
    """The generated manifest.json inside a mod (run.sh); on the host mod.toml when a TOML
    reader exists, else manifest.json."""
    toml_path = os.path.join(mod_dir, MANIFEST_TOML)
    json_path = os.path.join(mod_dir, MANIFEST_JSON)
    data: Any
    if not _IN_MOD and os.path.isfile(toml_path):
        if sys.version_info >= (3, 11):
            import tomllib
        else:
            try:
                import tomli as tomllib
            except ImportError:
                tomllib = None
        if tomllib is not None:
            try:
                data = tomllib.loads(_utf8(toml_path, _read(toml_path)))
            except tomllib.TOMLDecodeError as exc:
                raise ManifestError(f"{toml_path}: (syntax): {exc}") from None
            except RecursionError:
                raise ManifestError(f"{toml_path}: (syntax): nested too deeply") from None
            manifest = Manifest.from_dict(data, toml_path)
            _check_name(manifest, mod_dir, toml_path)
            return manifest
    if not os.path.isfile(json_path):
        raise ManifestError(f"{mod_dir}: no {MANIFEST_TOML} or {MANIFEST_JSON}: not a mod folder")
    data = _decode_json(json_path, _read(json_path))
    manifest = Manifest.from_dict(data, json_path)
    _check_name(manifest, mod_dir, json_path)
    return manifest


def _decode_json(path: str, raw: bytes) -> Any:
    """manifest.json's data; bad JSON is a one-line ManifestError."""
    text = _utf8(path, raw)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ManifestError(f"{path}: (syntax): {exc}") from None
    except RecursionError:
        raise ManifestError(f"{path}: (syntax): nested too deeply") from None


def _read(path: str) -> bytes:
    """A manifest's bytes; an unreadable file is a one-line ManifestError."""
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _utf8(path: str, raw: bytes) -> str:
    """A manifest's text; binary content is a one-line ManifestError."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path}: not UTF-8 text (byte {exc.start}): is it a binary file?") from None


def _check_name(manifest: Manifest, mod_dir: StrPath, source: str) -> None:
    # Inside a container the folder is /workspace/mods/<basename>, so the name must match it.
    folder = os.path.basename(os.path.realpath(mod_dir))
    if folder != manifest.name:
        raise ManifestError(f"{source}: name: {manifest.name!r} differs from the folder name {folder!r}")
