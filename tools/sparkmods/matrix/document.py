"""The matrix document and its files: one shape for ours (build.py) and the community
matrix (community/cli.py), one way to render it and to write it."""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from sparkmods import __version__
from sparkmods.checking.fingerprints import checker_fingerprint
from sparkmods.errors import SparkmodsError
from sparkmods.matrix.render import LEGEND, to_markdown, to_svg
from sparkmods.outputfile import write_atomic

SCHEMA = 1
TIMESTAMP_KEY = "generated_at"
JSON_NAME, MD_NAME, SVG_NAME = "matrix.json", "MATRIX.md", "matrix.svg"


def document(sources: Sequence, mods: List[dict], cells: List[dict], **extra: dict) -> dict:
    """The document for cells of mods on sources (oldest first), stamped now; extra: further
    top-level sections (the community matrix's `community`)."""
    return {
        "schema": SCHEMA,
        "generated_by": f"sparkmods {__version__}",
        "checker": checker_fingerprint(),
        TIMESTAMP_KEY: _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z"),
        **extra,
        "releases": [{"vllm": s.version, "target": s.label, "commit": s.commit, "wheel_sha256": s.sha256}
                     for s in sources],
        "mods": mods,
        "cells": cells,
    }


def rendered(doc: dict, legend: Dict[str, Tuple[str, str, str]] = LEGEND) -> Dict[str, str]:
    """The matrix files, by name: the document as JSON, Markdown and SVG."""
    return {JSON_NAME: json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False) + "\n",
            MD_NAME: to_markdown(doc, legend), SVG_NAME: to_svg(doc, legend)}


def folder(out: Path) -> Path:
    """out, refused before any work when something other than a folder is there."""
    if os.path.lexists(out) and not out.is_dir():
        raise SparkmodsError(f"--out {out}: not a folder; name the folder to write the matrix files in")
    return out


def write_all(out: Path, files: Dict[str, str]) -> None:
    """Each file written into the folder out (created when missing), each replaced atomically."""
    try:
        folder(out).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SparkmodsError(f"--out {out}: cannot create the folder ({exc.strerror})") from None
    for name, text in files.items():
        write_atomic(out / name, text)


def read(path: Path) -> Optional[dict]:
    """The document at path, None when there is none (invalid JSON is a one-line error)."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise SparkmodsError(f"{path}: not valid JSON ({exc})") from None
