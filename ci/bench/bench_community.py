"""The community matrix: every mod of the mirror's newest snapshot run, as launch-cluster.sh
--apply-mod runs it, in the sandbox against every vLLM release >= 0.18.0 (sparkmods.community.sandbox).

The mirror is a git directory of spark-arena/eugr-recipes (mods/<name>/ folders, copied verbatim
from eugr/spark-vllm-docker); no work tree is needed. Each cell is one container run on a cached
release tree. Incremental: a cell is kept from the previous results while its mod's git tree id,
the release's wheel sha256 and the sandbox fingerprint are unchanged.

Writes community-any-cpu.json (`cells` of {"mod", "vllm", "status"}) and community-any-cpu.md under --out:
statuses and counts only, never a mod's text or output (another project's work is not committed
here). Where run.sh can also be read statically (patch steps only), that verdict is kept beside the
run's and the two are counted as agreeing or not.

    .venv/bin/python ci/bench/bench_community.py --mirror /work/.mirror/spark-arena+eugr-recipes/repo
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
from typing import Dict, List, Optional

from sparkmods.community.cli import run_cells
from sparkmods.community.judge import judge
from sparkmods.community.runsh import read_mod
from sparkmods.community.sandbox import RUN_STATUSES, agrees, check_image, fingerprint, sandbox_image
from sparkmods.matrix.build import sort_sources
from sparkmods.sources import open_targets

RESULTS = Path(__file__).resolve().parent / "results"
NAME = "community-any-cpu"  # <topic>-<vllm>-<gpu>: every release, the dev machine
CODES = {"applied": "A", "no-change": "N", "failed": "F", "wrote-outside-vllm": "O", "timed-out": "T"}


def git(mirror: Path, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", str(mirror), *args], check=True, capture_output=True).stdout


def newest_mods(mirror: Path, ref: str) -> Dict[str, str]:
    """name -> git tree id of every mods/<name>/ folder at ref."""
    out = {}
    for line in git(mirror, "ls-tree", ref, "mods/").decode().splitlines():
        meta, path = line.split("\t", 1)
        kind, tree = meta.split()[1:]
        if kind == "tree":
            out[Path(path).name] = tree
    return out


def extract(mirror: Path, tree: str, dest: Path) -> None:
    dest.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=git(mirror, "archive", tree), check=True)


def reusable(previous: Optional[dict], mods: Dict[str, str], shas: Dict[str, Optional[str]], sandbox: str) -> dict:
    """(mod, vllm) -> previous cell, for cells whose inputs are unchanged."""
    if not previous or previous.get("sandbox") != sandbox:
        return {}
    old_mods = {m["name"]: m["tree"] for m in previous.get("mods", [])}
    old_shas = {r["vllm"]: r["wheel_sha256"] for r in previous.get("releases", [])}
    return {(c["mod"], c["vllm"]): c for c in previous.get("cells", [])
            if old_mods.get(c["mod"]) == mods.get(c["mod"]) and c["vllm"] in shas
            and shas[c["vllm"]] is not None and old_shas.get(c["vllm"]) == shas[c["vllm"]]}


def static_verdicts(read: Dict[str, object], sources: List, cells: Dict[tuple, dict]) -> None:
    """The static reading of every cell, again on every build (it takes no container, and the
    reader changes without the runs changing): kept beside the run's status where run.sh can be
    read, with whether the two agree."""
    for name, mod in read.items():
        for source in sources:
            cell = cells[(name, source.version)]
            cell.pop("static", None)
            cell.pop("agrees", None)
            if mod.checkable:
                cell["static"] = judge(mod, source).status
                cell["agrees"] = agrees(cell["static"], cell["status"])


def build(args: argparse.Namespace) -> dict:
    started = time.monotonic()
    commit = git(args.mirror, "rev-parse", args.ref).decode().strip()
    mods = newest_mods(args.mirror, commit)
    image = sandbox_image(args.image)
    check_image(image)
    sandbox = fingerprint(image)
    sources = sort_sources([s for spec in (args.vllm or [">=0.18.0"]) for s in open_targets(spec)])
    shas = {s.version: s.sha256 for s in sources}
    out_json = args.out / f"{NAME}.json"
    previous = json.loads(out_json.read_text()) if out_json.is_file() and not args.full else None
    kept = reusable(previous, mods, shas, sandbox)
    cells: Dict[tuple, dict] = {}
    readable = {}
    with tempfile.TemporaryDirectory(prefix="community-") as tmp:
        read = {}
        for name, tree in sorted(mods.items()):
            extract(args.mirror, tree, Path(tmp) / tree / name)
            read[name] = read_mod(Path(tmp) / tree / name)
            readable[name] = read[name].checkable
        todo = [s for s in sources if any((n, s.version) not in kept for n in mods)]
        for source in todo:
            wanted = [read[n] for n in sorted(mods) if (n, source.version) not in kept]
            for src, mod, ran, _ in run_cells(wanted, [source], image, args.timeout):
                cells[(mod.name, src.version)] = {"mod": mod.name, "vllm": src.version, "status": ran.status,
                                                  "exit_code": ran.exit_code, "changed": len(ran.changed),
                                                  "seconds": ran.seconds}
                print(f"{src.version:8} {mod.name:40} {ran.status:20} {ran.seconds:6.2f} s", flush=True)
        reused = 0
        for key, cell in kept.items():
            if key not in cells and key[0] in mods and key[1] in shas:
                cells[key] = cell
                reused += 1
        static_verdicts(read, sources, cells)
    ordered = [cells[(n, s.version)] for n in sorted(mods) for s in sources]
    both = [c for c in ordered if "static" in c]
    wall = round(time.monotonic() - started, 1)
    last = (previous or {}).get("timing", {})
    full = wall if not reused else last.get("full_build_seconds") or (
        last.get("this_build_seconds") if last.get("cells_reused") == 0 else None)
    return {
        "mirror": {"repository": "spark-arena/eugr-recipes", "commit": commit},
        "image": image, "sandbox": sandbox,
        "releases": [{"vllm": s.version, "wheel_sha256": s.sha256} for s in sources],
        "mods": [{"name": n, "tree": mods[n], "statically_readable": readable[n]} for n in sorted(mods)],
        "cells": ordered,
        "counts": dict(sorted(collections.Counter(c["status"] for c in ordered).items())),
        "static_agreement": {"cells": len(both), "agree": sum(1 for c in both if c["agrees"])},
        "timing": {"this_build_seconds": wall, "full_build_seconds": full,
                   "cells_run": len(ordered) - reused, "cells_reused": reused,
                   "whole_matrix_cell_seconds": round(sum(c["seconds"] for c in ordered), 1),
                   "machine": args.machine},
    }


def markdown(doc: dict) -> str:
    versions = [r["vllm"] for r in doc["releases"]]
    t = doc["timing"]
    out = ["# Community mods run in the sandbox (`ci/bench/bench_community.py`)", "",
           f"Every mod folder of {doc['mirror']['repository']} at {doc['mirror']['commit'][:12]} "
           f"({len(doc['mods'])} mods) run as `launch-cluster.sh --apply-mod` runs it, in a throwaway container "
           f"(`{doc['image']}` with the release's vllm/ tree, no network, its writes read back with `docker diff`) "
           f"against "
           f"{len(versions)} releases ({versions[0]} .. {versions[-1]}): {len(doc['cells'])} cells. Statuses "
           "and counts only; no mod text is kept here.", "",
           "Status counts: " + ", ".join(f"{s} {n}" for s, n in doc["counts"].items()) + ".", "",
           f"Where run.sh can also be read statically (patch steps only), the reading agrees with the run in "
           f"{doc['static_agreement']['agree']} of {doc['static_agreement']['cells']} cells.", "",
           f"Time on {t['machine']}: the whole matrix took {t['full_build_seconds']} s to build from cached "
           f"release trees and their images (an image a release, built once; then one container a cell: "
           f"{t['whole_matrix_cell_seconds']} s of cells); this build ran {t['cells_run']} cells and reused "
           f"{t['cells_reused']} in {t['this_build_seconds']} s.", "",
           "Codes: " + ", ".join(f"{c} {s}" for s, c in CODES.items()) + "; `*` the static reading disagrees.", "",
           "| mod | " + " | ".join(v for v in versions) + " | counts |", "|---|" + "---|" * (len(versions) + 1)]
    by_mod = collections.defaultdict(dict)
    for c in doc["cells"]:
        by_mod[c["mod"]][c["vllm"]] = c
    for m in doc["mods"]:
        row = by_mod[m["name"]]
        counts = collections.Counter(c["status"] for c in row.values())
        out.append(f"| {m['name']} | " + " | ".join(
            CODES[row[v]["status"]] + ("*" if row[v].get("agrees") is False else "") for v in versions)
            + " | " + ", ".join(f"{s} {counts[s]}" for s in RUN_STATUSES if counts[s]) + " |")
    return "\n".join(out) + "\n"


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mirror", required=True, type=Path, help="the git directory of a spark-arena/eugr-recipes mirror")
    ap.add_argument("--ref", default="HEAD", help="the snapshot (default: the newest, HEAD)")
    ap.add_argument("--vllm", action="append", default=[], help="targets (default: every release >= 0.18.0)")
    ap.add_argument("--image", help="the sandbox image (default: sparkmods-sandbox:latest)")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--full", action="store_true", help="run every cell again")
    ap.add_argument("--machine", default="dev machine (2 CPU cores)", help="what the timing was measured on")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    doc = build(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{NAME}.json").write_text(json.dumps(doc, indent=1) + "\n")
    (args.out / f"{NAME}.md").write_text(markdown(doc))
    print(f"{len(doc['mods'])} mods x {len(doc['releases'])} releases: {doc['counts']}; ran "
          f"{doc['timing']['cells_run']}, reused {doc['timing']['cells_reused']}, {doc['timing']['this_build_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
