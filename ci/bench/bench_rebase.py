#!/usr/bin/env python3
"""Benchmark: carry small edits across real vLLM releases; count where each tool puts them.

Cases come from real drift: .py files that changed between consecutive vLLM releases
>= 0.18.0. In the older file a seeded generator writes one small edit inside a function:
an insertion between two statements (or at the top of a function body), a replacement of a
statement's first line, or the deletion of a simple statement; half of them next to code
that changed upstream (within 3 lines), half away from it. Each is carried to the newer
release by `sparkmods rebase-patch` (the same function the command calls, in-process), GNU
patch (default fuzz) and `git merge-file`, and scored:

  placed correctly  the tool succeeded and its file equals the ground truth byte for byte
  flagged           the tool reported a conflict / failed hunk
  silently wrong    the tool succeeded and its file differs from the ground truth

Ground truth is defined without any of the tools, by anchoring the edit to statements
(exact text, unique in the file, same enclosing function) that exist in both releases:
  - insertion after statement S: after S in the newer file; if the next statement T also
    survives it must still follow S (else upstream put code between them: ambiguous, skipped);
    if S changed but T survives and nothing separates them, right before T;
  - insertion at the top of a body: after the def's header, when the function still exists
    and its first statement is not new upstream code;
  - replacement/deletion of statement S: the same change to S in the newer file.
Cases with ambiguous truth are skipped (counted). Cases where the edited statement itself
changed upstream have no correct placement: they are scored separately (flagged = right).

A second table carries the real mods in mods/: each variant's patches, from its last
verified release to the first release of the next variant, compared with the result of that
next, hand-ported variant.

    .venv/bin/python ci/bench/bench_rebase.py [--wheels /tmp/wheels] [--cases 400] [--seed 7]
        [--out ci/bench/results/rebase-any-cpu.md] [--jobs 2] [--mods mods]

Exit code 1 when the goal is missed: any silently wrong case for sparkmods, or fewer than
95 % placed correctly, or not more placed correctly than both other tools.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import glob
import itertools
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from packaging.version import Version

from sparkmods.rebase import rebase_patches
from sparkmods.runtime.engine import plan
from sparkmods.runtime.udiff import parse_patch
from sparkmods.sources.base import MemorySource

FIRST = Version("0.18.0")
NEAR = 3  # an edit within this many lines of an upstream change is "near changed code"
MAX_LINES = 6000
TOOLS = ("sparkmods rebase-patch", "GNU patch (fuzz 2)", "git merge-file")
OK, FLAG, WRONG = "placed correctly", "flagged", "silently wrong"


# ---------------------------------------------------------------- release file access
class Release:
    """One release's files, from the local wheel or (none there) PyPI; a rebase Tree too."""

    def __init__(self, version: str, wheels: Optional[Path]) -> None:
        self.version = version
        self.label = f"pypi:{version}"
        self._zip = None
        self._src = None
        found = sorted(glob.glob(str(wheels / version / "*.whl"))) if wheels else []
        if found:
            self._zip = zipfile.ZipFile(found[0])
        else:  # no local wheel: read it through the sources layer (PyPI, range requests, cached)
            from sparkmods.sources import open_targets
            (self._src,) = open_targets(f"pypi:{version}")

    def list_files(self) -> List[str]:
        return sorted(self._zip.namelist() if self._zip else self._src.list_files())

    def py_files(self) -> List[str]:
        return [n for n in self.list_files() if n.startswith("vllm/") and n.endswith(".py")]

    def prefetch(self, paths) -> None:
        if self._src is not None:
            self._src.prefetch(paths)

    def read(self, path: str) -> Optional[bytes]:
        if self._zip:
            try:
                return self._zip.read(path)
            except KeyError:
                return None
        return self._src.read(path)


