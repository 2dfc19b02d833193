"""Serving side of the GPU end-to-end run: vLLM overlays, mods by their own run.sh, the server.

- `overlay(site, dest)`: a private copy of vLLM made of hardlinks (vllm/ and its dist-info).
  The mods write atomically (temp file + rename), which replaces a link and leaves the file in
  the pristine site alone, so every server of a run starts from the same untouched vLLM.
- `apply_mod(...)`: the mod's own `run.sh`, exactly as the launcher runs it (PYTHON_ROOT names
  the site it patches, WORKSPACE_DIR receives installed files such as the chat template).
- `Server`: `python3 -m vllm.entrypoints.openai.api_server` (the OpenAI server `vllm serve`
  runs) in its own process group, with its log in a file, /health polled until a deadline,
  JSON requests, and a stop that ends the whole group (vLLM's engine is a child process).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

SERVED_NAME = "tiny-qwen35"
START_DEADLINE_S = 300.0
STOP_GRACE_S = 20.0
# NVLink multicast stays off in every process we start (NCCL, PyTorch symmetric memory and
# NVSHMEM): on the lent multi-GPU hosts a program that uses it can take the host's GPUs out of
# service. vLLM's ranks and Ray's workers inherit it from the server and the Ray head.
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# Environment of every server (../shared/docs/gpu.md): no FlashInfer sampler, offline, no stats.
SERVER_ENV = {
    **NVLS_OFF,
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    # DeepGEMM (Hopper only; a DGX Spark's sm_121 never uses it) JIT-compiles and warms up
    # 344 block-FP8 shapes at start-up: 4-5 minutes on an H200 for a 40 MB model.
    "VLLM_USE_DEEP_GEMM": "0",
    "VLLM_MOE_USE_DEEP_GEMM": "0",
}
# Flags of every server. --enforce-eager: no torch.compile and no CUDA-graph capture, which is
# most of a tiny model's start-up; the figures are sanity checks, not speed claims (ServeMode
# drops it for a run that checks the mods' kernels inside captured graphs, as a server runs them).
# --language-model-only: the checkpoint has no vision weights (tiny_qwen35.py).
# gdn_prefill_backend triton: vLLM 0.21 would pick FlashInfer's DeltaNet prefill on Hopper.
BASE_FLAGS = (
    "--dtype", "bfloat16", "--max-model-len", "2048", "--max-num-seqs", "16",
    "--gpu-memory-utilization", "0.30", "--enforce-eager", "--language-model-only", "--seed", "0",
    "--return-tokens-as-token-ids", "--additional-config", json.dumps({"gdn_prefill_backend": "triton"}),
)
# Several runs sharing one GPU (`e2e.py --share-gpu`): a fixed KV cache instead of a share of the
# memory vLLM profiles, since vLLM's profiling reads the GPU's free memory, which the other
# servers change as they start and stop (it then refuses to start). The TurboQuant capacity
# check still compares tokens held in the same bytes.
SHARED_GPU_FLAGS = ("--gpu-memory-utilization", "0.10", "--kv-cache-memory-bytes", str(2 << 30))


@dataclass(frozen=True)
class ServeMode:
    """How every server of a run starts: `shared`, the GPU is shared with other runs (a fixed KV
    cache); `eager`, --enforce-eager (False: torch.compile and CUDA graphs, as served)."""

    shared: bool = False
    eager: bool = True


class ServeError(RuntimeError):
    """The server did not come up, or a request failed; the message says which and where."""


def overlay(site: Path, dest: Path) -> Path:
    """Hardlink site's vllm/ and vllm-*.dist-info into dest (replaced); returns dest."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    sources = [site / "vllm", *sorted(site.glob("vllm-*.dist-info"))]
    if not (site / "vllm").is_dir():
        raise ServeError(f"{site}: no vllm/ folder here; pass the site-packages folder vLLM is installed in")
    for src in sources:
        shutil.copytree(src, dest / src.name, copy_function=os.link, symlinks=True)
    return dest


def apply_mod(mod_dir: Path, site: Path, workspace: Path, python: str) -> subprocess.CompletedProcess:
    """Run mod_dir/run.sh on the vLLM in site, as launch-cluster.sh --apply-mod does."""
    workspace.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHON_ROOT": str(site), "WORKSPACE_DIR": str(workspace), "SPARKMODS_PYTHON": python}
    return subprocess.run(["bash", str(mod_dir / "run.sh")], cwd=workspace, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_command(python: str, model: Path, port: int, extra: Sequence[str], mode: ServeMode = ServeMode()) -> list[str]:
    """The full command line of one server."""
    flags = list(BASE_FLAGS)
    if mode.shared:
        at = flags.index("--gpu-memory-utilization")
        flags[at:at + 2] = SHARED_GPU_FLAGS
    if not mode.eager:
        flags.remove("--enforce-eager")
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
            *flags, *extra]


def server_env(pythonpath: Sequence[Path], base: Mapping[str, str]) -> dict[str, str]:
    """base plus SERVER_ENV, with PYTHONPATH = the given folders (overlay before the site)."""
    env = {k: v for k, v in base.items() if k != "PYTHONPATH"}
    env.update(SERVER_ENV)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    return env


@dataclass
class Server:
    """One vLLM OpenAI server process group and its log file."""

    name: str
    command: list[str]
    env: dict[str, str]
    log_path: Path
    port: int
    proc: subprocess.Popen | None = None
    started_s: float = 0.0
    start_seconds: float | None = None
    exit_code: int | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:  # after the run.sh output e2e wrote there
            self.started_s = time.monotonic()
            self.proc = subprocess.Popen(self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_healthy(self, deadline_s: float = START_DEADLINE_S) -> bool:
        """True once /health answers 200; False when the process exits or the deadline passes."""
        assert self.proc is not None
        end = self.started_s + deadline_s
        while time.monotonic() < end:
            code = self.gone()
            if code is not None:
                self.exit_code = code
                return False
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as answer:
                    if answer.status == 200:
                        self.start_seconds = round(time.monotonic() - self.started_s, 1)
                        return True
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(1.0)
        return False

    def gone(self) -> int | None:
        """The exit code that ends the wait for health (the server's own; a two-node server
        also ends it when its other node's processes are gone), else None."""
        assert self.proc is not None
        return self.proc.poll()

    def log_text(self) -> str:
        return self.log_path.read_bytes().decode("utf-8", errors="replace") if self.log_path.exists() else ""

    def get(self, path: str) -> str:
        with urllib.request.urlopen(self.url + path, timeout=60) as answer:
            return answer.read().decode("utf-8", errors="replace")

    def post(self, path: str, payload: Mapping[str, Any], timeout: float = 120) -> dict:
        """POST JSON, return the JSON answer; a non-2xx answer is a ServeError with its body."""
        request = urllib.request.Request(self.url + path, data=json.dumps(payload).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            body = exc.read().decode("utf-8", errors="replace")[:500]
            raise ServeError(f"{self.name}: POST {path} -> HTTP {exc.code}: {body}") from None

    def stop(self) -> None:
        """SIGTERM the process group, then SIGKILL what is left after a grace period."""
        if self.proc is None or self.proc.poll() is not None:
            if self.proc is not None:
                self.exit_code = self.proc.returncode
            return
        pgid = os.getpgid(self.proc.pid)
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(timeout=STOP_GRACE_S)
        try:
            os.killpg(pgid, signal.SIGKILL)  # the engine core may outlive the API process
        except ProcessLookupError:
            pass
        self.exit_code = self.proc.returncode
