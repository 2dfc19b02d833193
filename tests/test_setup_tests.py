"""ci/setup-tests.sh, run for real against stand-ins for what it drives: `.venv/bin/pip` records
its arguments, `.venv/bin/python` is this interpreter with a stand-in `torch` module first on its
path, and PyTorch's CPU index is a loopback server or a port where nothing listens. It must go
on at once when the CPU index does not answer, and its last line must say the torch build that
is there (CPU or CUDA), never the one it hoped for.
"""

from __future__ import annotations

import http.server
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import pytest

REPO = Path(__file__).resolve().parent.parent
PIN = re.search(r'"(torch==[^"]+)"', (REPO / "pyproject.toml").read_text()).group(1)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The script and pyproject.toml, with the stand-in .venv (pip logs to pip.log)."""
    (tmp_path / "ci").mkdir()
    shutil.copy2(REPO / "ci" / "setup-tests.sh", tmp_path / "ci" / "setup-tests.sh")
    shutil.copy2(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    bin_dir, fake = tmp_path / ".venv" / "bin", tmp_path / "fake-site"
    bin_dir.mkdir(parents=True)
    fake.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nPYTHONPATH="{fake}" exec "{sys.executable}" "$@"\n')
    (bin_dir / "pip").write_text(f'#!/bin/sh\necho "$*" >>"{tmp_path}/pip.log"\n')
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    return tmp_path


def installed_torch(checkout: Path, version: str, cuda: Optional[str]) -> None:
    (checkout / "fake-site" / "torch").mkdir()
    (checkout / "fake-site" / "torch" / "__init__.py").write_text(
        f"__version__ = {version!r}\nclass version:\n    cuda = {cuda!r}\n")


def run(checkout: Path, index: str) -> Tuple[List[str], List[str], float]:
    """(output lines, pip calls, seconds)."""
    started = time.monotonic()
    done = subprocess.run(["bash", str(checkout / "ci" / "setup-tests.sh")], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "SPARKMODS_TORCH_INDEX": index})
    assert done.returncode == 0, done.stdout + done.stderr
    log = checkout / "pip.log"
    calls = log.read_text().splitlines() if log.exists() else []
    return done.stdout.splitlines(), calls, time.monotonic() - started


@pytest.fixture
def cpu_index() -> Iterator[str]:
    """A loopback index that answers every GET."""
    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"<html></html>")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
    server.shutdown()


@pytest.mark.skipif(sys.platform != "linux", reason="the CPU index is asked on Linux only")
def test_an_unreachable_cpu_index_is_passed_at_once_and_the_build_is_reported(checkout: Path) -> None:
    installed_torch(checkout, PIN.split("==")[1], "13.0")  # what PyPI's build would be
    lines, calls, seconds = run(checkout, "http://127.0.0.1:9/whl/cpu")
    assert seconds < 15, seconds
    assert lines[0].startswith("setup-tests: note: http://127.0.0.1:9/whl/cpu does not answer (")
    assert lines[0].endswith(f"); {PIN} comes from the default index")
    assert calls == ["install -q -e .[test,kernels]"]  # no pip run against the unreachable index
    assert lines[-1] == f"setup-tests: ready: torch {PIN.split('==')[1]} (CUDA 13.0 build)"


@pytest.mark.skipif(sys.platform != "linux", reason="the CPU index is asked on Linux only")
def test_a_cpu_build_from_anywhere_is_reported_as_one(checkout: Path, cpu_index: str) -> None:
    installed_torch(checkout, PIN.split("==")[1] + "+cpu", None)
    lines, calls, _ = run(checkout, cpu_index)
    assert lines[0] == f"setup-tests: installing {PIN} (CPU build) from {cpu_index}"
    assert calls == [f"install -q --retries 1 --timeout 30 {PIN} --index-url {cpu_index}", "install -q -e .[test,kernels]"]
    assert lines[-1] == f"setup-tests: ready: torch {PIN.split('==')[1]}+cpu (CPU build)"
    assert "CUDA" not in "\n".join(lines)
