"""Kill apply and revert at every disk step, for every mod: the next run always repairs the tree.

The runtime counts its disk steps (fsops.step); SPARKMODS_FAULT_AFTER=N (here fsops.arm, in a
forked child) stops it before step N+1 with os._exit(137), exactly what SIGKILL leaves, or
with SIGINT / SIGTERM sent to itself. For every N until the run completes:
  KILL       the next run of the same action ends at its goal (applied, or byte-identical to
             pristine), says once that it settled an interrupted run, leaves no temp, journal
             or debris; then the opposite action works too (the saved originals are right);
  INT, TERM  the interrupted run itself leaves the tree consistent (as before, or done), exits
             130 / 143, and leaves nothing behind.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

import realtree
from modfactory import edit_runtime, make_mod, make_site
from realtree import GOAL, OPPOSITE, START, Trees, run_quietly
from sparkmods.runtime import applier, fsops
from sparkmods.runtime.journal import JOURNAL_NAME, STATE_DIR, Entry, Journal, transact
from sparkmods.runtime.manifest import load_manifest

MODS = realtree.repo_mods()
MAX_STEPS = 400  # far above any mod's step count: a run that never completes is a failure


def forked_run(action: str, mod: Path, site: Path, workspace: Path, limit: int, kind: str) -> Tuple[int, str]:
    """The action in a child process armed to fault after `limit` steps: (exit status, output)."""
    log = site.parent / "child.log"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 99
        try:
            fsops.arm(limit, kind)
            with open(log, "w") as sink:
                code = applier.run(action, mod, site, workspace, False, applier.Printer(mod.name, sink))
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), log.read_text() if log.exists() else ""




def kill_every_step(trees: Trees, action: str, kind: str) -> Iterator[Tuple[int, str]]:
    """Yield the child's (exit status, output) for N = 0, 1, ... until the action completes."""
    for limit in range(MAX_STEPS):
        site, workspace = trees.fresh(START[action])
        status, out = forked_run(action, trees.mod, site, workspace, limit, kind)
        yield status, out
        if status == 0:
            return
    pytest.fail(f"{trees.mod.name} {action} still faulting after {MAX_STEPS} steps")


@pytest.fixture(scope="module", params=[m.name for m in MODS])
def trees(request, tmp_path_factory) -> Iterator[Trees]:
    """Trees on tmpfs when there is one: hundreds of runs, each copying a tree."""
    mod = next(m for m in MODS if m.name == request.param)
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        base = Path(tempfile.mkdtemp(prefix=f"sparkmods-{mod.name}-", dir=shm))
        yield Trees(base, mod, realtree.synthesized_site)
        shutil.rmtree(base, ignore_errors=True)
    else:
        yield Trees(tmp_path_factory.mktemp(mod.name), mod, realtree.synthesized_site)


@pytest.mark.parametrize("action", ["apply", "revert"])
def test_sigkill_at_every_step_is_repaired_by_the_next_run(trees: Trees, action: str) -> None:
    assert_kills_repaired(trees, action)


def assert_kills_repaired(trees: Trees, action: str) -> None:
    statuses = []
    for status, _ in kill_every_step(trees, action, "KILL"):
        statuses.append(status)
        site, workspace = trees.base / "work", trees.base / "ws"
        if status == 0:
            trees.assert_at(site, workspace, GOAL[action])
            continue
        assert status == 137, status
        interrupted = (site / STATE_DIR / JOURNAL_NAME).exists()
        rc, out = run_quietly(action, trees.mod, site, workspace)
        assert rc == 0, out
        assert out.count("found an interrupted") == (1 if interrupted else 0), out
        trees.assert_at(site, workspace, GOAL[action])
        rc, out = run_quietly(OPPOSITE[action], trees.mod, site, workspace)
        assert rc == 0, out
        trees.assert_at(site, workspace, START[action])
    changes_vllm = trees.snap["pristine"] != trees.snap["applied"]
    assert len(statuses) > (10 if changes_vllm else 0), statuses  # it did stop inside the transaction


