"""The real mods of mods/ under test: the module a mod's new-file patch creates, imported without
vLLM, and `sparkmods check` over every release from 0.18.0 with every hunk exact."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from scriptload import load_script
from sparkmods.runtime.udiff import parse_patch


def load_patched_module(patch: Path, tmp: Path, name: str) -> ModuleType:
    """Import the file a new-file patch creates."""
    (fp,) = parse_patch(patch.read_text(encoding="utf-8"))
    assert fp.is_new
    path = tmp / f"{name}.py"
    path.write_text("\n".join(line for h in fp.hunks for line in h.new_lines) + "\n", encoding="utf-8")
    return load_script(path, name)


def assert_all_exact(mod_dir: Path) -> None:
    """`sparkmods check --json` over every release >= 0.18.0: the mod is ok, every hunk exact."""
    sparkmods = Path(sys.executable).parent / "sparkmods"
    proc = subprocess.run([str(sparkmods), "check", "--json", "--mods-dir", str(mod_dir.parent), mod_dir.name,
                           "--vllm", ">=0.18.0"], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    mod, doc = mod_dir.name, json.loads(proc.stdout)
    results = [r for r in doc["results"] if r["mod"] == mod]
    assert len(results) >= 23, [r["vllm"] for r in results]  # 0.18.0 ... 0.33.0 at least
    assert {r["status"] for r in results} == {"ok"}, [(r["vllm"], r["status"]) for r in results]
    outcomes = {h["outcome"] for r in results for f in r["files"] for h in f["hunks"]}
    assert outcomes == {"exact"}, outcomes
