#!/usr/bin/env python3
"""Write patches/common/turboquant_files.patch: the mod's Python files as new-file hunks.

Why a generated patch: the mod runtime installs code into vLLM through patches (an `install`
entry can only write into $WORKSPACE_DIR), while the modules are easier to read, test and
import from tests as plain files under files/. This script is the one way the patch is made, and
tests/test_mod_turboquant.py fails when the patch and files/ differ, so they never drift.

    python3 mods/turboquant/make_patches.py          # rewrite the patch
    python3 mods/turboquant/make_patches.py --check  # exit 1 if it is out of date

Stdlib only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Tuple

MOD_DIR = Path(__file__).resolve().parent
PATCH = MOD_DIR / "patches" / "common" / "turboquant_files.patch"
# files/ source -> where vLLM imports it from (site-packages relative)
FILES: Tuple[Tuple[str, str], ...] = (
    ("files/tq_format.py", "vllm/v1/attention/ops/sparkmods_tq_format.py"),
    ("files/tq_triton.py", "vllm/v1/attention/ops/sparkmods_tq_triton.py"),
    ("files/sparkmods_turboquant.py", "vllm/v1/attention/backends/sparkmods_turboquant.py"),
    # also embedded in int8-lm-head's patch (ci/bench/benchlib/int8_lm_head_kernel.py): the fitting rule and the tune table
    ("files/sparkmods_kerneltune.py", "vllm/v1/attention/ops/sparkmods_kerneltune.py"),
)


def new_file_hunk(dest: str, text: str) -> str:
    """A unified diff creating `dest` with `text` (which must end with a newline)."""
    if not text.endswith("\n"):
        raise ValueError(f"{dest}: the source must end with a newline")
    lines: List[str] = text.splitlines(keepends=True)
    body = "".join("+" + line for line in lines)
    return f"--- /dev/null\n+++ b/{dest}\n@@ -0,0 +1,{len(lines)} @@\n{body}"


def render(mod_dir: Path = MOD_DIR) -> str:
    """The patch text for the current files/."""
    return "".join(new_file_hunk(dest, (mod_dir / src).read_text(encoding="utf-8")) for src, dest in FILES)


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the patch differs from files/")
    args = parser.parse_args(argv)
    try:
        text = render()
    except (OSError, ValueError) as exc:
        print(f"make_patches: {exc}", file=sys.stderr)
        return 2
    current = PATCH.read_text(encoding="utf-8") if PATCH.is_file() else None
    if args.check:
        if current != text:
            print(f"{PATCH.relative_to(MOD_DIR)} is out of date: run python3 {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    PATCH.parent.mkdir(parents=True, exist_ok=True)
    PATCH.write_text(text, encoding="utf-8")
    print(f"wrote {PATCH.relative_to(MOD_DIR)} ({len(FILES)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
