#!/usr/bin/env python3
"""Benchmark: how long `sparkmods check`, its start-up and run.sh take, beside yardsticks
measured in the same run (issue 19's table, one row each).

  warm      `sparkmods check --offline`, every mod on every release >= 0.18.0, cache warm
            (stored results reused); also with --no-cache (every row checked from the member
            cache). Yardstick: `python -c pass` with the same interpreter.
  cold      the same with an empty cache over the network (PyPI): seconds and HTTP requests.
  help      `sparkmods --help`. Yardstick: `python -c pass`.
  index     a PEP 691 page listing 10,000 builds (a per-commit nightly index), one range
            selected (open_targets, offline from the cached page). Yardstick: json.loads of it.
  nightly   50 builds on a loopback index (the real vLLM 0.19.1 wheel under 50 names and
            hashes, served with Range), checked cold: seconds, peak RSS, requests.
  run.sh    int8-lm-head on the files of the real vLLM 0.33.0 wheel: apply to a fresh tree,
            and again on the applied tree. Yardsticks: `git apply --check` and
            `patch --dry-run` of the same patches on the same files.

Every number is the median of --reps runs (default 5); subject and yardstick runs alternate.
CLI runs use bytecode as an installed copy does (PYTHONDONTWRITEBYTECODE unset, one
unmeasured warm-up run first). `--before REV` measures the same rows with the tools and mods
of git revision REV too (exported to a temporary folder), one run each for the slow rows.

    .venv/bin/python ci/bench/bench_check.py [--reps 5] [--before REV] [--out ci/bench/results]

Writes check-any-cpu.json (every measurement) and .md; with --only, check-<rows>-any-cpu.json and .md (so a
partial run leaves the full table alone). Exit 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, ClassVar, Dict, List, Optional, Tuple
from urllib.parse import quote, unquote

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

import realtree  # noqa: E402
from releasewheel import vllm_wheel  # noqa: E402

# run.sh's interpreter: this venv's CPython (run.sh needs only the stdlib). Not a pyenv shim (a
# shell script) and not the base interpreter, whose site-packages .pth files cost it 40 ms.
PYTHON = sys.executable
_SCRIPT = Path(sys.executable).parent / "sparkmods"  # the console script a user runs
SPARKMODS = [str(_SCRIPT)] if _SCRIPT.is_file() else [sys.executable, "-m", "sparkmods"]
# Another revision's code (on PYTHONPATH) through its own program entry: the console script of
# this checkout names cli.entry, which older revisions do not have (they exit through cli.main).
# The same statements as pip's generated console script, so both sides start alike.
_OTHER_CLI = ("import re, sys, sparkmods.cli as c; sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', 'sparkmods'); "
              "sys.exit(getattr(c, 'entry', c.main)())")


def cli(code: Optional[Path] = None) -> List[str]:
    """The command a user runs: this checkout's console script, or the program of `code`."""
    return SPARKMODS if code is None else [sys.executable, "-c", _OTHER_CLI]
NIGHTLY_RELEASE = "0.19.1"  # the real wheel served under 50 nightly names
RUNSH_MOD, RUNSH_VLLM = "int8-lm-head", "0.33.0"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"


@dataclass
class Run:
    seconds: float
    cpu: float = 0.0
    rss_mib: float = 0.0
    requests: Optional[int] = None
    rc: int = 0


@dataclass
class Row:
    what: str
    goal: str
    ok: Callable[["Row"], bool]
    runs: List[Run] = field(default_factory=list)
    yardsticks: Dict[str, List[Run]] = field(default_factory=dict)
    before: List[Run] = field(default_factory=list)
    note: str = ""

    def median(self, attr: str = "seconds", runs: Optional[List[Run]] = None) -> float:
        values = [getattr(r, attr) for r in (self.runs if runs is None else runs) if getattr(r, attr) is not None]
        return statistics.median(values) if values else float("nan")


