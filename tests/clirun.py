"""Run the real `sparkmods` command in a subprocess with a wall-clock limit, and check that a
refusal is what every error must be: the documented exit code and one line on stderr.

A subprocess, not main() in-process: the hostile-input tests must prove "no hang" (a FIFO, a
trickling server) and "no traceback" on the real entry point, stderr included.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, Optional

SPARKMODS = Path(sys.executable).with_name("sparkmods")


def sparkmods(*args: str, env: Optional[Dict[str, str]] = None, timeout: float = 60,
              cwd: Optional[Path] = None) -> "tuple[subprocess.CompletedProcess, float]":
    """(the finished process, seconds it took); a hang fails the test through TimeoutExpired."""
    started = time.monotonic()
    done = subprocess.run([str(SPARKMODS), *args], env={**os.environ, **(env or {})}, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - started


def sparkmods_peak_rss(*args: str, env: Optional[Dict[str, str]] = None,
                       timeout: float = 60) -> "tuple[subprocess.CompletedProcess, int]":
    """(the finished process, its own peak RSS in KiB), from wait4 on that one child.

    Not getrusage(RUSAGE_CHILDREN): that is the largest of every child the test process ever
    waited for, so an earlier big subprocess in the same pytest worker would fail the bound.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([str(SPARKMODS), *args], env={**os.environ, **(env or {})}, stdout=out, stderr=err)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        assert proc.returncode != -9, f"sparkmods {' '.join(args)} ran past {timeout} s"
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out.read().decode(), err.read().decode())
    return done, usage.ru_maxrss


def one_line_error(done: subprocess.CompletedProcess, code: int = 2) -> str:
    """The single error line of a refused command (asserts the exit code, one line, no traceback)."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code, (done.returncode, done.stderr[-2000:])
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    return lines[0]
