#!/usr/bin/env python3
"""Every mod on real non-release vLLM trees: which variant it chose by content, and whether it applied.

For each `[NAME=]git:PATH@REF` given (a fork's clone without release tags, or vLLM main; NAME
is what the report calls it, e.g. the repository it was cloned from), two targets:
  git:PATH@REF  `sparkmods check`'s own path (checking.batch.check_mods: the decision plus drift), with
                the version vLLM's build gives that commit (0.1.dev<commits>+g<hash> without tags);
  dir:TREE      the commit's vllm/ folder exported with a dist-info whose METADATA carries that
                version, as an image built from it has; every mod's run.sh entry point
                (applier.run) checks, applies and reverts it, and the tree must come back byte
                for byte.

    .venv/bin/python ci/bench/any_build.py [NAME=]git:/tmp/fork.git@main [...] \
        [--out ci/bench/results/any-build-any-cpu] [--work /tmp/any-build] [--note TEXT]

Writes any-build.json and any-build.md into --out. Exit code 1 when a dir: row is not green, an
apply or revert fails, or a tree does not come back byte for byte.
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import shutil
import subprocess
import sys
import tarfile
from datetime import date
from pathlib import Path
from typing import List

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO / "tests"))

from realtree import run_quietly, snapshot  # noqa: E402
from sparkmods.checking import resultcache  # noqa: E402
from sparkmods.checking.batch import check_mods  # noqa: E402
from sparkmods.sources import open_targets  # noqa: E402


def export(spec: str, dest: Path) -> "tuple[Path, str, str]":
    """The commit's vllm/ folder under dest, with a dist-info naming the version vLLM's build
    would give it; (site, version, commit)."""
    (source,) = open_targets(spec)
    path, _, _ref = spec[len("git:"):].rpartition("@")
    archive = subprocess.run(["git", "-C", path, "archive", "--format=tar", source.commit, "vllm"],
                             check=True, capture_output=True).stdout
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    dist = dest / f"vllm-{source.version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {source.version}\n\n")
    return dest, source.version, source.commit


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="+", metavar="[NAME=]git:PATH@REF")
    parser.add_argument("--note", action="append", default=[], help="a paragraph for the report (repeatable)")
    parser.add_argument("--out", type=Path, default=REPO / "ci/bench/results/any-build-any-cpu")
    parser.add_argument("--work", type=Path, default=Path("/tmp/any-build"))
    parser.add_argument("--mods", type=Path, default=REPO / "mods")
    args = parser.parse_args()
    mods = sorted(p.parent for p in args.mods.glob("*/mod.toml"))
    resultcache.start(reuse=False)
    rows: List[dict] = []
    ok = True
    for n, given in enumerate(args.targets):
        name, _, spec = given.rpartition("=") if "=git:" in given else ("", "", given)
        name = name or spec
        for row in check_mods(mods, open_targets(spec)):
            rows.append({"target": name, "kind": "git", "commit": row.commit, **_decision(row.result.to_dict())})
        site, _version, commit = export(spec, args.work / f"tree{n}")
        dir_rows = {r.result.mod: r.result for r in check_mods(mods, open_targets(f"dir:{site}"))}
        for mod in mods:
            before = snapshot(site)
            workspace = args.work / f"ws{n}-{mod.name}"
            workspace.mkdir(parents=True, exist_ok=True)
            checked, printed = run_quietly("check", mod, site, workspace)
            applied, _ = run_quietly("apply", mod, site, workspace)
            reverted, _ = run_quietly("revert", mod, site, workspace)
            lines = printed.splitlines()
            same = snapshot(site) == before
            row = {"target": name, "kind": "dir", "commit": commit,
                   **_decision(dir_rows[mod.name].to_dict()), "run_sh_line": lines[0] if lines else "",
                   "check_rc": checked, "apply_rc": applied, "revert_rc": reverted, "byte_identical": same}
            ok &= row["status"] in ("ok", "ok-offset", "applied", "upstream") and not (checked or applied or reverted)
            ok &= same
            rows.append(row)
    command = "ci/bench/any_build.py " + " ".join(args.targets)
    doc = {"generated": str(date.today()), "python": platform.python_version(), "command": command,
           "notes": args.note, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "any-build.json").write_text(json.dumps(doc, indent=2) + "\n")
    (args.out / "any-build.md").write_text(_markdown(doc))
    print(_markdown(doc))
    return 0 if ok else 1


def _decision(result: dict) -> dict:
    keep = ("mod", "vllm", "variant", "status", "chosen_by", "reason")
    return {k: result.get(k) for k in keep if result.get(k) not in (None, "")} | {"variant": result.get("variant")}


def _markdown(doc: dict) -> str:
    lines = ["# Mods on non-release vLLM trees: the variant chosen by content", "",
             f"Generated by `{doc['command']}` on {doc['generated']} (Python {doc['python']}).", "",
             "git: rows are `sparkmods check` (the decision plus drift); dir: rows are the same commit's vllm/ "
             "with a METADATA naming its version, where each mod's run.sh entry point ran check, apply and revert.",
             ""] + [f"{note}\n" for note in doc["notes"]] + [
             "| target | as | commit | vLLM reports | mod | variant | status | check/apply/revert | tree back | why |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        codes = f"{r['check_rc']}/{r['apply_rc']}/{r['revert_rc']}" if r["kind"] == "dir" else "-"
        back = ("yes" if r["byte_identical"] else "NO") if r["kind"] == "dir" else "-"
        why = (r.get("chosen_by") or r.get("reason") or "").replace("|", "/")
        lines.append(f"| {r['target']} | {r['kind']}: | {r['commit'][:12]} | {r['vllm']} | {r['mod']} | {r['variant'] or '-'} | "
                     f"{r['status']} | {codes} | {back} | {why} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
