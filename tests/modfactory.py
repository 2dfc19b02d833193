"""Build small mods and vLLM site-packages trees for tests (the runtime's real code runs on them),
and run a mod's run.sh on such a tree."""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, Optional

from sparkmods.sync import sync

TARGET = "vllm/model_executor/layers/demo.py"
ORIGINAL = textwrap.dedent('''\
    import torch


    class Demo:
        def __init__(self, size: int) -> None:
            self.size = size

        def forward(self, x):
            y = x * 2
            return y
    ''')
PATCHED = ORIGINAL.replace("        y = x * 2\n", "        y = x * 2\n        y = y + 1  # demo mod\n")
assert PATCHED != ORIGINAL


def make_site(root: Path, version: str = "0.19.1", files: Optional[Dict[str, str]] = None) -> Path:
    """A site-packages folder holding vllm/ and its dist-info, like a pip install."""
    root.mkdir(parents=True, exist_ok=True)
    tree = {"vllm/__init__.py": "", TARGET: ORIGINAL}
    tree.update(files or {})
    for rel, text in tree.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    dist = root / f"vllm-{version}.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n\nbody\n")
    return root


def unified(path: str, old: str, new: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}"))


def make_mod(mods: Path, name: str = "demo", toml_extra: str = "", vllm: str = ">=0.19.0,<0.21",
             verified: str = '["0.19.1"]', patch: Optional[str] = None) -> Path:
    """A mod folder with one variant patching TARGET, synced like a real mod."""
    mod = mods / name
    (mod / "patches" / "v1").mkdir(parents=True, exist_ok=True)
    (mod / "patches" / "v1" / "demo.patch").write_text(patch if patch is not None else unified(TARGET, ORIGINAL, PATCHED))
    (mod / "mod.toml").write_text(textwrap.dedent(f'''\
        schema = 1
        name = "{name}"
        summary = "a demo mod"

        [[variant]]
        label = "v1"
        vllm = "{vllm}"
        patches = ["patches/v1/demo.patch"]
        verified = {verified}
        ''') + toml_extra)
    sync(mod)
    return mod


def edit_runtime(mod: Path, module: str, edit) -> None:
    """Change one runtime module inside the mod's generated _sparkmods.py: `edit(text) -> text`
    applied to that module's source ("boot": the top of the file, which is boot.py)."""
    path = mod / "_sparkmods.py"
    data = path.read_text()
    if module == "boot":
        head, sep, rest = data.partition("\n\nSOURCES = {\n")
        path.write_text(edit(head) + sep + rest)
        return
    opening = f"    {module!r}: r'''"
    start = data.index(opening) + len(opening)
    end = data.index("''',\n", start)
    path.write_text(data[:start] + edit(data[start:end]) + data[end:])


def make_template_mod(mods: Path) -> Path:
    """Mod `tmpl`: the demo patch plus a workspace install (files/t.jinja) and notes, like chat-template."""
    mod = make_mod(mods, name="tmpl", toml_extra='install = [{ src = "files/t.jinja", dest = "workspace:t.jinja" }]\n'
                   'notes = "Add to vllm serve: --chat-template t.jinja"\n')
    (mod / "files").mkdir()
    (mod / "files" / "t.jinja").write_text("{{ messages }}")
    sync(mod)
    return mod


def run_sh(mod: Path, site: Path, cwd: Path, *args: str, env_extra=None) -> subprocess.CompletedProcess:
    """The mod's run.sh through bash on the site tree (PYTHON_ROOT), this interpreter as its python."""
    env = {"PATH": os.environ["PATH"], "PYTHON_ROOT": str(site), "SPARKMODS_PYTHON": sys.executable}
    env.update(env_extra or {})
    return subprocess.run(["bash", str(mod / "run.sh"), *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=60)