def releases(wheels: Optional[Path]) -> List[str]:
    if wheels and wheels.is_dir():
        found = [p.name for p in wheels.iterdir() if glob.glob(str(p / "*.whl"))]
    else:
        from sparkmods.sources import open_targets
        found = [s.version for s in open_targets(f">={FIRST}")]
    return sorted((v for v in found if Version(v) >= FIRST and not Version(v).is_prerelease), key=Version)


# ---------------------------------------------------------------- statements (truth side)
@dataclass
class St:
    start: int
    end: int
    block: int
    idx: int
    func: str
    text: str
    simple: bool
    docstring: bool


class Index:
    """Statements inside functions, by block, with their exact text (independent of sparkmods)."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines(True)
        self.stmts: List[St] = []
        self.blocks: Dict[int, List[St]] = defaultdict(list)
        self.owner: Dict[int, Tuple[str, int]] = {}  # block -> (def qualname, header end) for def bodies
        self.defs: Counter = Counter()
        self._next = 0
        self._walk(ast.parse(text).body, "", None)
        self.by_text: Counter = Counter(s.text for s in self.stmts)

    def _new_block(self) -> int:
        self._next += 1
        return self._next

    def _walk(self, body: Sequence[ast.stmt], scope: str, func: Optional[str]) -> None:
        block = self._new_block()
        for i, node in enumerate(body):
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
            text = "".join(self.lines[start:node.end_lineno])
            simple = not any(isinstance(getattr(node, f, None), list) and getattr(node, f)
                             and isinstance(getattr(node, f)[0], ast.stmt) for f in ("body", "orelse", "finalbody", "handlers", "cases"))
            doc = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            if func is not None:
                st = St(start, node.end_lineno, block, i, func, text, simple, doc)
                self.stmts.append(st)
                self.blocks[block].append(st)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qual = f"{scope}.{node.name}" if scope else node.name
                self.defs[qual] += 1
                if isinstance(node, ast.ClassDef):
                    self._walk(node.body, qual, None)
                else:
                    first = node.body[0]
                    first_start = min([first.lineno] + [d.lineno for d in getattr(first, "decorator_list", [])]) - 1
                    inner = self._next + 1
                    self._walk(node.body, qual, qual)
                    self.owner[inner] = (qual, first_start)
                continue
            for f in ("body", "orelse", "finalbody"):
                sub = getattr(node, f, None)
                if isinstance(sub, list) and sub and isinstance(sub[0], ast.stmt):
                    self._walk(sub, scope, func)
            for h in getattr(node, "handlers", []) or []:
                self._walk(h.body, scope, func)
            for c in getattr(node, "cases", []) or []:
                self._walk(c.body, scope, func)

    def unique(self, text: str, func: str) -> Optional[St]:
        if self.by_text[text] != 1:
            return None
        hit = next(s for s in self.stmts if s.text == text)
        return hit if hit.func == func else None

    def next_of(self, s: St) -> Optional[St]:
        b = self.blocks[s.block]
        return b[s.idx + 1] if s.idx + 1 < len(b) else None

    def header_clean(self, block: int) -> bool:
        """The def's first statement follows its header directly (no comment lines between)."""
        _, first = self.owner[block]
        line = self.lines[first - 1].split("#", 1)[0].rstrip()
        return line.endswith(":")

    def def_block(self, qual: str) -> Optional[int]:
        if self.defs[qual] != 1:
            return None
        hits = [b for b, (q, _) in self.owner.items() if q == qual]
        return hits[0] if len(hits) == 1 else None


@dataclass
class Case:
    pair: str
    path: str
    kind: str  # insert, insert-top, replace, delete
    near: str  # adjacent, near, far
    base: str
    patched: str
    onto: str
    truth: Optional[str]  # None: no correct placement (the edited statement changed upstream)


def _changed_lines(a: List[str], b: List[str]) -> List[int]:
    out = []
    for tag, i1, i2, _j1, _j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            out.extend(range(i1, i2) if i2 > i1 else [i1 - 0.5])
    return out


