"""How many of eugr/spark-vllm-docker's own mods sparkmods judges the way their run.sh behaves.

Reads a git mirror of the repository (no work tree needed: `git --git-dir`), takes every
mods/<name>/ folder of every ref given (default: every branch and pull-request head), keeps
each distinct folder once (same name and same tree: one mod), extracts it to a scratch
folder, and reads its run.sh with sparkmods.community (never running it). Checkable mods are
judged on every vLLM release >= 0.18.0 (or the --vllm given) and planned for adoption; the
others are counted by the reason the reader gives. Writes community.json and community.md
under --out and prints a summary.

    .venv/bin/python ci/bench/bench_community.py --mirror /work/.mirror/eugr+spark-vllm-docker/repo
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

from sparkmods.community.adopt import plan_adoption
from sparkmods.community.judge import judge_all
from sparkmods.community.runsh import read_mod
from sparkmods.errors import SparkmodsError
from sparkmods.matrix.build import sort_sources
from sparkmods.sources import open_targets, stats

RESULTS = Path(__file__).resolve().parent / "results"


def git(mirror: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(mirror), *args], check=True, capture_output=True,
                          text=True).stdout


def distinct_mods(mirror: Path, refs: List[str]) -> Dict[Tuple[str, str], Tuple[str, str]]:
    """(name, tree id) -> (ref, commit) where the folder was first seen."""
    found: Dict[Tuple[str, str], Tuple[str, str]] = {}
    for ref in refs:
        commit = git(mirror, "rev-parse", ref).strip()
        for line in git(mirror, "ls-tree", commit, "mods/").splitlines():
            meta, path = line.split("\t", 1)
            kind, tree = meta.split()[1:]
            if kind == "tree":
                found.setdefault((Path(path).name, tree), (ref, commit))
    return found


def extract(mirror: Path, tree: str, dest: Path) -> None:
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "--git-dir", str(mirror), "archive", tree], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mirror", required=True, type=Path, help="the git directory of a spark-vllm-docker mirror")
    ap.add_argument("--ref", action="append", default=[], help="refs to read (default: every ref)")
    ap.add_argument("--vllm", action="append", default=[], help="targets (default: every release >= 0.18.0)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    refs = args.ref or git(args.mirror, "for-each-ref", "--format=%(refname)").split()
    started = time.monotonic()
    mods = distinct_mods(args.mirror, refs)
    sources = sort_sources([s for spec in (args.vllm or [">=0.18.0"]) for s in open_targets(spec)])
    entries = []
    with tempfile.TemporaryDirectory() as tmp:
        read = []
        for (name, tree), (ref, commit) in sorted(mods.items()):
            folder = Path(tmp) / tree / name
            extract(args.mirror, tree, folder)
            read.append((read_mod(folder), ref, commit, tree))
        checkable = [m for m, *_ in read if m.checkable]
        rows = judge_all(checkable, sources)
        for mod, ref, commit, tree in read:
            entry = {"mod": mod.name, "tree": tree, "first_seen": {"ref": ref, "commit": commit},
                     "checkable": mod.checkable, "reason": mod.why_not() or None,
                     "kind": mod.blockers[0].kind if mod.blockers else ("judged" if mod.checkable else "nothing"),
                     "steps": [s.to_dict() for s in mod.steps]}
            if mod.checkable:
                i = checkable.index(mod)
                entry["cells"] = {s.version: {"status": per[i].status, "reason": per[i].reason}
                                  for s, per in zip(sources, rows)}
                try:
                    adopted = plan_adoption(mod, mod.name.lower(), sources)
                    entry["adopt"] = [{"label": v.label, "vllm": v.vllm, "verified": v.verified} for v in adopted.variants]
                except SparkmodsError as exc:
                    entry["adopt"] = str(exc)
            entries.append(entry)
    fetch = stats.snapshot()
    kinds = collections.Counter(e["kind"] for e in entries)
    doc = {"repository": "eugr/spark-vllm-docker", "mirror": str(args.mirror),
           "refs": {r: git(args.mirror, "rev-parse", r).strip() for r in refs},
           "targets": [s.version for s in sources], "mods": entries, "by_kind": dict(sorted(kinds.items())),
           "judged": kinds.get("judged", 0), "distinct_mods": len(entries),
           "seconds": round(time.monotonic() - started, 2), "fetch": fetch}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "community.json").write_text(json.dumps(doc, indent=1) + "\n")
    (args.out / "community.md").write_text(markdown(doc))
    print(f"{doc['distinct_mods']} distinct mods in {len(refs)} refs; judged as run.sh behaves: {doc['judged']}; "
          f"by kind: {doc['by_kind']}; {len(sources)} targets; {doc['seconds']} s, "
          f"{fetch.get('requests', '?')} requests")
    return 0


def markdown(doc: dict) -> str:
    out = ["# Community mods judged as their run.sh behaves (`ci/bench/bench_community.py`)", "",
           f"{doc['repository']} mirror, refs: " + ", ".join(f"`{r}` {c[:12]}" for r, c in doc["refs"].items()), "",
           f"{doc['distinct_mods']} distinct mod folders; judged: {doc['judged']}; by kind: "
           + ", ".join(f"{k} {n}" for k, n in doc["by_kind"].items())
           + f". Targets: {len(doc['targets'])} releases ({doc['targets'][0]} .. {doc['targets'][-1]}); "
           f"{doc['seconds']} s.", "", "| mod | first seen | verdict |", "|---|---|---|"]
    for e in doc["mods"]:
        if e["checkable"]:
            counts = collections.Counter(c["status"] for c in e["cells"].values())
            verdict = ", ".join(f"{s} {n}" for s, n in sorted(counts.items()))
            adopt = e["adopt"] if isinstance(e["adopt"], str) else "; ".join(
                f"{v['label']} {v['vllm']}" for v in e["adopt"])
            verdict += f"; adopt: {adopt}"
        else:
            verdict = f"not checkable: {e['reason']}"
        out.append(f"| {e['mod']} | `{e['first_seen']['ref']}` | {verdict.replace('|', '/')} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
