#!/usr/bin/env python3
"""Randomized kills of run.sh apply / revert on real vLLM files: is any tree ever left stuck?

For every mod, a site-packages folder holds the files the mod touches as the real vLLM wheel
has them (the newest release the mod was verified on, read from PyPI, cached), with their
dist-info. Each trial copies the pristine (apply) or applied (revert) tree, starts the mod's
real run.sh with bash, and sends SIGKILL, SIGTERM or SIGINT to it at a random moment:
uniformly between 40% and 110% of that run's measured duration (the first ~40% is bash
and interpreter start-up, where no file can change; past 100% the run has finished).
Then it classifies the tree:

  clean     consistent (byte-identical to pristine or applied) with nothing left behind,
            right after the signal;
  repaired  not clean, and the next plain run.sh of the same action ended at its goal
            (applied, or byte-identical to pristine) with nothing left behind;
  stuck     the next run failed or did not reach its goal (must be 0);
  stray     files left behind (temps, journal, state debris) after the next run (must be 0).

    .venv/bin/python ci/bench/bench_kill.py [--trials 500] [--seed 1] [--out ci/bench/results]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Dict, List, Tuple

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

import realtree  # noqa: E402
from realtree import GOAL, START, Trees  # noqa: E402
from sparkmods.runtime.manifest import load_manifest  # noqa: E402

SIGNALS = {"KILL": signal.SIGKILL, "TERM": signal.SIGTERM, "INT": signal.SIGINT}


def run_sh(trees: Trees, action: str, site: Path, workspace: Path) -> subprocess.Popen:
    env = {"PATH": os.environ["PATH"], "PYTHON_ROOT": str(site), "SPARKMODS_PYTHON": sys.executable,
           "WORKSPACE_DIR": str(workspace)}
    args = ["revert"] if action == "revert" else []
    return subprocess.Popen(["bash", str(trees.mod / "run.sh"), *args], env=env, cwd=workspace,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def duration(trees: Trees, action: str, repeat: int = 3) -> float:
    """Median wall time of a complete run of this action."""
    times = []
    for _ in range(repeat):
        site, workspace = trees.fresh(START[action])
        t0 = time.perf_counter()
        proc = run_sh(trees, action, site, workspace)
        out, _ = proc.communicate()
        assert proc.returncode == 0, out
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def trial(trees: Trees, action: str, kind: str, delay: float) -> Dict[str, object]:
    site, workspace = trees.fresh(START[action])
    proc = run_sh(trees, action, site, workspace)
    time.sleep(delay)
    if proc.poll() is None:
        proc.send_signal(SIGNALS[kind])  # bash execs python: this is the runtime's process
    out, _ = proc.communicate()
    state = trees.state_of(site)
    left = trees.leftovers(site, workspace)
    row: Dict[str, object] = {"mod": trees.mod.name, "action": action, "signal": kind, "delay_s": round(delay, 4),
                              "exit": proc.returncode, "after_signal": state or "half", "left": len(left)}
    if state is not None and not left:
        row["outcome"] = "clean"
    nxt = run_sh(trees, action, site, workspace)
    next_out, _ = nxt.communicate()
    reached = nxt.returncode == 0 and trees.at(site, GOAL[action])
    stray = trees.leftovers(site, workspace)
    row.setdefault("outcome", "repaired" if reached else "stuck")
    if not reached:
        row["outcome"] = "stuck"
        row["next_output"] = next_out[-500:]
    row["settled_journal"] = "found an interrupted" in next_out
    row["stray"] = stray
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=500)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=REPO / "ci" / "bench" / "results")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    base = Path(tempfile.mkdtemp(prefix="sparkmods-bench-kill-"))
    mods: List[Tuple[Trees, str]] = []
    for mod in realtree.repo_mods():
        version = realtree.newest_verified(load_manifest(mod))
        trees = Trees(base / mod.name, mod, lambda root, ms, v=version: realtree.release_site(root, ms, v))
        mods.append((trees, version))
    durations = {(t.mod.name, a): duration(t, a) for t, _ in mods for a in ("apply", "revert")}
    rows = []
    t0 = time.time()
    for i in range(args.trials):
        trees, _ = rng.choice(mods)
        action = rng.choice(["apply", "revert"])
        kind = rng.choice(sorted(SIGNALS))
        d = durations[(trees.mod.name, action)]
        rows.append(trial(trees, action, kind, rng.uniform(0.4 * d, 1.1 * d)))
        if (i + 1) % 50 == 0:
            print(f"{i + 1}/{args.trials} trials, {time.time() - t0:.0f} s", file=sys.stderr)
    report = summarize(rows, mods, durations)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kill.json").write_text(json.dumps({**report, "trials": rows}, indent=1) + "\n")
    (args.out / "kill.md").write_text(markdown(report))
    print(markdown(report))
    return 0 if report["totals"]["stuck"] == 0 and report["totals"]["stray"] == 0 else 1


def summarize(rows: List[Dict[str, object]], mods, durations) -> Dict[str, object]:
    def counts(sel: List[Dict[str, object]]) -> Dict[str, int]:
        c = Counter(str(r["outcome"]) for r in sel)
        return {"trials": len(sel), "clean": c["clean"], "repaired": c["repaired"], "stuck": c["stuck"],
                "stray": sum(1 for r in sel if r["stray"]), "half_after_signal": sum(1 for r in sel if r["after_signal"] == "half"),
                "journal_settled": sum(1 for r in sel if r["settled_journal"])}

    by = {}
    for key in sorted({(str(r["mod"]), str(r["action"]), str(r["signal"])) for r in rows}):
        by["/".join(key)] = counts([r for r in rows if (r["mod"], r["action"], r["signal"]) == key])
    exits = Counter(f"{r['signal']}:{r['exit']}" for r in rows)
    return {
        "totals": counts(rows),
        "by_mod_action_signal": by,
        "exit_codes": dict(sorted(exits.items())),
        "vllm": {t.mod.name: v for t, v in mods},
        "run_duration_s": {f"{m}/{a}": round(d, 3) for (m, a), d in durations.items()},
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def markdown(report: Dict[str, object]) -> str:
    t = report["totals"]  # type: ignore[index]
    lines = [
        "# Randomized kills of run.sh (ci/bench/bench_kill.py)",
        "",
        f"{report['date']}, {report['machine']}; real vLLM files per mod: "
        + ", ".join(f"{m} {v}" for m, v in report["vllm"].items()) + ".",  # type: ignore[union-attr]
        "",
        f"**{t['trials']} trials: {t['clean']} clean, {t['repaired']} repaired by the next run, "
        f"{t['stuck']} stuck, {t['stray']} with stray files.** {t['half_after_signal']} signals left the tree "
        f"half-changed until the next run settled the journal ({t['journal_settled']} journals settled).",
        "",
        "| mod / action / signal | trials | clean | repaired | stuck | stray |",
        "|---|---|---|---|---|---|",
    ]
    for key, c in report["by_mod_action_signal"].items():  # type: ignore[union-attr]
        lines.append(f"| {key} | {c['trials']} | {c['clean']} | {c['repaired']} | {c['stuck']} | {c['stray']} |")
    lines += ["", "Exit codes of the signalled runs (signal:code; -9 = killed, 0 = finished first): "
              + ", ".join(f"{k} x{v}" for k, v in report["exit_codes"].items()) + ".", ""]  # type: ignore[union-attr]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