# -- running and timing ----------------------------------------------------------------------
def timed(cmd: List[str], env: Dict[str, str], cwd: Path = REPO, expect: Tuple[int, ...] = (0,)) -> Tuple[Run, str]:
    """Run cmd in cwd; wall seconds, its own CPU time and peak RSS (wait4), and what it printed.

    The tools read ./mods first, so another revision's tools run in that revision's folder.
    """
    with tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode("utf-8", "replace")
    if proc.returncode not in expect:
        raise SystemExit(f"bench_check: {' '.join(cmd[:6])} exited {proc.returncode}:\n{text[-2000:]}")
    return Run(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, rc=proc.returncode), text


def base_env(code: Optional[Path] = None, **extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "COLUMNS")}
    if code is not None:
        env["PYTHONPATH"] = str(code / "tools")
    env.update(extra)
    return env


def requests_of(text: str) -> int:
    return int(json.loads(text[text.index("{"):])["fetch"]["requests"])


def alternate(reps: int, subject: Callable[[], Run], sticks: Dict[str, Callable[[], Run]], row: Row) -> None:
    """reps rounds of: the subject, then each yardstick (same conditions, side by side)."""
    for _ in range(reps):
        row.runs.append(subject())
        for name, stick in sticks.items():
            row.yardsticks.setdefault(name, []).append(stick())


def python_pass() -> Run:
    return timed([sys.executable, "-c", "pass"], base_env())[0]


# -- rows ------------------------------------------------------------------------------------
def check_rows(reps: int, before: Optional[Path]) -> List[Row]:
    warm = Row("`sparkmods check` all mods x releases, warm cache (`--offline`)", "<= 0.3 s",
               lambda r: r.median() <= 0.3)
    nocache = Row("same, `--no-cache` (every row checked again from the member cache)", "-", lambda r: True)
    args = ["check", "--offline"]
    timed(cli() + ["check"], base_env())  # warm-up online: fills member and result caches, writes bytecode
    alternate(reps, lambda: timed(cli() + args, base_env())[0], {"python -c pass": python_pass}, warm)
    alternate(reps, lambda: timed(cli() + args + ["--no-cache"], base_env())[0], {}, nocache)
    if before is not None:
        timed(cli(before) + args, base_env(before), before)
        warm.before = [timed(cli(before) + args, base_env(before), before)[0] for _ in range(reps)]
        nocache.before = [timed(cli(before) + args + ["--no-cache"], base_env(before), before)[0] for _ in range(reps)]
    return [warm, nocache]


def cold_row(reps: int, before: Optional[Path]) -> Row:
    row = Row("same, cold cache, PyPI", "<= 2.5 s, <= 100 requests",
              lambda r: r.median() <= 2.5 and r.median("requests") <= 100)

    def once(code: Optional[Path]) -> Run:
        with tempfile.TemporaryDirectory(prefix="sparkmods-cold-") as cache:
            run, text = timed(cli(code) + ["check", "--json"], base_env(code, SPARKMODS_CACHE_DIR=cache), code or REPO)
        run.requests = requests_of(text)
        return run

    def both() -> Run:
        """This revision, then the other one right after it: PyPI's latency changes from minute
        to minute, so a single run of the other revision said little."""
        run = once(None)
        if before is not None:
            row.before.append(once(before))
        return run

    alternate(reps, both, {"python -c pass": python_pass}, row)
    return row


def help_row(reps: int, before: Optional[Path]) -> Row:
    row = Row("`sparkmods --help` (start-up)", "<= 0.06 s", lambda r: r.median() <= 0.06)
    timed(SPARKMODS + ["--help"], base_env())
    alternate(reps, lambda: timed(SPARKMODS + ["--help"], base_env())[0], {"python -c pass": python_pass}, row)
    if before is not None:
        timed(cli(before) + ["--help"], base_env(before), before)
        row.before = [timed(cli(before) + ["--help"], base_env(before), before)[0] for _ in range(reps)]
    return row


_INDEX_SCRIPT = r"""
import json, sys, time
from sparkmods.sources import open_targets
t = time.perf_counter()
found = open_targets(sys.argv[1], offline=True, prereleases=True)
print(json.dumps({"seconds": time.perf_counter() - t, "selected": len(found)}))
"""


