"""How the `sparkmods` program ends (cli.entry): main's exit code, every byte it printed, the
exit handlers run (weakref finalizers remove an image source's helper container there), and a
thread still running is waited for; only the interpreter's teardown is skipped. And the
collector pause (gcpause) that makes the teardown worth skipping."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from modfactory import make_mod, make_site
from sparkmods.pyindex import gcpause

REPO = Path(__file__).resolve().parents[1]

# The console script's body, with something registered before it runs.
_PROGRAM = """
import atexit, sys, threading, time, weakref
class Held: pass
held = Held()
weakref.finalize(held, print, "finalizer ran", flush=True)
atexit.register(print, "handler ran", flush=True)
def until_main_ends():  # still running when main() returns, however long the check took
    while threading.main_thread().is_alive():
        time.sleep(0.05)
    print("thread finished", flush=True)
if {thread!r}:
    threading.Thread(target=until_main_ends).start()
sys.argv = ["sparkmods"] + sys.argv[1:]
from sparkmods.cli import entry
entry()
"""


def program(*argv: str, thread: bool = False, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPARKMODS_CACHE_DIR": kw.pop("cache")}
    return subprocess.run([sys.executable, "-c", _PROGRAM.format(thread=thread), *argv], capture_output=True,
                          text=True, timeout=120, env=env, **kw)


@pytest.fixture
def demo(tmp_path: Path) -> list:
    """`check` arguments: the demo mod (applies) and one that conflicts, on a local site."""
    make_mod(tmp_path / "mods", "demo")
    make_mod(tmp_path / "mods", "broken", patch="--- a/vllm/model_executor/layers/demo.py\n"
             "+++ b/vllm/model_executor/layers/demo.py\n@@ -1,2 +1,2 @@\n-no such line\n+x\n context\n")
    site = make_site(tmp_path / "site")
    return ["check", "--mods-dir", str(tmp_path / "mods"), "--vllm", f"dir:{site}"]


def test_exit_code_output_and_exit_handlers_survive_the_fast_exit(demo, tmp_path):
    done = program(*demo, "--json", cache=str(tmp_path / "cache"))
    assert done.returncode == 1, done.stderr  # a finding: the broken mod conflicts
    body, _, tail = done.stdout.rpartition("}\n")
    doc = json.loads(body + "}")  # everything printed arrived, then the handlers ran
    assert {r["mod"]: r["status"] for r in doc["results"]} == {"broken": "conflict", "demo": "ok"}
    assert sorted(tail.split()) == sorted(["handler", "ran", "finalizer", "ran"])
    ok = program(demo[0], "demo", *demo[1:], cache=str(tmp_path / "cache"))
    assert ok.returncode == 0 and "1 checked, 1 green" in ok.stdout, ok.stdout + ok.stderr


def test_bad_input_is_still_one_line_and_exit_2(tmp_path):
    done = program("check", "--mods-dir", str(tmp_path / "none"), cache=str(tmp_path / "cache"))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("sparkmods: error: ")


# A command whose code raises what nothing expects: a bug.
_BUGGY = """
import sys
import sparkmods.commands.check as command
def broken(args):
    raise KeyError("no such key")
command.run_check = broken
sys.argv = ["sparkmods", "check"]
from sparkmods.cli import entry
entry()
"""


@pytest.mark.parametrize("debug", [False, True])
def test_an_internal_error_is_one_line_saying_it_is_a_bug_and_exit_3(tmp_path, debug):
    """Distinct from 1 (a finding) and 2 (bad input); the traceback only with SPARKMODS_DEBUG=1."""
    env = {k: v for k, v in os.environ.items() if k != "SPARKMODS_DEBUG"}
    env.update({"SPARKMODS_CACHE_DIR": str(tmp_path / "cache")}, **({"SPARKMODS_DEBUG": "1"} if debug else {}))
    done = subprocess.run([sys.executable, "-c", _BUGGY], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 3 and done.stdout == "", done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith("sparkmods: internal error (a bug in sparkmods): KeyError: 'no such key'; please report")
    assert "SPARKMODS_DEBUG=1" in last
    if debug:
        assert "Traceback (most recent call last)" in done.stderr and "in broken" in done.stderr
    else:
        assert done.stderr.count("\n") == 1, done.stderr


def test_a_thread_still_running_is_waited_for(demo, tmp_path):
    done = program(*demo, thread=True, cache=str(tmp_path / "cache"))
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[-4:-2] == ["2 checked, 1 green, 1 not", "thread finished"], done.stdout  # then the handlers


def test_python_dash_m_sparkmods_ends_the_same_way(demo, tmp_path):
    done = subprocess.run([sys.executable, "-m", "sparkmods", *demo], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SPARKMODS_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 1 and done.stdout.splitlines()[-1] == "2 checked, 1 green, 1 not"


def test_the_collector_pause_nests_across_threads_and_restores_what_it_found():
    assert gc.isenabled()
    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with gcpause.paused():
            entered.set()
            release.wait(10)

    worker = threading.Thread(target=other)
    with gcpause.paused():
        assert not gc.isenabled()
        worker.start()
        assert entered.wait(10)
    assert not gc.isenabled()  # the other batch is still running
    release.set()
    worker.join(10)
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gcpause.paused():
        raise RuntimeError("a failed check")
    assert gc.isenabled()
    gc.disable()
    try:
        with gcpause.paused():
            pass
        assert not gc.isenabled()  # it was off before: left off
    finally:
        gc.enable()


def test_the_shared_fetch_pool_ends_and_a_later_fetch_starts_another():
    """cli.entry ends the idle fetch threads a check leaves (else the fast exit waits for them)."""
    from sparkmods.sources import http

    first = http.pool()
    assert first.submit(lambda: threading.current_thread().name).result().startswith("sparkmods-fetch")
    http.shutdown()
    assert not any(t.name.startswith("sparkmods-fetch") and t.is_alive() for t in threading.enumerate())
    second = http.pool()
    assert second is not first and second.submit(lambda: 7).result() == 7
    http.shutdown()
    http.shutdown()  # nothing left: a no-op
