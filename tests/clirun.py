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


# Runs argv[2:] and writes its peak RSS (KiB) to argv[1]; exits with its exit code.
_MEASURE = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[2:]); "
            "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); "
            "sys.exit(code)")


def sparkmods_peak_rss(*args: str, env: Optional[Dict[str, str]] = None,
                       timeout: float = 60) -> "tuple[subprocess.CompletedProcess, int]":
    """(the finished process, its own peak RSS in KiB).

    Measured by a small Python in between, not by the test process: Linux carries the RSS
    high-water mark of a forked copy across exec, so a child forked from a pytest worker that
    holds torch would report the worker's size; and RUSAGE_CHILDREN of the worker itself is the
    largest child it ever waited for.
    """
    with tempfile.TemporaryDirectory() as tmp:
        peak_file = Path(tmp) / "peak"
        done = subprocess.run([sys.executable, "-c", _MEASURE, str(peak_file), str(SPARKMODS), *args],
                              env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout)
        return done, int(peak_file.read_text())


def one_line_error(done: subprocess.CompletedProcess, code: int = 2) -> str:
    """The single error line of a refused command (asserts the exit code, one line, no traceback)."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code, (done.returncode, done.stderr[-2000:])
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    return lines[0]
