"""Tensor parallel for the GPU end-to-end run: the flags every server gets, and a one-host Ray.

A two-Spark deployment runs the model split over two GPUs, either with vLLM's own worker
processes (`--distributed-executor-backend mp`) or over a Ray cluster (`ray`) that our
generated two-node script forms with `ray start --head` on the first node and `ray start
--address` on the others (tools/sparkmods/launch/standalone.py). On one host with two GPUs the
same two ranks run side by side: `RayHead` starts the head the way that script does (bound to
127.0.0.1 here, one node holding both GPUs), waits until Ray reports it alive, and gives the
servers RAY_ADDRESS so vLLM joins it instead of starting a private Ray; it stops that head after.

Ray is not among vLLM's requirements: carry it with `carry.py prepare --extra ray`.
With `nodes` = tp each rank is a node of its own instead (e2e_nodes.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from e2e_serve import NVLS_OFF
from procgroup import ProcessGroup
from sparkmods.launch.nodewords import RAY_ALIVE_NODES, RAY_EXECUTOR, RAY_HEAD, fill

EXECUTORS = ("mp", "ray")
RAY_START_TIMEOUT_S = 120.0
# The console scripts the launch script runs ("ray start", "vllm serve"), as module calls: a
# site filled by `pip install --target` has none (the calls are the wheels' entry points).
CONSOLE = {"ray": "from ray.scripts.scripts import main; main()",
           "vllm": "from vllm.entrypoints.cli.main import main; main()"}


@dataclass(frozen=True)
class Parallel:
    """How every server of a run is split: tp ranks, started by `executor`, over `nodes`
    (1: one process tree holding every GPU; tp: one node per rank, one GPU each)."""

    tp: int = 1
    executor: str = "mp"
    nodes: int = 1

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError(f"--tp must be at least 1, not {self.tp}")
        if self.executor not in EXECUTORS:
            raise ValueError(f"--executor must be one of {', '.join(EXECUTORS)}, not {self.executor!r}")
        if self.nodes not in (1, self.tp):
            raise ValueError(f"--nodes must be 1 or --tp ({self.tp}: one GPU per node), not {self.nodes}")

    def flags(self) -> list[str]:
        """vLLM serve flags; none for one GPU (what users run on one Spark). Over several nodes,
        the head's words of the generated launch script: the Ray executor named, mp left to
        vLLM (its default with --nnodes), the rank flags added per node (e2e_nodes.py)."""
        if self.tp == 1:
            return []
        if self.nodes > 1:
            return ["--tensor-parallel-size", str(self.tp), *(RAY_EXECUTOR if self.executor == "ray" else ())]
        return ["--tensor-parallel-size", str(self.tp), "--distributed-executor-backend", self.executor]

    @property
    def label(self) -> str:
        if self.tp == 1:
            return "one GPU"
        return f"TP {self.tp} ({self.executor})" if self.nodes == 1 else f"TP {self.tp}, {self.nodes} nodes ({self.executor})"


class RayHead:
    """A Ray head on this host for the run's servers (started only for executor 'ray'), in a
    process group of its own: stopping it ends that group, never Ray elsewhere on the host."""

    def __init__(self, python: str, site: Path, port: int, base_env: Mapping[str, str], log_path: Path) -> None:
        self.port = port
        self.env = env = {k: v for k, v in base_env.items() if k != "PYTHONPATH"}
        env.update(NVLS_OFF)  # Ray's workers (vLLM's ranks) inherit the head's environment
        env["PYTHONPATH"] = str(site)
        env["RAY_ADDRESS"] = f"127.0.0.1:{port}"
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        self.group = ProcessGroup("Ray head", console(python, fill(RAY_HEAD, head="127.0.0.1", ray_port=port)), env,
                                  log_path)

    def server_env(self) -> dict[str, str]:
        """What a server needs to join this head rather than start a Ray of its own."""
        return {"RAY_ADDRESS": self.env["RAY_ADDRESS"]}

    def start(self, timeout_s: float = RAY_START_TIMEOUT_S) -> None:
        """Start the head and wait until Ray counts one alive node; RuntimeError saying why not
        (the head is stopped again then)."""
        try:
            self.group.start_daemons("ray start --head", timeout_s)
        except RuntimeError:
            self.stop()
            raise
        deadline = time.monotonic() + timeout_s
        while True:
            alive = alive_nodes(self.group.command[0], self.env)
            if alive == "1":
                return
            if time.monotonic() >= deadline:
                self.stop()
                raise RuntimeError(f"Ray shows {alive or 'no'} alive node after {timeout_s:.0f} s")
            time.sleep(2)

    def stop(self) -> None:
        self.group.stop()


def console(python: str, argv: list[str]) -> list[str]:
    """argv of a console script (`ray ...`, `vllm ...`) as `python -c` of its entry point."""
    return [python, "-c", CONSOLE[argv[0]], *argv[1:]]


def alive_nodes(python: str, env: Mapping[str, str]) -> str:
    """How many nodes Ray counts alive, asked as the generated script's alive_ray_nodes() asks
    ('' when Ray does not answer)."""
    done = subprocess.run([python, "-c", RAY_ALIVE_NODES], env=dict(env), capture_output=True, text=True,
                          check=False)
    lines = done.stdout.strip().splitlines()
    return lines[-1] if lines else ""


def importable(python: str, site: Path, module: str) -> bool:
    """Whether `python`, with `site` on its path, imports `module`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    return subprocess.run([python, "-c", f"import {module}"], env=env, capture_output=True, check=False).returncode == 0


def smi_fields(field: str) -> list[str] | None:
    """One nvidia-smi field of each GPU this process may use (CUDA_VISIBLE_DEVICES honoured: a run
    beside another on a two-GPU machine reads its own GPU); None where there is no nvidia-smi."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    try:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits",
                               *(["-i", visible] if visible else [])], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []


def smi_numbers(fields: str) -> list[float] | None:
    """The numeric nvidia-smi fields (comma-separated, e.g. "clocks.sm,power.draw") of this run's
    first GPU, read once; None where nvidia-smi answers nothing or a field is not a number."""
    line = (smi_fields(fields) or [""])[0]
    try:
        values = [float(v) for v in line.split(",")]
    except ValueError:
        return None
    return values if len(values) == len(fields.split(",")) else None


def gpus_visible(python: str = sys.executable) -> int:
    """CUDA devices torch sees in a fresh interpreter (0 where torch or CUDA is missing)."""
    done = subprocess.run([python, "-c", "import torch; print(torch.cuda.device_count())"],
                          capture_output=True, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    return int(lines[-1]) if done.returncode == 0 and lines and lines[-1].isdigit() else 0
