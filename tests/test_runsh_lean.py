"""What run.sh may load: the standard library only (a container has nothing else), and nothing
that reaches the network; and how its Python ends (os._exit once the output is flushed)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Set

import pytest

from modfactory import ORIGINAL, TARGET, make_mod, make_site, make_template_mod, run_sh

# Modules that talk to the network (or exist for it): none of them is run.sh's business.
NETWORK = {"socket", "_socket", "ssl", "_ssl", "http", "urllib", "ftplib", "smtplib", "xmlrpc", "asyncio",
           "selectors"}


def imported(stderr: str) -> Set[str]:
    """The top-level names of the modules a run imported, from Python's -X importtime lines."""
    names = {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}
    return {name.split(".")[0] for name in names - {"imported package"}}  # the header line


def test_run_sh_imports_only_the_standard_library_and_nothing_for_the_network(tmp_path: Path) -> None:
    """As the launcher runs it (a mod with a workspace install and notes): the apply, the quick
    answer on the applied tree, and a revert."""
    mod = make_template_mod(tmp_path / "mods")
    site = make_site(tmp_path / "site")
    env = {"PYTHONPROFILEIMPORTTIME": "1", "WORKSPACE_DIR": str(tmp_path)}
    start = imported(subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], capture_output=True,
                                    text=True).stderr)  # the interpreter's own start-up (.pth files)
    allowed = set(sys.stdlib_module_names) | {"_sparkmods"} | start
    for args, expect in (((), "applied variant v1"), ((), "already applied (variant v1)"), (("revert",), "restored")):
        out = run_sh(mod, site, tmp_path, *args, env_extra=env)
        assert out.returncode == 0 and expect in out.stdout, out.stdout + out.stderr
        loaded = imported(out.stderr)
        # A name no module answers to is a probe that failed (copy.py's Jython `org.python.core`).
        other = {name for name in loaded - allowed if importlib.util.find_spec(name) is not None}
        assert "_sparkmods" in loaded and not other, sorted(other)
        assert not loaded & NETWORK, sorted(loaded & NETWORK)


@pytest.mark.parametrize("tree,code,line", [
    ({}, 0, "[demo] applied variant v1 to vLLM 0.19.1"),
    ({TARGET: ORIGINAL.replace("y = x * 2", "y = x * 3")}, 1, "[demo]   nothing was changed; pin a vLLM"),
])
def test_the_exit_skips_the_teardown_but_no_output_or_exit_code(tmp_path: Path, tree, code: int, line: str) -> None:
    """run.sh's Python ends with os._exit once its streams are flushed: every line reaches a
    file (block-buffered, unlike a terminal) and the exit code is the run's."""
    site = make_site(tmp_path / "site", files=tree)
    mod = make_mod(tmp_path / "mods")
    env = {"PATH": os.environ["PATH"], "PYTHON_ROOT": str(site), "SPARKMODS_PYTHON": sys.executable}
    with open(tmp_path / "out.txt", "w") as out:
        done = subprocess.run(["bash", str(mod / "run.sh")], cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
                              timeout=60)
    lines = (tmp_path / "out.txt").read_text().splitlines()
    assert done.returncode == code and any(text.startswith(line) for text in lines), lines