def write_index_page(cache: Path, url: str, builds: int) -> bytes:
    """A cached PEP 691 page of `builds` nightly wheels, as fetch_page stores pages."""
    files = []
    for i in range(builds):
        name = f"vllm-0.30.0.dev{i}+g{i:09x}-cp38-abi3-manylinux_2_31_x86_64.whl"
        files.append({"filename": name, "url": f"https://example.invalid/{i:09x}/{quote(name)}",
                      "hashes": {"sha256": hashlib.sha256(name.encode()).hexdigest()}, "size": 400_000_000})
    body = json.dumps({"meta": {"api-version": "1.1"}, "name": "vllm", "files": files})
    page_url = url.rstrip("/") + "/vllm/"
    entry = {"url": page_url, "final_url": page_url, "content_type": JSON_TYPE, "fetched": time.time(),
             "max_age": 0, "body": body}
    folder = cache / "index"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{hashlib.sha256(page_url.encode()).hexdigest()}.json").write_text(json.dumps(entry))
    return body.encode()


def index_row(reps: int, before: Optional[Path], builds: int = 10_000) -> Row:
    row = Row(f"index with {builds:,} builds (per-commit nightly index), one range", "<= 0.5 s",
              lambda r: r.median() <= 0.5)
    url = "https://nightly.example.invalid/simple"
    spec = f"index:{url}#>=0.30.0.dev100"
    with tempfile.TemporaryDirectory(prefix="sparkmods-index-") as cache:
        body = write_index_page(Path(cache), url, builds)

        def once(code: Optional[Path]) -> Run:
            _, text = timed([sys.executable, "-c", _INDEX_SCRIPT, spec], base_env(code, SPARKMODS_CACHE_DIR=cache), code or REPO)
            doc = json.loads(text)
            row.note = f"{doc['selected']:,} builds selected"
            return Run(doc["seconds"])

        def parse_only() -> Run:
            start = time.perf_counter()
            json.loads(body)
            return Run(time.perf_counter() - start)

        alternate(reps, lambda: once(None), {"json.loads of the page": parse_only}, row)
        if before is not None:
            row.before = [once(before)]
    return row


class _NightlyIndex(BaseHTTPRequestHandler):
    """/simple/vllm/ lists `names` (one wheel file under many names and hashes); /files/
    serves that file with Range, as a CDN does."""

    protocol_version = "HTTP/1.1"
    wheel: Path = Path()  # set by nightly_row
    names: ClassVar[List[str]] = []

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes, headers: Dict[str, str]) -> None:
        self.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        size = self.wheel.stat().st_size
        if self.path == "/simple/vllm/":
            files = [{"filename": n, "url": f"../../files/{quote(n)}", "size": size,
                      "hashes": {"sha256": hashlib.sha256(n.encode()).hexdigest()}} for n in self.names]
            body = json.dumps({"meta": {"api-version": "1.1"}, "name": "vllm", "files": files}).encode()
            return self._send(200, body, {"Content-Type": JSON_TYPE})
        if not self.path.startswith("/files/") or unquote(self.path[len("/files/"):]) not in self.names:
            return self._send(404, b"not found", {})
        spec = (self.headers.get("Range") or "").removeprefix("bytes=")
        first, _, last = spec.partition("-")
        start = size - int(last) if not first else int(first)
        end = size if not last or not first else min(int(last) + 1, size)
        with self.wheel.open("rb") as fh:
            fh.seek(max(start, 0))
            body = fh.read(end - max(start, 0))
        self._send(206, body, {"Content-Range": f"bytes {max(start, 0)}-{end - 1}/{size}"})


