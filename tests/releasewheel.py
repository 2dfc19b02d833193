"""A real vLLM wheel from PyPI for tests that read one whole (pip download, kept in the test
cache: $SPARKMODS_CACHE_DIR or ~/.cache/sparkmods, folder test-wheels/)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def vllm_wheel(version: str) -> Path:
    """The x86_64 wheel of vLLM `version`, downloaded once."""
    cache = Path(os.environ.get("SPARKMODS_CACHE_DIR") or Path.home() / ".cache" / "sparkmods") / "test-wheels"
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"vllm-{version}-*x86_64.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--platform", "manylinux_2_31_x86_64", "--python-version", "3.12",
                        f"vllm=={version}", "-d", str(cache)], check=True)
        found = sorted(cache.glob(f"vllm-{version}-*x86_64.whl"))
    return found[-1]
