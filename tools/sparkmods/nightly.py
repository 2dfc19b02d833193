"""The nightly job: check every mod against vLLM's newest nightly and any release newer than
the committed matrix, and write a Markdown report fit for a CI step summary.

vLLM's per-commit wheel repository publishes `/nightly/vllm/` (a PEP 503 page whose links point
into `/<commit>/`) with a `metadata.json` listing each wheel's version, platform tag and path,
and the same pair under `/<commit>/vllm/` for every commit on main.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence

from sparkmods.checking.batch import check_mods
from sparkmods.checking.rows import CheckRow, breaks
from sparkmods.errors import SparkmodsError
from sparkmods.runtime.modcheck import DRIFT, ModResult
from sparkmods.runtime.pep440 import InvalidVersion, Version
from sparkmods.sources import open_targets
from sparkmods.sources.http import get
from sparkmods.sources.index import fetch_page
from sparkmods.sources.spec import default_index

DEFAULT_NIGHTLY_URL = "https://wheels.vllm.ai"


@dataclass
class NightlyTarget:
    spec: str  # an index: target spec for the sources layer
    version: str
    commit: Optional[str]


def resolve_nightly(base_url: str, commit: Optional[str] = None) -> NightlyTarget:
    """The newest x86_64 wheel of /nightly/ (or of /<commit>/) from its metadata.json."""
    folder = f"{base_url.rstrip('/')}/{commit or 'nightly'}/vllm/"
    try:
        entries = json.loads(get(folder + "metadata.json").body)
    except ValueError as exc:
        raise SparkmodsError(f"{folder}metadata.json: not valid JSON ({exc})") from None
    best: Optional[Version] = None
    for entry in entries if isinstance(entries, list) else []:
        if "x86_64" not in str(entry.get("platform_tag", "")) or entry.get("package_name", "vllm") != "vllm":
            continue
        try:
            version = Version(str(entry["version"]))
        except (KeyError, InvalidVersion):
            continue
        if best is None or version > best:
            best = version
    if best is None:
        raise SparkmodsError(f"{folder}metadata.json lists no x86_64 vllm wheel")
    return NightlyTarget(f"index:{folder}#{best}", str(best), best.commit or commit)


def newer_releases(matrix: Optional[dict], index_url: Optional[str], offline: bool = False) -> List[str]:
    """Target specs for every release newer than the newest one the committed matrix covers."""
    covered = [Version(r["vllm"]) for r in (matrix or {}).get("releases", []) if r["target"].startswith("pypi:")]
    page = fetch_page(default_index(index_url), offline=offline)
    newest = max(covered, default=None)
    return [f"pypi:{v}" for v in page.versions() if not v.is_prerelease and (newest is None or Version(str(v)) > newest)]


@dataclass
class Report:
    rows: List[CheckRow] = field(default_factory=list)
    sources: List = field(default_factory=list)  # the VllmSources the rows were checked on

    @property
    def broken(self) -> List[CheckRow]:
        return [r for r in self.rows if not r.result.green]

    def markdown(self) -> str:
        out = ["## sparkmods: mods against new vLLM builds", ""]
        if not self.rows:
            out.append("Nothing to check: no nightly was asked for and no release is newer than the matrix.")
            return "\n".join(out) + "\n"
        targets = []
        for row in self.rows:
            if row.target not in targets:
                targets.append(row.target)
        out.append("| mod | " + " | ".join(f"`{t}`" for t in targets) + " |")
        out.append("|---|" + "---|" * len(targets))
        by_mod: dict = {}
        for row in self.rows:
            by_mod.setdefault(row.result.mod, {})[row.target] = row.result
        for mod, cells in by_mod.items():
            out.append(f"| {mod} | " + " | ".join(
                f"{'✅' if cells[t].green else '❌'} {cells[t].status}" if t in cells else ""
                for t in targets) + " |")
        out.append("")
        if not self.broken:
            out.append("Every mod applies to every build checked.")
            return "\n".join(out) + "\n"
        out += ["### What broke", ""]
        for row in self.broken:
            res = row.result
            out.append(f"- **{res.mod}** on `{row.target}` (vLLM {res.version}"
                       + (f", commit {row.commit}" if row.commit else "") + f"): `{res.status}`"
                       + (f", variant `{res.variant}`" if res.variant else ""))
            out += [f"  {line}" for line in break_lines(res)]
            out.append(f"  - suggested: `sparkmods rebase {res.mod} --onto '{row.target}'`")
        return "\n".join(out) + "\n"


def break_lines(res: ModResult) -> List[str]:
    """What broke in one check result, as a Markdown list: each conflicting hunk (with up to
    three of its differing lines), each missing file, and the reason of a drift or no-variant."""
    out = []
    for f, h in breaks(res.files):
        if h is None:
            out.append(f"- `{f.path}` does not exist in this build")
            continue
        out.append(f"- `{f.path}` hunk {h.index} (stated line {h.stated_line}): {h.reason}")
        if h.near is not None:
            for line, expected, found in h.near.differing[:3]:
                out.append(f"  - line {line}: expected `{expected.strip()}`, found `{found.strip()}`")
    if res.reason and (res.status == DRIFT or not res.files):
        out.append(f"- {res.reason}")
    return out


def run_job(mod_dirs: Sequence[Path], specs: Sequence[str], index_url: Optional[str] = None,
            offline: bool = False) -> Report:
    sources = [s for spec in specs for s in open_targets(spec, index_url=index_url, offline=offline)]
    return Report(check_mods(mod_dirs, sources), sources)


def community_broke(doc: Optional[dict]) -> str:
    """A Markdown line on the committed community matrix (ci/bench/bench_community.py): the
    community mods whose run changed vLLM on the release before the newest and no longer does
    on the newest ("" when there is no matrix)."""
    if not doc or not doc.get("cells") or len(doc.get("releases", [])) < 2:
        return ""
    before, newest = (r["vllm"] for r in doc["releases"][-2:])
    cells = {(c["mod"], c["vllm"]): c["status"] for c in doc["cells"]}
    broke = sorted(f"{m['name']} ({cells[(m['name'], newest)]})" for m in doc["mods"]
                   if cells.get((m["name"], before)) == "applied" and cells.get((m["name"], newest)) != "applied")
    where = f"{doc['mirror']['repository']} at {doc['mirror']['commit'][:12]}"
    head = f"\nCommunity mods ({where}, {len(doc['mods'])} run in the sandbox): "
    if not broke:
        return head + f"none that changed vLLM {before} stopped on {newest}.\n"
    return head + f"{len(broke)} broke on {newest} (they changed vLLM {before}): {', '.join(broke)}.\n"