@pytest.mark.parametrize("kind,code", [("INT", 130), ("TERM", 143)])
@pytest.mark.parametrize("action", ["apply", "revert"])
@pytest.mark.parametrize("trees", ["mtp-weights", "hybrid-int4-fp8"], indirect=True)  # SIGKILL: every mod
def test_sigint_and_sigterm_roll_back_at_once(trees: Trees, action: str, kind: str, code: int) -> None:
    seen = set()
    for status, out in kill_every_step(trees, action, kind):
        seen.add(status)
        site = trees.base / "work"
        assert status in (0, code), (status, out)
        state = trees.state_of(site)
        assert state is not None, "interrupted run left the tree half-changed"
        if status == code:  # one line says which: rolled back, finished, or nothing was under way
            assert out.count(f"interrupted by SIG{kind}") == 1, out
            if "rolled back" in out:
                assert trees.at(site, START[action]), out
            elif "completed" in out:
                assert trees.at(site, GOAL[action]), out
            else:
                assert "outside a change" in out, out
        assert trees.leftovers(site, trees.base / "ws") == []
    assert code in seen


def test_failure_mid_rename_rolls_back_and_names_the_file(tmp_path: Path, monkeypatch) -> None:
    """A rename that fails (full disk, EIO) after others succeeded: all put back, the file named."""
    site = realtree.write_site(tmp_path, "0.33.0", {"vllm/a.py": b"A\n", "vllm/b.py": b"B\n"})
    real_replace = os.replace

    def failing(src, dst):
        if str(dst).endswith("vllm/b.py"):
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(fsops.os, "replace", failing)
    entries = [Entry(f"vllm/{n}.py", *_sums(n), f"vllm/.{n}.py{fsops.TMP_SUFFIX}", f"{STATE_DIR}/m/orig/vllm/{n}.py")
               for n in ("a", "b")]
    payload: Dict[str, bytes] = {}
    for n, e in zip("ab", entries):
        payload[e.old] = n.upper().encode() + b"\n"
        payload[e.new] = n.upper().encode() + b"2\n"
    with pytest.raises(OSError) as err:
        transact(site, Journal("apply", "m", entries, {"files": {}}), payload)
    assert err.value.filename.endswith("vllm/b.py") and "No space" in err.value.strerror
    assert (site / "vllm/a.py").read_bytes() == b"A\n" and (site / "vllm/b.py").read_bytes() == b"B\n"
    assert realtree.strays(site, []) == []


def full_disk_run(action: str, mods: Path, site: Path, budget: Optional[int]) -> Tuple[int, str, List[int]]:
    """The action in a child whose os.write fails with ENOSPC once `budget` bytes are written, as
    on a full disk (None: no limit); (exit status, output, bytes written before each write)."""
    log, count = site.parent / "child.log", site.parent / "written"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 99
        try:
            real_write, written, starts = os.write, [0], []

            def write(fd: int, data) -> int:
                starts.append(written[0])
                room = len(data) if budget is None else min(len(data), budget - written[0])
                if room <= 0 and len(data):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                done = real_write(fd, bytes(data[:room]))
                written[0] += done
                return done

            fsops.os.write = write  # the child's own os module: the parent never sees it
            with open(log, "w") as sink:
                code = applier.run(action, mods, site, site.parent, False, applier.Printer(mods.name, sink))
            count.write_text(json.dumps(starts + written))
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), log.read_text(), json.loads(count.read_text())