def nightly_row(reps: int, before: Optional[Path], builds: int = 50) -> Row:
    row = Row(f"{builds} nightly builds checked, cold (loopback index)", "<= 4 s, <= 100 MiB",
              lambda r: r.median() <= 4 and r.median("rss_mib") <= 100)
    _NightlyIndex.wheel = vllm_wheel(NIGHTLY_RELEASE)
    _NightlyIndex.names = [f"vllm-0.19.2.dev{i}+g{i:09x}-cp38-abi3-manylinux_2_31_x86_64.whl" for i in range(builds)]
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NightlyIndex)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    spec = f"index:http://127.0.0.1:{server.server_address[1]}/simple#>=0.19.2.dev0"
    try:
        def once(code: Optional[Path]) -> Run:
            with tempfile.TemporaryDirectory(prefix="sparkmods-nightly-") as cache:
                run, text = timed(cli(code) + ["check", "--json", "--pre", "--vllm", spec],
                                  base_env(code, SPARKMODS_CACHE_DIR=cache), code or REPO, expect=(0, 1))
            run.requests = requests_of(text)
            return run

        alternate(reps, lambda: once(None), {"python -c pass": python_pass}, row)
        if before is not None:
            row.before = [once(before)]
    finally:
        server.shutdown()
        server.server_close()
    return row


def runsh_rows(reps: int, before: Optional[Path], work: Path) -> List[Row]:
    apply = Row(f"run.sh apply ({RUNSH_MOD}, vLLM {RUNSH_VLLM} files)", "<= 0.15 s", lambda r: r.median() <= 0.15)
    again = Row("run.sh on the applied tree (already applied)", "<= 0.15 s", lambda r: r.median() <= 0.15)
    mod = REPO / "mods" / RUNSH_MOD
    pristine = realtree.release_site(work / "pristine", [mod], RUNSH_VLLM)
    from sparkmods.checking.batch import paths_needed
    from sparkmods.runtime.manifest import load_manifest

    variant = load_manifest(mod).select(RUNSH_VLLM)
    patches = [str(mod / rel) for rel in variant.patches]
    assert paths_needed(load_manifest(mod), mod, RUNSH_VLLM)

    def env(site: Path) -> Dict[str, str]:
        return {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "PYTHON_ROOT": str(site),
                "WORKSPACE_DIR": str(work / "ws"), "SPARKMODS_PYTHON": PYTHON}

    (work / "ws").mkdir(exist_ok=True)

    def measure(mod_dir: Path, apply_runs: List[Run], again_runs: List[Run], sticks: bool, n: int) -> None:
        for i in range(n + 1):  # the first round warms the page cache, unmeasured
            site = realtree.copy_tree(pristine, work / "site")
            # The copy is set-up, not the subject: in a container the vLLM files were written long
            # before run.sh starts. Without this its writeback overlaps the timed run, whose file
            # creations and renames then wait on the filesystem journal (0.033 s runs became
            # 0.043 s, in runs, on the dev machine's ext4).
            os.sync()
            first = timed(["bash", str(mod_dir / "run.sh")], env(site))[0]
            second = timed(["bash", str(mod_dir / "run.sh")], env(site))[0]
            if i:
                apply_runs.append(first)
                again_runs.append(second)
            if sticks and i:
                fresh = realtree.copy_tree(pristine, work / "plain")
                apply.yardsticks.setdefault("git apply --check", []).append(
                    timed(["git", "apply", "--check", *patches], os.environ.copy(), cwd=fresh)[0])
                total = Run(0.0)
                for patch in patches:
                    total.seconds += timed(["patch", "-p1", "--dry-run", "--silent", "-i", patch],
                                           os.environ.copy(), cwd=fresh)[0].seconds
                apply.yardsticks.setdefault("patch --dry-run", []).append(total)
                again.yardsticks.setdefault("python -c pass (run.sh's interpreter)", []).append(
                    timed([PYTHON, "-c", "pass"], os.environ.copy())[0])
                shutil.rmtree(fresh)
            shutil.rmtree(site)

    measure(mod, apply.runs, again.runs, True, reps)
    if before is not None:
        measure(before / "mods" / RUNSH_MOD, apply.before, again.before, False, reps)
    return [apply, again]


# -- report ----------------------------------------------------------------------------------
def fmt(row: Row, runs: List[Run]) -> str:
    if not runs:
        return "-"
    text = f"{row.median(runs=runs):.3f} s"
    if any(r.requests is not None for r in runs):
        text += f", {row.median('requests', runs):.0f} requests"
    if "MiB" in row.goal:
        text += f", {row.median('rss_mib', runs):.0f} MiB RSS"
    return text


