#!/usr/bin/env python3
"""Randomized kills of run.sh apply / revert on real vLLM files: is any tree ever left stuck?

For every mod, a site-packages folder holds the files the mod touches as the real vLLM wheel
has them (the newest release the mod was verified on, read from PyPI, cached), with their
dist-info. Each trial copies the pristine (apply) or applied (revert) tree, starts the mod's
real run.sh with bash, and sends SIGKILL, SIGTERM or SIGINT to it at a random moment,
uniform over the run's expected duration (the median of the last complete runs of that mod
and action, which tracks the machine's load). A signal that comes after the run finished
does not count: trials go on until --kills signals have landed on a running run.sh. Then
each landed trial is classified:

  clean     consistent (byte-identical to pristine or applied) with nothing left behind,
            right after the signal;
  repaired  not clean, and the next plain run.sh of the same action ended at its goal
            (applied, or byte-identical to pristine) with nothing left behind;
  stuck     the next run failed or did not reach its goal (must be 0);
  stray     files left behind (temps, journal, state debris) after the next run (must be 0).

    .venv/bin/python ci/bench/bench_kill.py [--kills 500] [--seed 1] [--out ci/bench/results]
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
from collections import Counter, deque
from pathlib import Path
from typing import Dict, List, Optional, Tuple

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


def said(out: str) -> str:
    """What the signalled run printed about it: the runtime's line, Python's traceback, or nothing ("")."""
    for phrase, key in (("rolled back", "rolled back"), ("change was completed", "completed"),
                        ("outside a change", "outside a change")):
        if "interrupted by" in out and phrase in out:
            return key
    return "traceback" if "Traceback" in out else ""


def trial(trees: Trees, action: str, kind: str, delay: float) -> Dict[str, object]:
    """One signalled run and the next plain one.

    "landed" is False when the run exited 0 all the same: it had finished before the signal,
    or bash deferred a SIGINT while its `python -V` ran (a non-interactive bash waits for the
    child, and carries on when the child did not die of it); such trials are not counted.
    """
    site, workspace = trees.fresh(START[action])
    proc = run_sh(trees, action, site, workspace)
    time.sleep(delay)
    sent = proc.poll() is None
    if sent:
        proc.send_signal(SIGNALS[kind])  # bash execs python: this is the runtime's process
    out, _ = proc.communicate()
    state = trees.state_of(site)
    left = trees.leftovers(site, workspace)
    row: Dict[str, object] = {"mod": trees.mod.name, "action": action, "signal": kind, "delay_s": round(delay, 4),
                              "sent": sent, "landed": sent and proc.returncode != 0, "exit": proc.returncode,
                              "said": said(out), "after_signal": _where(state, action), "left": len(left)}
    if state is not None and not left:
        row["outcome"] = "clean"
    t0 = time.perf_counter()
    nxt = run_sh(trees, action, site, workspace)
    next_out, _ = nxt.communicate()
    row["next_run_s"] = time.perf_counter() - t0
    reached = nxt.returncode == 0 and trees.at(site, GOAL[action])
    stray = trees.leftovers(site, workspace)
    row.setdefault("outcome", "repaired" if reached else "stuck")
    if not reached:
        row["outcome"] = "stuck"
        row["next_output"] = next_out[-500:]
    row["settled_journal"] = "found an interrupted" in next_out
    row["stray"] = stray
    return row


def _where(state: Optional[str], action: str) -> str:
    """The tree right after the signal: "start" (untouched or rolled back), "goal", or "half"."""
    if state is None:
        return "half"
    return "start" if state == START[action] else "goal"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=500, help="signals that must land on a running run.sh")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=REPO / "ci" / "bench" / "results")
    args = parser.parse_args()
    # Started in the background (`cmd &`), this process inherits SIGINT ignored, and so would
    # every run.sh: bash and Python's start-up would then never see a SIGINT. A handler of our
    # own is reset to the default in the children when they exec.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    rng = random.Random(args.seed)
    base = Path(tempfile.mkdtemp(prefix="sparkmods-bench-kill-"))
    mods: List[Tuple[Trees, str]] = []
    for mod in realtree.repo_mods():
        version = realtree.newest_verified(load_manifest(mod))
        trees = Trees(base / mod.name, mod, lambda root, ms, v=version: realtree.release_site(root, ms, v))
        mods.append((trees, version))
    recent = {(t.mod.name, a): deque([duration(t, a)], maxlen=5) for t, _ in mods for a in ("apply", "revert")}
    rows: List[Dict[str, object]] = []
    t0 = time.time()
    while sum(1 for r in rows if r["landed"]) < args.kills:
        trees, _ = rng.choice(mods)
        action = rng.choice(["apply", "revert"])
        kind = rng.choice(sorted(SIGNALS))
        times = recent[(trees.mod.name, action)]
        row = trial(trees, action, kind, rng.uniform(0, sorted(times)[len(times) // 2]))
        if row["after_signal"] == "start":  # then the next run was a complete one
            times.append(float(row["next_run_s"]))
        rows.append(row)
        if len(rows) % 50 == 0:
            landed = sum(1 for r in rows if r["landed"])
            print(f"{len(rows)} trials, {landed} landed, {time.time() - t0:.0f} s", file=sys.stderr)
    report = summarize(rows, mods)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kill-any-cpu.json").write_text(json.dumps({**report, "trials": rows}, indent=1) + "\n")
    (args.out / "kill-any-cpu.md").write_text(markdown(report))
    print(markdown(report))
    return 0 if report["totals"]["stuck"] == 0 and report["totals"]["stray"] == 0 else 1


# What each signal:exit pair means (the runtime's own line is counted separately, in "said").
MEANING = {
    "KILL:-9": "SIGKILL: the process died wherever it was",
    "TERM:-15": "SIGTERM before the runtime set its handler (while bash, the interpreter or the runtime's "
                "imports started): nothing read or written, nothing printed",
    "INT:-2": "SIGINT before any of the runtime's code ran (bash, or the interpreter starting; once Python "
              "has set its own handler it prints a KeyboardInterrupt traceback): nothing read or written; "
              "or while the interpreter shut down after the run had finished",
    "INT:1": "SIGINT while the interpreter imported site or runpy: Python reports its KeyboardInterrupt "
             "and exits 1; nothing read or written",
    "TERM:143": "the runtime handled SIGTERM",
    "INT:130": "the runtime handled SIGINT (while its modules were imported: one line, nothing written)",
}


def summarize(rows: List[Dict[str, object]], mods) -> Dict[str, object]:
    """Counts over the landed trials, overall and per mod / action / signal, and what the others were."""
    landed = [r for r in rows if r["landed"]]

    def counts(sel: List[Dict[str, object]]) -> Dict[str, int]:
        c = Counter(str(r["outcome"]) for r in sel)
        where = Counter(str(r["after_signal"]) for r in sel)
        return {"trials": len(sel), "clean": c["clean"], "repaired": c["repaired"], "stuck": c["stuck"],
                "stray": sum(1 for r in sel if r["stray"]), "at_start_after_signal": where["start"],
                "at_goal_after_signal": where["goal"], "half_after_signal": where["half"],
                "left_files_after_signal": sum(1 for r in sel if r["left"]),
                "journal_settled": sum(1 for r in sel if r["settled_journal"])}

    by = {}
    for key in sorted({(str(r["mod"]), str(r["action"]), str(r["signal"])) for r in landed}):
        by["/".join(key)] = counts([r for r in landed if (r["mod"], r["action"], r["signal"]) == key])
    exits: Dict[str, Dict[str, object]] = {}
    for r in sorted(landed, key=lambda r: (str(r["signal"]), int(r["exit"]))):
        code = f"{r['signal']}:{r['exit']}"
        entry = exits.setdefault(code, {"runs": 0, "meaning": MEANING.get(code, "unexplained"), "said": Counter()})
        entry["runs"] += 1
        if r["said"]:
            entry["said"][r["said"]] += 1
    return {
        "totals": counts(landed),
        "by_mod_action_signal": by,
        "exit_codes": {k: {**v, "said": dict(v["said"])} for k, v in exits.items()},
        "vllm": {t.mod.name: v for t, v in mods},
        "signalled": len(rows),
        "finished_first": sum(1 for r in rows if not r["sent"]),
        "finished_anyway": sum(1 for r in rows if r["sent"] and not r["landed"]),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def markdown(report: Dict[str, object]) -> str:
    """kill-any-cpu.md: the totals, one row per mod / action / signal, and the exit codes explained."""
    t = report["totals"]
    lines = [
        "# Randomized kills of run.sh (ci/bench/bench_kill.py)",
        "",
        f"{report['date']}, {report['machine']}; real vLLM files per mod: "
        + ", ".join(f"{m} {v}" for m, v in report["vllm"].items()) + ".",
        "",
        f"**{t['trials']} signals landed on a running run.sh: {t['clean']} clean, {t['repaired']} repaired by the "
        f"next run, {t['stuck']} stuck, {t['stray']} with stray files after the next run.**",
        "",
        f"Right after the signal the tree was untouched or rolled back in {t['at_start_after_signal']}, at its goal "
        f"in {t['at_goal_after_signal']} and half-changed in {t['half_after_signal']}; {t['left_files_after_signal']} "
        f"had a journal or temp files left; the next run said it settled an interrupted change "
        f"{t['journal_settled']} times. Not counted: {report['finished_first']} runs that had finished before "
        f"their signal and {report['finished_anyway']} that exited 0 all the same (a SIGINT that bash deferred "
        f"while `python -V` ran, or a run that ended between the check and the signal), "
        f"{report['signalled']} signalled runs in all.",
        "",
        "| mod / action / signal | trials | clean | repaired | stuck | stray |",
        "|---|---|---|---|---|---|",
    ]
    for key, c in report["by_mod_action_signal"].items():
        lines.append(f"| {key} | {c['trials']} | {c['clean']} | {c['repaired']} | {c['stuck']} | {c['stray']} |")
    lines += ["", "| signal:exit | runs | meaning | the runtime said |", "|---|---|---|---|"]
    for code, e in report["exit_codes"].items():
        said = ", ".join(f"{k} x{v}" for k, v in sorted(e["said"].items())) or "-"
        lines.append(f"| {code} | {e['runs']} | {e['meaning']} | {said} |")
    return "\n".join(lines + [""])


if __name__ == "__main__":
    raise SystemExit(main())
