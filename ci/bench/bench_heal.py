#!/usr/bin/env python3
"""Replay the mods' history through the nightly heal: for every variant boundary crossed from
0.18.0 to 0.33.0, would the nightly job have proposed the fix, and would it have been right?

For each mod and each pair of consecutive variants A -> B, the mod is put back in the state it
had before B existed: mod.toml holds the variants up to A exactly as committed (A's range ends
where B begins). The break release is the first release after A's newest verified one on which
that mod does not check green (what the nightly job would have seen first; it is B's first
release unless A broke inside its own range). `sparkmods.heal.heal_break` then runs on it, as
the job runs it, and each boundary is classified:

  healed   a variant was proposed, and it applies and passes the mod's runtime tests (or,
           where those were not run, its patched files equal the hand-made variant's byte for
           byte both on the break release and on the hand-made variant's newest verified
           release, the one the vllm_runtime tier runs the hand-made variant on)
  flagged  nothing proposed (the rebase flagged an edit, or the new variant did not check green)
  wrong    proposed, but its runtime tests failed, or its patched files differ from the hand-made
           variant's where the runtime tests were not run to settle it

--runtime VERSION (repeatable) runs the real runtime tests (ci/nightly_check.RUNTIME_TESTS, vLLM
installed by tests/vllmenv.py) for the boundaries whose break release is VERSION.

    .venv/bin/python ci/bench/bench_heal.py [--mods mods] [--out ci/bench/results/heal-replay-any-cpu]
        [--runtime 0.20.0 --runtime 0.24.0]

Exit 1 when fewer than 60 % of the boundaries heal or any is wrong.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import tomllib

from sparkmods.checking.batch import check_mods
from sparkmods.heal import PROPOSED, UNTESTED, heal_break, pytest_runner
from sparkmods.nightly import break_lines
from sparkmods.rebase.report import drift_lines, result_lines
from sparkmods.rebase.tomledit import render_variant
from sparkmods.runtime.engine import plan
from sparkmods.runtime.manifest import Variant, load_manifest
from sparkmods.runtime.modcheck import GREEN, check_mod, variant_patches
from sparkmods.runtime.pep440 import Version
from sparkmods.sources import open_targets
from sparkmods.sync import sync

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "ci"))

from nightly_check import RUNTIME_TESTS  # noqa: E402

FIRST, LAST = Version("0.18.0"), Version("0.33.0")
HEALED, FLAGGED, WRONG = "healed", "flagged", "wrong"
GOAL = 0.60


def history_mod(mod: Path, upto: str, dest: Path) -> Path:
    """A copy of the mod whose mod.toml holds the variants up to `upto` as committed."""
    raw = tomllib.loads((mod / "mod.toml").read_text(encoding="utf-8"))
    copy = dest / mod.name
    shutil.copytree(mod, copy, ignore=shutil.ignore_patterns("__pycache__"))
    lines = [f"schema = {raw['schema']}\n", f"name = {json.dumps(raw['name'])}\n",
             f"summary = {json.dumps(raw['summary'])}\n"]
    for table in raw["variant"]:
        lines += ["\n"] + render_variant(table, "as committed")
        if table["label"] == upto:
            break
    if "upstream" in raw:
        up = raw["upstream"]
        detect = ", ".join("{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in d.items()) + " }"
                           for d in up.get("detect", []))
        lines += ["\n[upstream]\n", f"since = {json.dumps(up['since'])}\n", f"evidence = {json.dumps(up['evidence'])}\n",
                  f"detect = [{detect}]\n"]
    (copy / "mod.toml").write_text("".join(lines), encoding="utf-8")
    sync(copy)
    return copy


def own_patches(mod_dir: Path, variant: Variant, source) -> str:
    """What the old variant's own patches do on the release, its range aside (run.sh's engine)."""
    results = plan(variant_patches(mod_dir, variant), source.read)
    bad = {r.status for r in results if r.status not in ("ok", "ok-offset")}
    bad |= {h.outcome for r in results for h in r.hunks if h.outcome not in ("exact", "offset")}
    if bad:
        return "do not apply (" + ", ".join(sorted(bad)) + ")"
    return "apply with offsets" if any(r.status == "ok-offset" for r in results) else "apply exactly"


def changes(mod_dir: Path, source) -> Optional[Dict[str, Optional[bytes]]]:
    """path -> patched bytes of the variant mod_dir picks for source; None when not green."""
    result = check_mod(load_manifest(mod_dir), mod_dir, source.version, source.read)
    return result.changes() if result.status in GREEN else None


def replay_boundary(mod: Path, a: Variant, b: Variant, releases: Dict[str, object], work: Path,
                    runtime: Sequence[str]) -> dict:
    """One boundary: find the break, heal it, compare with the hand-made variant, classify."""
    hist = history_mod(mod, a.label, work)
    newest = max(Version(v) for v in a.verified)
    row: dict = {"mod": mod.name, "from_variant": a.label, "to_variant": b.label}
    for version in sorted(releases, key=Version):
        if Version(version) <= newest:
            continue
        (checked,) = check_mods([hist], [releases[version]])
        if checked.result.status not in GREEN:
            break
    else:
        return dict(row, release=None, outcome="no break", note=f"{a.label} stays green up to {LAST}")
    source = releases[version]
    row.update(release=version, break_status=checked.result.status, own_patches_there=own_patches(hist, a, source))
    runner = pytest_runner(RUNTIME_TESTS, REPO) if version in runtime else None
    start = time.monotonic()
    heal = heal_break(hist, source, lambda v: releases[v], status=checked.result.status,
                      break_lines=break_lines(checked.result), run_tests=runner)
    row["seconds"] = round(time.monotonic() - start, 1)
    row["heal"] = heal.outcome
    if heal.plan is not None:
        row.update(base=heal.plan.base, proposed_variant=heal.plan.label, proposed_range=heal.plan.range,
                   moved=[f"{o['onto_path']}:{o['base_line']}->{o.get('onto_line')} {o['outcome']}"
                          + (f" ({o['rule']})" if o.get("rule") else "")
                          for p in heal.plan.patches for f in p.result.to_dict()["files"] for o in f["edits"]])
    if heal.outcome not in (PROPOSED, UNTESTED) or heal.plan is None:
        flagged = [line.strip() for p in (heal.plan.patches if heal.plan else []) if not p.clean
                   for line in result_lines(p.result) + drift_lines(p.drift) if "hunk" in line or "drift" in line]
        return dict(row, outcome=FLAGGED, why=heal.problem, flagged=flagged)
    hand = load_manifest(mod).select(version)
    tested = hand.verified[-1] if isinstance(hand, Variant) and hand.verified else None
    row["hand_variant"] = hand.label if isinstance(hand, Variant) else None
    row["same_files_at_break"] = changes(hist, source) == changes(mod, source)
    row["tested_release"] = tested
    if tested is not None and tested in releases:
        mine = changes(hist, releases[tested])
        row["same_files_on_tested"] = mine is not None and mine == changes(mod, releases[tested])
    if heal.tests is not None:
        row["runtime_tests"] = {"summary": heal.tests.summary(), "ok": heal.tests.ok,
                                "failed": [c["name"] for c in heal.tests.cases if c["outcome"] != "passed"]}
        return dict(row, outcome=HEALED if heal.tests.ok else WRONG,
                    criterion=f"runtime tests on {version}")
    identical = row["same_files_at_break"] and row.get("same_files_on_tested", False)
    return dict(row, outcome=HEALED if identical else WRONG,
                criterion=f"patched files equal the hand-made variant's on {version} and {tested}")


def boundaries(mods: Path) -> List[tuple]:
    out = []
    for mod in sorted(p.parent for p in mods.glob("*/mod.toml")):
        variants = [v for v in load_manifest(mod).variants if v.patches]
        for a, b in itertools.pairwise(variants):
            if b.vllm.lower is not None and FIRST < b.vllm.lower <= LAST:
                out.append((mod, a, b))
    return out


def markdown(rows: List[dict], runtime: Sequence[str], seconds: float) -> str:
    count = {k: sum(1 for r in rows if r["outcome"] == k) for k in (HEALED, FLAGGED, WRONG)}
    total = len(rows)
    broke = [r for r in rows if r.get("own_patches_there", "").startswith("do not apply")]
    real = len(broke)
    out = ["# Heal replay: the nightly heal on every variant boundary the mods crossed, 0.18.0 to 0.33.0", "",
           f"`ci/bench/bench_heal.py` on the dev machine ({os.cpu_count()} cores, Python {platform.python_version()}), "
           f"{seconds:.0f} s with the runtime tests (their vLLM environments already installed). Each boundary starts from the mod as it was before the hand-made variant "
           "(the variants up to the previous one, as committed) and the first release it did not check "
           "green on; `sparkmods.heal.heal_break` runs as the nightly job runs it.", "",
           f"**{count[HEALED]} of {total} healed ({count[HEALED] / total:.0%}), {count[FLAGGED]} flagged, "
           f"{count[WRONG]} wrong.**", "",
           f"At {real} of the boundaries the old variant's own patches no longer applied (a conflict or a "
           f"moved file): {sum(1 for r in rows if r in broke and r['outcome'] == HEALED)} of those healed; at the "
           f"other {total - real} they still applied with offsets and the break was the range's end, which the "
           "nightly job sees as `no-variant` and heals the same way.", "",
           "Criterion for *healed*: the proposed variant passed the mod's vllm_runtime tests on the break "
           f"release (run for the boundaries breaking on {', '.join(runtime) or 'no release'}: a real vLLM "
           "installed per release, minutes each on this 2-core machine); for the other boundaries, its "
           "patched vLLM files equal the hand-made variant's byte for byte on the break release and on the "
           "hand-made variant's newest verified release (the release the vllm_runtime tier runs the hand-made "
           "variant on), so those tests see the same code. A proposal that differs where no test settled it "
           "counts as wrong.", "",
           "*Check there* is what the nightly job saw: the old variant's range ends where the hand-made one "
           "begins, so every break is `no-variant`; *its patches there* says whether the old variant's own "
           "patches would still have applied (run.sh's engine, range aside).", "",
           "| mod | from variant | break release | check there | its patches there | outcome | proposed | "
           "same files as hand-made (break / tested release) | how decided |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        same = ""
        if "same_files_at_break" in r:
            same = (f"{'yes' if r['same_files_at_break'] else 'no'} / "
                    f"{'yes' if r.get('same_files_on_tested') else 'no'} ({r.get('tested_release')})")
        how = r.get("criterion") or r.get("why") or r.get("note", "")
        if r.get("flagged"):
            how += ": " + "; ".join(r["flagged"][:2])
        if "runtime_tests" in r:
            how += f": {r['runtime_tests']['summary']}"
        out.append(f"| {r['mod']} | {r['from_variant']} | {r.get('release') or '-'} | {r.get('break_status', '-')} | "
                   f"{r.get('own_patches_there', '-')} | {r['outcome']} | {r.get('proposed_variant', '-')} | {same} | {how} |")
    return "\n".join(out) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mods", default=str(REPO / "mods"))
    parser.add_argument("--out", default=str(REPO / "ci" / "bench" / "results" / "heal-replay-any-cpu"))
    parser.add_argument("--runtime", action="append", default=[], metavar="VERSION",
                        help="run the runtime tests for boundaries that break on this release (repeatable)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    releases = {s.version: s for s in open_targets(f">={FIRST}") if Version(s.version) <= LAST}
    rows = []
    with tempfile.TemporaryDirectory(prefix="heal-replay-") as tmp:
        for i, (mod, a, b) in enumerate(boundaries(Path(args.mods))):
            work = Path(tmp) / str(i)
            work.mkdir()
            row = replay_boundary(mod, a, b, releases, work, args.runtime)
            print(json.dumps({k: row.get(k) for k in ("mod", "from_variant", "release", "outcome")}), flush=True)
            rows.append(row)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "heal.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    (out / "README.md").write_text(markdown(rows, args.runtime, time.monotonic() - start), encoding="utf-8")
    healed = sum(1 for r in rows if r["outcome"] == HEALED)
    wrong = sum(1 for r in rows if r["outcome"] == WRONG)
    print(f"{healed} of {len(rows)} healed, {wrong} wrong: {out}")
    return 0 if rows and healed / len(rows) >= GOAL and not wrong else 1


if __name__ == "__main__":
    sys.exit(main())
