"""Build the image `sparkmods check --community` runs community mods in (sparkmods-sandbox:latest).

A Debian minbase rootfs made with debootstrap (needs root and a Debian mirror; no registry), with
python3, patch, git, curl and wget, vLLM's site-packages at the community image's path and its
WORKDIR. Prints the tag. The tests build the same image (tests/dockerimg.py).

    sudo .venv/bin/python ci/sandbox_image.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import docker

from dockerimg import ensure_sandbox_image

if __name__ == "__main__":
    print(ensure_sandbox_image(docker.from_env(timeout=300)))