def _distance(changed: List[float], lo: float, hi: float) -> float:
    """Lines between region [lo, hi] (base line numbers) and the nearest changed line."""
    best = float("inf")
    for c in changed:
        d = lo - c - 1 if c < lo else (c - hi - 1 if c > hi else -1)
        best = min(best, d)
    return best


def _category(d: float) -> str:
    return "adjacent" if d <= 0 else ("near" if d <= NEAR else "far")


def _splice(lines: List[str], at: int, drop: int, new: List[str]) -> str:
    return "".join(lines[:at] + new + lines[at + drop:])


def generate(pair: str, path: str, base: str, onto: str, rng: random.Random, counter: List[int]) -> Tuple[List[Case], Counter]:
    """Every well-defined edit of one file pair that the sampler may pick from."""
    skipped: Counter = Counter()
    bi, oi = Index(base), Index(onto)
    changed = _changed_lines(bi.lines, oi.lines)
    cases: List[Case] = []

    def probe(indent: str) -> List[str]:
        counter[0] += 1
        n = counter[0]
        if n % 4 == 0:
            return [f"{indent}if _sparkmods_flag_{n}:\n", f"{indent}    _sparkmods_probe_{n}()\n"]
        return [f"{indent}_sparkmods_probe_{n}()\n"]

    for block, stmts in bi.blocks.items():
        indent = bi.lines[stmts[0].start][: len(bi.lines[stmts[0].start]) - len(bi.lines[stmts[0].start].lstrip())]
        for j in range(len(stmts) + 1):
            s = stmts[j - 1] if j else None
            t = stmts[j] if j < len(stmts) else None
            if s is None and (block not in bi.owner or t.docstring or not bi.header_clean(block)):
                continue
            new = probe(indent)
            p = s.end if s else bi.owner[block][1]
            truth, why = _insert_truth(bi, oi, block, s, t, p)
            if truth is None:
                skipped[why] += 1
                continue
            d = _distance(changed, p - 0.5, p - 0.5)
            cases.append(Case(pair, path, "insert-top" if s is None else "insert", _category(d), base,
                              _splice(bi.lines, p, 0, new), onto, _splice(oi.lines, truth, 0, new)))
        for s in stmts:
            if not s.simple or s.docstring or bi.unique(s.text, s.func) is None:
                continue
            d = _distance(changed, s.start, s.end - 1)
            so = oi.unique(s.text, s.func)
            if so is None and oi.by_text[s.text]:
                skipped["edited statement occurs twice in the newer file"] += 1
                continue
            first = bi.lines[s.start]
            lead = first[: len(first) - len(first.lstrip())]
            if rng.random() < 0.5:
                counter[0] += 1
                new_first = f"{lead}_sparkmods_{counter[0]} = {counter[0]}; {first.lstrip()}"
                truth = None if so is None else _splice(oi.lines, so.start, 1, [new_first])
                cases.append(Case(pair, path, "replace", _category(d), base, _splice(bi.lines, s.start, 1, [new_first]),
                                  onto, truth))
            elif len(stmts) > 1 and (so is None or len(oi.blocks[so.block]) > 1):
                truth = None if so is None else _splice(oi.lines, so.start, so.end - so.start, [])
                cases.append(Case(pair, path, "delete", _category(d), base,
                                  _splice(bi.lines, s.start, s.end - s.start, []), onto, truth))
    return cases, skipped


