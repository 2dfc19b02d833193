"""A command in a process group of its own, stopped as a whole: how the end-to-end run starts
and ends Ray nodes and headless ranks without touching anything else on the host.

`ray start` leaves its daemons (GCS, raylet, workers) in the caller's process group, so the
group is the node. Ray's own `ray stop` kills every process on the host whose name looks like
Ray's, which on a shared machine includes other people's clusters and Ray inside containers
(a container's processes are visible to the host).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from e2e_serve import STOP_GRACE_S

GROUP_STOP_GRACE_S = 5.0  # then SIGKILL: Ray's daemons ignore SIGTERM for a while


@dataclass
class ProcessGroup:
    """`command` with `env`, output appended to `log_path`, in a new session (its own group)."""

    name: str
    command: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def start_daemons(self, what: str, timeout_s: float) -> None:
        """Start the command (`what`, e.g. "ray start") and wait for it to end, leaving what it
        started running in the group; RuntimeError with the group's name, what, and the command's
        last line of output if it failed, or when it is still running after timeout_s (the group
        is stopped then)."""
        self.start()
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            raise RuntimeError(f"{self.name}: {what} did not end within {timeout_s:.0f} s; stopped") from None
        if code != 0:
            said = self.log_path.read_text(errors="replace").strip().splitlines() or ["no output"]
            raise RuntimeError(f"{self.name}: {what} failed (exit {code}): {said[-1][:200]}")

    def ended(self) -> int | None:
        """The exit code of the command itself once it ended, else None."""
        return None if self.proc is None else self.proc.poll()

    def alive(self) -> bool:
        """Whether any process of the group is left (the command, or the daemons it started)."""
        if self.proc is None:
            return False
        self.proc.poll()  # reaps the command, so that a zombie does not count
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def stop(self, grace_s: float = GROUP_STOP_GRACE_S) -> None:
        """SIGTERM to the group, SIGKILL to what is left after grace_s."""
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, STOP_GRACE_S)):
            if not self.alive():
                return
            assert self.proc is not None
            os.killpg(self.proc.pid, sig)
            end = time.monotonic() + wait_s
            while self.alive() and time.monotonic() < end:
                time.sleep(0.2)
