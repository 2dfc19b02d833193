"""Turn a `--int4` / `--fp8` / `--source` argument into a local checkpoint folder.

A local directory is used as it is. Anything shaped like `owner/name` that is not a
directory is a Hugging Face repo id, fetched (or found in the cache) with huggingface_hub,
an optional dependency (`pip install 'sparkmods[hf]'`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from sparkmods.errors import SparkmodsError

REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def is_repo_id(spec: str) -> bool:
    return bool(REPO_ID.match(spec)) and not Path(spec).expanduser().exists()


def resolve(spec: str, allow_patterns: Sequence[str] | None = None) -> Path:
    """The local folder for `spec`; for a repo id, download only files matching the patterns."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise SparkmodsError(f"{spec}: not a directory (pass the checkpoint folder)")
    if not REPO_ID.match(spec):
        raise SparkmodsError(f"{spec}: no such directory, and not a Hugging Face repo id (owner/name)")
    try:
        import huggingface_hub
    except ImportError:
        raise SparkmodsError(
            f"{spec}: no such directory; to use it as a Hugging Face repo id install the extra "
            "(pip install 'sparkmods[hf]'), or pass a local folder"
        ) from None
    try:
        return Path(huggingface_hub.snapshot_download(repo_id=spec, allow_patterns=allow_patterns))
    except Exception as exc:  # the hub raises many types; all mean "could not get it"
        first = (str(exc).strip().splitlines() or [""])[0]
        raise SparkmodsError(f"{spec}: cannot fetch from Hugging Face: {type(exc).__name__}: {first}") from exc