def _insert_truth(bi: Index, oi: Index, block: int, s: Optional[St], t: Optional[St], p: int) -> Tuple[Optional[int], str]:
    if s is None:
        qual = bi.owner[block][0]
        ob = oi.def_block(qual)
        if ob is None or bi.def_block(qual) is None:
            return None, "function gone or defined twice"
        if not oi.header_clean(ob):
            return None, "comment lines under the newer def header"
        to = oi.unique(t.text, t.func) if t and bi.unique(t.text, t.func) else None
        if to is not None and (to.block != ob or to.idx != 0):
            return None, "upstream put code at the top of the function"
        return oi.owner[ob][1], ""
    so = oi.unique(s.text, s.func) if bi.unique(s.text, s.func) else None
    to = oi.unique(t.text, t.func) if t is not None and bi.unique(t.text, t.func) else None
    if so is not None:
        if t is not None and to is not None and oi.next_of(so) is not to:
            return None, "upstream put code between the two statements"
        if t is None and oi.next_of(so) is not None:
            return None, "upstream appended code after the last statement"
        return so.end, ""
    if to is not None and p == t.start and to.idx > 0:
        prev = oi.blocks[to.block][to.idx - 1]
        if prev.end == to.start:
            return to.start, ""
    return None, "both statements around the insertion changed or are not unique"


# ---------------------------------------------------------------- the three tools
def udiff(path: str, a: str, b: str) -> str:
    return "".join(difflib.unified_diff(a.splitlines(True), b.splitlines(True), "a/" + path, "b/" + path))


def run_sparkmods(c: Case, patch: str) -> Optional[str]:
    res = rebase_patches(parse_patch(patch), MemorySource("base", {c.path: c.base}), MemorySource("onto", {c.path: c.onto}))
    if not res.clean or not res.patch:
        return None
    (out,) = plan(parse_patch(res.patch), MemorySource("onto", {c.path: c.onto}).read)
    return out.after.decode() if out.after is not None else None


def run_gnu_patch(c: Case, patch: str, tmp: Path) -> Optional[str]:
    target = tmp / "tree" / c.path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(c.onto)
    (tmp / "p.diff").write_text(patch)
    proc = subprocess.run(["patch", "-p1", "--batch", "--no-backup-if-mismatch", "-r", str(tmp / "rej"),
                           "-d", str(tmp / "tree"), "-i", str(tmp / "p.diff")], capture_output=True, text=True)
    return target.read_text() if proc.returncode == 0 else None


