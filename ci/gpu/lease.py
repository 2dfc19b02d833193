#!/usr/bin/env python3
"""Several end-to-end runs at once on one lent GPU, kept going between calls.

Why: a lease is short and every server start takes about a minute, while each call to the
machine is at most 10 minutes and carrying a release takes many calls. So runs are started in
their own process sessions (they outlive the call that started them, as long as the machine is
held), each with `e2e.py --share-gpu`, and later calls carry the next release, wait, and pack:

    python3 ci/gpu/lease.py start --release 0.33.0 --site /tmp/site-0.33.0 \\
        --group hybrid-int4-fp8 --group mtp-weights --group int8-lm-head,chat-template,turboquant
    python3 ci/gpu/lease.py wait --seconds 300     # until every run ended, or the time is up
    python3 ci/gpu/lease.py pack --to "$OUT"       # one archive per release, results only

Two-node runs (ci/gpu/tp2_lease.sh) add e2e.py arguments to every run of a release, and Ray's
run its groups one after another (one Ray cluster at a time):

    python3 ci/gpu/lease.py start --release tp2-ray-0.26.0 --site SITE --serial \\
        --e2e-args='--tp 2 --nodes 2 --executor ray' --group mtp-weights,int8-lm-head --group ...

Runs live under ROOT/<release>/<group>/ (an e2e.py --out folder each); ROOT/jobs.json lists them.
`wait` exits 0 once every run ended (whatever their results), 3 while some still run.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Sequence

HERE = Path(__file__).resolve().parent
ROOT = Path(os.environ.get("SPARKMODS_LEASE_ROOT", "/tmp/sparkmods-lease"))
# Left out of the archives: the models, the vLLM overlays and the workspaces (hundreds of MB);
# results, summaries, logs, verify output and the recorded fixtures are kept.
SKIP_DIRS = ("models", "overlays", "workspace")


def _jobs(root: Path) -> list[dict]:
    path = root / "jobs.json"
    return json.loads(path.read_text()) if path.is_file() else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _exit_code(job: dict) -> int | None:
    """The run's exit code once it ended (written by the wrapper shell), else None."""
    code = Path(job["out"]) / "exit-code"
    if code.is_file():
        return int(code.read_text().strip() or 1)
    return None if _alive(job["pid"]) else -1


def start(release: str, site: Path, groups: list[str], root: Path = ROOT, python: str = sys.executable,
          e2e_args: Sequence[str] = (), serial: bool = False) -> list[dict]:
    """One e2e.py run per group, each in a new session, logging to its own folder; e2e_args are
    added to every run's command line (`--tp 2 --nodes 2 --executor ray`). `serial`: the groups
    run one after another in one session (runs that cannot share the machine), each group's
    results written when it ends."""
    jobs = _jobs(root)
    steps = []
    for group in groups:
        name = group.replace(",", "+")
        out = root / release / name
        out.mkdir(parents=True, exist_ok=True)
        (out / "exit-code").unlink(missing_ok=True)
        cmd = [python, str(HERE / "e2e.py"), "--vllm-site", str(site), "--out", str(out), "--only", group, "--share-gpu",
               *e2e_args]
        steps.append((group, out, f'{" ".join(map(shlex.quote, cmd))} > {shlex.quote(str(out / "e2e.log"))} 2>&1; '
                                  f'echo $? > {shlex.quote(str(out / "exit-code"))}'))
    for batch in ([steps] if serial else [[step] for step in steps]):
        proc = subprocess.Popen(["bash", "-c", "; ".join(wrapper for _, _, wrapper in batch)], start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        for group, out, _ in batch:
            jobs.append({"release": release, "group": group, "out": str(out), "pid": proc.pid, "started": time.time()})
            print(f"started {release} {group} (pid {proc.pid}{', after the one before' if serial else ''})", flush=True)
    root.mkdir(parents=True, exist_ok=True)
    (root / "jobs.json").write_text(json.dumps(jobs, indent=1))
    return jobs


def status(root: Path = ROOT) -> list[tuple[dict, int | None]]:
    return [(job, _exit_code(job)) for job in _jobs(root)]


def wait(seconds: float, root: Path = ROOT) -> int:
    """Until every run ended or `seconds` passed; one line per run; 0 when all ended, else 3."""
    end = time.monotonic() + seconds
    while time.monotonic() < end and any(code is None for _, code in status(root)):
        time.sleep(5)
    running = 0
    for job, code in status(root):
        last = (Path(job["out"]) / "e2e.log")
        tail = last.read_text(errors="replace").strip().splitlines()[-1:] if last.is_file() else []
        state = "running" if code is None else f"exit {code}"
        running += code is None
        print(f"{job['release']} {job['group']}: {state} after {time.time() - job['started']:.0f} s; "
              f"{tail[0][:160] if tail else 'no output yet'}", flush=True)
    return 3 if running else 0


def _keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    parts = Path(info.name).parts
    return None if any(p in SKIP_DIRS for p in parts[2:3]) else info


def pack(dest: Path, root: Path = ROOT) -> list[Path]:
    """One gzip archive per release holding every group's results (models and overlays left out)."""
    dest.mkdir(parents=True, exist_ok=True)
    made = []
    for release in sorted({job["release"] for job in _jobs(root)}):
        archive = dest / f"e2e-{release}.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(root / release, arcname=release, filter=_keep)
        made.append(archive)
        print(f"packed {archive} ({archive.stat().st_size / 2**10:.0f} KiB)")
    return made


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start", help="start the runs of one release in the background")
    s.add_argument("--release", required=True)
    s.add_argument("--site", type=Path, required=True)
    s.add_argument("--group", action="append", required=True, help="scenarios of one run, comma-separated (repeatable)")
    s.add_argument("--e2e-args", default="", help="more e2e.py arguments for every run, one string: "
                                                   "--e2e-args='--tp 2 --nodes 2 --executor mp'")
    s.add_argument("--serial", action="store_true", help="the groups one after another (two-node Ray runs: one "
                                                          "Ray cluster at a time)")
    w = sub.add_parser("wait", help="wait for the runs, at most SECONDS")
    w.add_argument("--seconds", type=float, default=0)
    p = sub.add_parser("pack", help="archive the results, one file per release")
    p.add_argument("--to", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.cmd == "start":
        start(args.release, args.site.resolve(), args.group, e2e_args=shlex.split(args.e2e_args), serial=args.serial)
        return 0
    if args.cmd == "wait":
        return wait(args.seconds)
    pack(args.to)
    return 0


if __name__ == "__main__":
    sys.exit(main())