@pytest.mark.parametrize("action", ["apply", "revert"])
def test_a_full_disk_at_any_write_rolls_back_and_names_the_file(tmp_path: Path, action: str) -> None:
    """Every write of an apply or revert (journal, copies, staged files, state.json) hitting a
    full disk, at its first byte or half-way: one line naming the file that could not be
    written, exit 1, the tree as before with no journal or temp left (all bytes are written
    before the first rename, a half-written temp is removed, and a rollback with nothing moved
    writes nothing), and the action works once there is room."""
    trees = Trees(tmp_path / "trees", next(m for m in MODS if m.name == "mtp-weights"), realtree.synthesized_site)
    site, workspace = trees.fresh(START[action])
    status, out, bounds = full_disk_run(action, trees.mod, site, None)
    assert status == 0 and len(bounds) > 4, out
    for budget in sorted({b for start, end in itertools.pairwise(bounds) for b in (start, (start + end) // 2)}):
        site, workspace = trees.fresh(START[action])
        status, out, _ = full_disk_run(action, trees.mod, site, budget)
        assert status == 1, (budget, out)
        (line,) = out.splitlines()
        assert "No space left on device; rolled back, nothing was changed" in line, line
        named = line.split("ERROR: ", 1)[1].split(": No space", 1)[0]
        assert Path(named).is_relative_to(site) and Path(named).name != "None", line
        trees.assert_at(site, workspace, START[action])
        assert not (site / STATE_DIR / JOURNAL_NAME).exists()
        rc, out = run_quietly(action, trees.mod, site, workspace)
        assert rc == 0 and "found an interrupted" not in out, out
        trees.assert_at(site, workspace, GOAL[action])


def _sums(name: str) -> List[str]:
    import hashlib
    return [hashlib.sha256(name.upper().encode() + s).hexdigest() for s in (b"\n", b"2\n")]


SEND_SIGINT = "import os, signal; os.kill(os.getpid(), signal.SIGINT)"


@pytest.mark.parametrize("module,line", [
    ("sitecustomize", SEND_SIGINT),  # the interpreter's start-up, as vLLM's .pth files run there
    ("boot", SEND_SIGINT),
    ("applier", SEND_SIGINT),
    ("applier", f"exec({SEND_SIGINT!r})"),  # as when it lands in the code a dataclass is built from
])
def test_sigint_while_the_runtime_is_imported_is_one_line(tmp_path: Path, module: str, line: str) -> None:
    """A real SIGINT while run.sh's Python starts (a sitecustomize module sends it to itself) or
    imports the runtime (the mod's copy of `module` sends it as its last line): answered with
    one line and 130, where Python alone prints a traceback (and, from sitecustomize, exits 1)."""
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods")
    startup = tmp_path / "startup"
    startup.mkdir()
    if module == "sitecustomize":
        (startup / "sitecustomize.py").write_text(line + "\n")
    else:
        edit_runtime(mod, module, lambda text: text + f"\n{line}\n")
    before = realtree.snapshot(site)
    env = {"PATH": os.environ["PATH"], "PYTHON_ROOT": str(site), "SPARKMODS_PYTHON": sys.executable,
           "SPARKMODS_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(startup)}
    out = subprocess.run(["bash", str(mod / "run.sh")], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=60, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # not inherited ignored
    assert out.returncode == 130, out.stdout + out.stderr
    assert out.stderr == "" and out.stdout.splitlines() == [
        "[demo] interrupted by SIGINT outside a change to vLLM's files: nothing is half-done "
        "(the lines above say what was done)"]
    assert realtree.snapshot(site) == before and not (site / STATE_DIR).exists()


@pytest.mark.network
@pytest.mark.parametrize("action", ["apply", "revert"])
@pytest.mark.parametrize("mod_name", [m.name for m in MODS])
def test_sigkill_on_a_real_release(tmp_path: Path, mod_name: str, action: str) -> None:
    """The same on the real files of the newest release each mod was verified on."""
    mod = next(m for m in MODS if m.name == mod_name)
    version = realtree.newest_verified(load_manifest(mod))
    trees = Trees(tmp_path, mod, lambda root, mods: realtree.release_site(root, mods, version))
    assert_kills_repaired(trees, action)