def run_git_merge_file(c: Case, tmp: Path) -> Optional[str]:
    for name, text in (("onto", c.onto), ("base", c.base), ("patched", c.patched)):
        (tmp / name).write_text(text)
    proc = subprocess.run(["git", "merge-file", "-p", str(tmp / "onto"), str(tmp / "base"), str(tmp / "patched")],
                          capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 else None


def score(c: Case) -> Tuple[List[str], List[float]]:
    patch = udiff(c.path, c.base, c.patched)
    outcomes, times = [], []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for run in (lambda: run_sparkmods(c, patch), lambda: run_gnu_patch(c, patch, tmp),
                    lambda: run_git_merge_file(c, tmp)):
            t0 = time.perf_counter()
            got = run()
            times.append(time.perf_counter() - t0)
            outcomes.append(FLAG if got is None else (OK if got == c.truth else WRONG))
    return outcomes, times


# ---------------------------------------------------------------- the real mods
SAME, DIFFERS = "same as the hand port", "differs from the hand port"


def _patched_files(fps, tree) -> Dict[str, Optional[bytes]]:
    """path -> bytes after the file patches, on tree (engine, exact or offset); {} if they do not apply."""
    results = plan(fps, tree.read)
    if any(r.status not in ("ok", "ok-offset") for r in results):
        return {}
    return {r.path: r.after for r in results}


def _tools_on_mod(fps, patch_text: str, base: Release, onto: Release, want: Dict[str, Optional[bytes]]) -> List[str]:
    """Each tool's outcome carrying one variant's patches from base to onto."""
    outcomes = []
    res = rebase_patches(fps, base, onto)
    got = {p: a for p, (_, a) in res.changes().items()} if res.clean else None
    outcomes.append(FLAG if got is None else (SAME if got == want else DIFFERS))
    with tempfile.TemporaryDirectory() as d:
        tree = Path(d) / "tree"
        for path in {fp.path for fp in fps} | set(want):
            data = onto.read(path)
            if data is not None:
                (tree / path).parent.mkdir(parents=True, exist_ok=True)
                (tree / path).write_bytes(data)
        (Path(d) / "p.diff").write_text(patch_text)
        tree.mkdir(exist_ok=True)
        proc = subprocess.run(["patch", "-p1", "--batch", "--no-backup-if-mismatch", "-r", str(Path(d) / "rej"),
                               "-d", str(tree), "-i", str(Path(d) / "p.diff")], capture_output=True)
        got = {p: ((tree / p).read_bytes() if (tree / p).exists() else None) for p in want}
        outcomes.append(FLAG if proc.returncode else (SAME if got == want else DIFFERS))
        merged: Optional[Dict[str, Optional[bytes]]] = {}
        before = _patched_files(fps, base)
        for fp in fps:
            ours, theirs = base.read(fp.path), onto.read(fp.path)
            if ours is None or theirs is None:  # a created file, or a file gone from onto
                if ours is None and theirs is None:
                    merged[fp.path] = before.get(fp.path)
                    continue
                merged = None
                break
            for name, data in (("onto", theirs), ("base", ours), ("patched", before.get(fp.path) or b"")):
                (Path(d) / name).write_bytes(data)
            proc = subprocess.run(["git", "merge-file", "-p", str(Path(d) / "onto"), str(Path(d) / "base"),
                                   str(Path(d) / "patched")], capture_output=True)
            if proc.returncode != 0:
                merged = None
                break
            merged[fp.path] = proc.stdout
        outcomes.append(FLAG if merged is None else (SAME if merged == want else DIFFERS))
    return outcomes


def real_mods(mods_dir: Path, wheels: Optional[Path]) -> List[str]:
    """Carry each real mod's variant to the release its next variant starts at, and compare
    with that hand-ported variant (the best ground truth there is for real patches)."""
    from sparkmods.runtime.manifest import load_manifest
    from sparkmods.runtime.modcheck import variant_patches

    rows: List[Tuple[str, List[str]]] = []
    opened: Dict[str, Release] = {}

    def rel(v: str) -> Release:
        if v not in opened:
            opened[v] = Release(v, wheels)
        return opened[v]
    for mod in sorted(p.parent for p in mods_dir.glob("*/mod.toml")):
        variants = [v for v in load_manifest(mod).variants if v.patches and v.verified]
        for a, b in itertools.pairwise(variants):
            base, onto = rel(a.verified[-1]), rel(b.verified[0])
            fps = variant_patches(mod, a)
            want = {p: x for p, x in _patched_files(variant_patches(mod, b), onto).items()}
            text = "".join((mod / r).read_text() for r in a.patches)
            rows.append((f"{mod.name}: {a.label} ({base.version}) -> {onto.version}",
                         _tools_on_mod(fps, text, base, onto, want)))
    if not rows:
        return []
    out = ["", f"Real mods ({mods_dir.name}/): each variant's patches carried from its last verified release to "
                f"the first release of the next variant, compared with that hand-ported variant's result:", "",
           "| tool | " + " | ".join((SAME, DIFFERS, FLAG)) + " |", "|---|---:|---:|---:|"]
    for i, tool in enumerate(TOOLS):
        c = Counter(r[1][i] for r in rows)
        out.append(f"| {tool} | {c[SAME]} | {c[DIFFERS]} | {c[FLAG]} |")
    out += ["", "| transition | " + " | ".join(TOOLS) + " |", "|---|---|---|---|"]
    out += [f"| {name} | " + " | ".join(o) + " |" for name, o in rows]
    return out


# ---------------------------------------------------------------- sampling and report
def collect(vers: List[str], wheels: Optional[Path], seed: int, per_pair_files: int) -> Tuple[List[Case], Counter, int]:
    rng = random.Random(seed)
    pool: List[Case] = []
    skipped: Counter = Counter()
    counter = [0]
    files_used = 0
    prev = Release(vers[0], wheels)
    for v in vers[1:]:
        cur = Release(v, wheels)
        common = sorted(set(prev.py_files()) & set(cur.py_files()))
        changed = [p for p in common if prev.read(p) != cur.read(p)]
        rng.shuffle(changed)
        used = 0
        for path in changed:
            if used >= per_pair_files:
                break
            a, b = prev.read(path).decode(), cur.read(path).decode()
            if a.count("\n") > MAX_LINES:
                continue
            try:
                cases, why = generate(f"{prev.version}->{v}", path, a, b, rng, counter)
            except SyntaxError:
                continue
            if cases:
                used += 1
                pool.extend(cases)
                skipped.update(why)
        files_used += used
        prev = cur
    return pool, skipped, files_used


def sample(pool: List[Case], n: int, seed: int) -> Tuple[List[Case], List[Case]]:
    """n cases with a truth: a quarter next to an upstream change, a quarter within NEAR lines
    of one, half farther away; plus up to n/6 cases without a correct placement."""
    rng = random.Random(seed + 1)
    by: Dict[str, List[Case]] = defaultdict(list)
    for c in pool:
        by["none" if c.truth is None else c.near].append(c)
    for v in by.values():
        rng.shuffle(v)
    adjacent = by["adjacent"][: n // 4]
    near = by["near"][: n // 2 - len(adjacent)]
    far = by["far"][: n - len(adjacent) - len(near)]
    return adjacent + near + far, by["none"][: n // 6]


def _table(rows: Dict[str, Counter], total: int) -> List[str]:
    out = ["| tool | placed correctly | flagged | silently wrong |", "|---|---:|---:|---:|"]
    for tool in TOOLS:
        c = rows[tool]
        out.append(f"| {tool} | {c[OK]} ({100 * c[OK] / max(total, 1):.1f} %) | {c[FLAG]} | {c[WRONG]} |")
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheels", default="/tmp/wheels", help="folder of <version>/*.whl (else read from PyPI)")
    ap.add_argument("--cases", type=int, default=400)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--files-per-pair", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "rebase-any-cpu.md"))
    ap.add_argument("--wrong", help="write the silently-wrong sparkmods cases here (for debugging)")
    ap.add_argument("--mods", default=str(Path(__file__).resolve().parents[2] / "mods"),
                    help="also carry these real mods' variants to their next variant's release ('' to skip)")
    args = ap.parse_args(argv)
    wheels = Path(args.wheels) if Path(args.wheels).is_dir() else None
    vers = releases(wheels)
    t0 = time.time()
    pool, skipped, files_used = collect(vers, wheels, args.seed, args.files_per_pair)
    cases, nontruth = sample(pool, args.cases, args.seed)
    with ProcessPoolExecutor(max_workers=args.jobs) as ex:
        scored = list(ex.map(score, cases + nontruth, chunksize=4))
    rows: Dict[str, Counter] = defaultdict(Counter)
    cats: Dict[Tuple[str, str], Counter] = defaultdict(Counter)
    kinds: Dict[Tuple[str, str], Counter] = defaultdict(Counter)
    none_rows: Dict[str, Counter] = defaultdict(Counter)
    secs: Dict[str, float] = defaultdict(float)
    wrong_cases = []
    for c, (outs, times) in zip(cases + nontruth, scored):
        for tool, o, t in zip(TOOLS, outs, times):
            secs[tool] += t
            if c.truth is None:
                none_rows[tool]["flagged (right)" if o == FLAG else "applied (silently wrong)"] += 1
                if tool == TOOLS[0] and o != FLAG:
                    wrong_cases.append(c)
                continue
            rows[tool][o] += 1
            cats[(tool, c.near)][o] += 1
            kinds[(tool, c.kind)][o] += 1
            if tool == TOOLS[0] and o == WRONG:
                wrong_cases.append(c)
    n = len(cases)
    lines = ["# Rebase benchmark: carrying edits across real vLLM releases", "",
             f"Generated by `ci/bench/bench_rebase.py --cases {args.cases} --seed {args.seed} "
             f"--files-per-pair {args.files_per_pair}` on {platform.node() or 'this machine'} "
             f"({os.cpu_count()} cores, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}).", "",
             f"{n} edits with a well-defined correct placement, from {files_used} changed files over "
             f"{len(vers) - 1} consecutive release pairs ({vers[0]} .. {vers[-1]}); "
             f"{sum(1 for c in cases if c.near != 'far')} of them within {NEAR} lines of code that changed upstream.", "",
             "Each edit (one insertion, first-line replacement or deletion of a statement inside a function) is "
             "written against the older file; its correct place in the newer file is defined without any tool, "
             "by anchoring it to statements that exist, unchanged and unique, in both releases (see the script's "
             "docstring). sparkmods runs in-process through the function `sparkmods rebase-patch` calls; GNU patch "
             "applies the unified diff with its default fuzz; git merge-file merges the three files.", ""]
    lines += _table(rows, n)
    lines += ["", "By distance to the nearest upstream change (placed correctly / flagged / silently wrong):", "",
              "| tool | " + " | ".join(f"{k} (n={sum(cats[(TOOLS[0], k)].values())})" for k in ("adjacent", "near", "far")) + " |",
              "|---|---:|---:|---:|"]
    for tool in TOOLS:
        lines.append(f"| {tool} | " + " | ".join(
            f"{cats[(tool, k)][OK]} / {cats[(tool, k)][FLAG]} / {cats[(tool, k)][WRONG]}" for k in ("adjacent", "near", "far")) + " |")
    kind_names = sorted({c.kind for c in cases})
    lines += ["", "By kind of edit (placed correctly / flagged / silently wrong):", "",
              "| tool | " + " | ".join(f"{k} (n={sum(kinds[(TOOLS[0], k)].values())})" for k in kind_names) + " |",
              "|---|" + "---:|" * len(kind_names)]
    for tool in TOOLS:
        lines.append(f"| {tool} | " + " | ".join(
            f"{kinds[(tool, k)][OK]} / {kinds[(tool, k)][FLAG]} / {kinds[(tool, k)][WRONG]}" for k in kind_names) + " |")
    m = len(nontruth)
    lines += ["", f"{m} edits whose statement itself changed upstream (no correct placement: flagging is right):", "",
              "| tool | flagged (right) | applied (silently wrong) |", "|---|---:|---:|"]
    for tool in TOOLS:
        lines.append(f"| {tool} | {none_rows[tool]['flagged (right)']} | {none_rows[tool]['applied (silently wrong)']} |")
    if args.mods and Path(args.mods).is_dir():
        lines += real_mods(Path(args.mods), wheels)
    lines += ["", f"Wall time per tool over all {n + len(nontruth)} synthetic cases ({args.jobs} worker processes share the cores): "
              + ", ".join(f"{t}: {secs[t]:.1f} s" for t in TOOLS) + f"; whole run {time.time() - t0:.0f} s.", "",
              "Candidate edits skipped while generating, over every slot of the sampled files (ambiguous ground "
              "truth): "
              + ", ".join(f"{why}: {k}" for why, k in skipped.most_common()) + "."]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    if args.wrong and wrong_cases:
        import json
        Path(args.wrong).write_text(json.dumps([c.__dict__ for c in wrong_cases]))
    ours = rows[TOOLS[0]]
    goal = (ours[WRONG] == 0 and none_rows[TOOLS[0]]["applied (silently wrong)"] == 0 and ours[OK] >= 0.95 * n
            and all(ours[OK] > rows[t][OK] for t in TOOLS[1:]))
    return 0 if goal else 1


if __name__ == "__main__":
    sys.exit(main())
