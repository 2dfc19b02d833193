"""What the runtime probes and the tests that start them share (no tests here).

A probe is a script that a vLLM venv's python runs with a mod applied to an overlay site dir;
it prints one line `MARK {json}` with what it saw. The probe side uses LogLines, free_port and
emit; the pytest side uses run_job or read_report. Stdlib only: the probe's interpreter has
vLLM, not our test dependencies.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional

MARK = "PROBE-REPORT "


class LogLines(logging.Handler):
    """Collects the messages of the logger it is added to (the mod's one-line reports)."""

    def __init__(self, level: int = logging.INFO) -> None:
        super().__init__(level)
        self.lines: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def free_port() -> int:
    """A loopback port for vLLM's single-process distributed init."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def emit(report: Dict[str, Any]) -> None:
    print(MARK + json.dumps(report), flush=True)


def read_report(proc: "subprocess.CompletedProcess[str]", what: str) -> Dict[str, Any]:
    """The report of a finished probe; a failed assertion with its output tail otherwise."""
    lines = [line[len(MARK):] for line in proc.stdout.splitlines() if line.startswith(MARK)]
    assert proc.returncode == 0 and lines, f"probe failed on {what}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(lines[-1])


def run_job(env: Any, probe: Path, cases: List[Dict[str, Any]], tmp: Path, site: Optional[Path],
            extra_env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Run `probe JOB.json` under the vllmenv environment `env`, site (an overlay) first."""
    job = tmp / "job.json"
    job.write_text(json.dumps({"cases": cases}), encoding="utf-8")
    proc = env.run([str(probe), str(job)], pythonpath=site, timeout=900, **({"env": extra_env} if extra_env else {}))
    return read_report(proc, f"vLLM {env.version}")