def markdown(rows: List[Row], args: argparse.Namespace, before: Optional[str]) -> str:
    host = (f"{platform.node()} ({os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end, "
            f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d')})")
    lines = [
        "# Benchmark: `sparkmods check`, start-up and run.sh",
        "",
        f"Generated by `ci/bench/bench_check.py --reps {args.reps}"
        + "".join(f" --only {row}" for row in sorted(set(args.only or [])))
        + (f" --before {before}" if before else "") + f"` on {host}.",
        f"Median of {args.reps} runs; the yardsticks ran alternately with the subject, in the same run."
        + (f" \"before\" is revision {before} (alternating with this one on the cold row; one run each for the index and nightly rows)." if before else ""),
        "",
        "| what | " + ("before | " if before else "") + "now | goal | met | yardsticks (median) |",
        "|---|" + ("---:|" if before else "") + "---:|---|---|---|",
    ]
    for row in rows:
        sticks = "; ".join(f"{name}: {statistics.median(r.seconds for r in runs):.3f} s"
                           for name, runs in row.yardsticks.items())
        if row.note:
            sticks = f"{sticks}; {row.note}" if sticks else row.note
        met = "-" if row.goal == "-" else ("yes" if row.runs and row.ok(row) else "**no**")
        cells = [row.what] + ([fmt(row, row.before)] if before else []) + [fmt(row, row.runs), row.goal, met, sticks]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "CLI runs use bytecode (one unmeasured warm-up first); run.sh uses the interpreter itself "
              "(SPARKMODS_PYTHON) and compiles its runtime on every run, after one unmeasured round.", ""]
    return "\n".join(lines)


def export(rev: str, dest: Path) -> Path:
    """The tools and mods of revision rev, in dest."""
    archive = subprocess.run(["git", "archive", rev, "tools", "mods"], cwd=REPO, capture_output=True, check=True).stdout
    dest.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--before", metavar="REV", help="also measure the tools and mods of this git revision")
    parser.add_argument("--out", type=Path, default=REPO / "ci" / "bench" / "results")
    parser.add_argument("--only", action="append", choices=["warm", "cold", "help", "index", "nightly", "runsh"],
                        help="run only these rows (repeatable; default all)")
    args = parser.parse_args()
    wanted = set(args.only or ["warm", "cold", "help", "index", "nightly", "runsh"])
    with tempfile.TemporaryDirectory(prefix="bench-check-") as tmp:
        before = export(args.before, Path(tmp) / "before") if args.before else None
        rows: List[Row] = []
        if "warm" in wanted:
            rows += check_rows(args.reps, before)
        if "cold" in wanted:
            rows.append(cold_row(args.reps, before))
        if "help" in wanted:
            rows.append(help_row(args.reps, before))
        if "index" in wanted:
            rows.append(index_row(args.reps, before))
        if "nightly" in wanted:
            rows.append(nightly_row(args.reps, before))
        if "runsh" in wanted:
            rows += runsh_rows(args.reps, before, Path(tmp) / "runsh")
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"reps": args.reps, "before": args.before, "host": platform.node(), "cpus": os.cpu_count(),
           "python": platform.python_version(),
           "rows": [{"what": r.what, "goal": r.goal, "met": r.ok(r) if r.runs and r.goal != "-" else None,
                     "note": r.note, "runs": [vars(x) for x in r.runs], "before": [vars(x) for x in r.before],
                     "yardsticks": {k: [vars(x) for x in v] for k, v in r.yardsticks.items()}} for r in rows]}
    name = "check" + "".join(f"-{row}" for row in sorted(set(args.only or []))) + "-any-cpu"
    (args.out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    text = markdown(rows, args, args.before)
    (args.out / f"{name}.md").write_text(text)
    print(text)
    return 0 if all(r.ok(r) for r in rows if r.runs and r.goal != "-") else 1


if __name__ == "__main__":
    raise SystemExit(main())
