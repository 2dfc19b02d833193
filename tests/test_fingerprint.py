"""Fingerprints cover what decides a result: a docstring or comment edit in the runtime (and the
`sparkmods sync` after it) leaves the committed matrix current; a change of behaviour does not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from modfactory import make_mod
from sparkmods.checking import fingerprints
from sparkmods.checking.fingerprints import behaviour, mod_fingerprint

REPO = Path(__file__).resolve().parents[1]

CODE = textwrap.dedent('''\
    """Module docstring."""

    import os  # a comment

    TEXT = """kept
      # not a comment, and the blank line below is the string's

    """


    class A:
        """Class docstring,
        on two lines."""

        def f(self) -> str:
            "a one-line docstring"
            f"{os.getcwd()}"  # an f-string statement runs code
            return TEXT   # trailing spaces and a comment
    ''')


def test_behaviour_drops_comments_docstrings_and_blank_lines_only() -> None:
    assert behaviour(CODE) == textwrap.dedent('''\
        import os
        TEXT = """kept
          # not a comment, and the blank line below is the string's

        """
        class A:
            def f(self) -> str:
                f"{os.getcwd()}"
                return TEXT
        ''')


@pytest.mark.parametrize("edit", [
    lambda text: text.replace("Module docstring.", "Module docstring, edited."),
    lambda text: text.replace("# a comment", "# another comment"),
    lambda text: text.replace("\n\n\nclass A:", "\n\nclass A:"),
])
def test_what_does_nothing_leaves_the_behaviour(edit) -> None:
    assert edit(CODE) != CODE and behaviour(edit(CODE)) == behaviour(CODE)


@pytest.mark.parametrize("edit", [
    lambda text: text.replace("return TEXT", "return TEXT + 'x'"),
    lambda text: text.replace("the blank line below is the string's\n\n", "the blank line below is the string's\n"),
    lambda text: text.replace('f"{os.getcwd()}"', 'f"{os.getpid()}"'),
])
def test_a_change_of_behaviour_changes_it(edit) -> None:
    assert behaviour(edit(CODE)) != behaviour(CODE)


def test_a_mod_fingerprint_covers_manifest_patches_and_installs_not_other_files(tmp_path: Path) -> None:
    mod = make_mod(tmp_path / "mods")
    first = mod_fingerprint(mod)
    (mod / "README.md").write_text("a readme\n")
    (mod / "run.sh").write_text("edited by hand\n")  # a generated copy: `sync --check` guards it
    (mod / "mod.toml").write_text((mod / "mod.toml").read_text() + "# a comment\n")
    assert mod_fingerprint(mod) == first
    (mod / "mod.toml").write_text((mod / "mod.toml").read_text().replace("a demo mod", "a demo"))
    assert mod_fingerprint(mod) != first
    second = mod_fingerprint(mod)
    (mod / "patches" / "v1" / "demo.patch").write_text((mod / "patches" / "v1" / "demo.patch").read_text() + "\n")
    assert mod_fingerprint(mod) != second


def _sparkmods(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root / "tools")}
    return subprocess.run([sys.executable, "-m", "sparkmods", *args], cwd=root, env=env, text=True,
                          capture_output=True, timeout=300)


def test_a_runtime_docstring_edit_and_sync_leave_the_committed_matrix_current(tmp_path: Path) -> None:
    """The repository's tools, mods and matrix (its committed GPU results linked): a docstring
    and a comment edited in the runtime, `sparkmods sync` rewrites every mod's _sparkmods.py,
    and `sparkmods matrix --check` stays green; a code edit makes it stale."""
    root = tmp_path / "repo"
    shutil.copytree(REPO / "tools" / "sparkmods", root / "tools" / "sparkmods",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "mods", root / "mods", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "matrix", root / "matrix")
    (root / "ci" / "bench").mkdir(parents=True)
    (root / "ci" / "bench" / "results").symlink_to(REPO / "ci" / "bench" / "results")
    check = ["matrix", "--check", "--mods-dir", str(root / "mods"), "--out", str(root / "matrix")]
    assert _sparkmods(root, *check).returncode == 0

    engine = root / "tools" / "sparkmods" / "runtime" / "engine.py"
    text = engine.read_text()
    edited = text.replace('"""The patch engine:', '"""The patch engine (docstring edited):', 1)
    edited = edited.replace("# Hunk outcomes.", "# Hunk outcomes (comment edited).", 1)
    assert edited.count("edited") == 2
    engine.write_text(edited)
    synced = _sparkmods(root, "sync", "--mods-dir", str(root / "mods"))
    assert synced.returncode == 0 and "wrote _sparkmods.py" in synced.stdout, synced.stdout + synced.stderr
    done = _sparkmods(root, *check)
    assert done.returncode == 0, done.stdout + done.stderr

    engine.write_text(edited.replace('PACKAGE = "vllm"', 'PACKAGE = "vllm"  \nPACKAGE_ALIAS = PACKAGE', 1))
    assert _sparkmods(root, "sync", "--mods-dir", str(root / "mods")).returncode == 0
    stale = _sparkmods(root, *check)
    assert stale.returncode == 1 and "changed since the matrix was generated" in stale.stdout, stale.stdout


def test_a_module_s_behaviour_digest_is_kept_by_its_bytes(tmp_path: Path, monkeypatch) -> None:
    """The on-disk memo: the same bytes read back the stored digest, new bytes are tokenized
    again, and an entry that is not a digest is made again."""
    monkeypatch.setenv("SPARKMODS_CACHE_DIR", str(tmp_path / "cache"))
    module = tmp_path / "m.py"
    module.write_text("x = 1  # one\n")
    fingerprints.file_behaviour.cache_clear()
    first = fingerprints.file_behaviour(module)
    assert first == __import__("hashlib").sha256(behaviour(module.read_text()).encode()).digest()
    [entry] = (tmp_path / "cache" / fingerprints.BEHAVIOUR_CACHE).iterdir()
    entry.write_bytes(b"\x01" * 32)  # what is stored is what a later run reads
    fingerprints.file_behaviour.cache_clear()
    assert fingerprints.file_behaviour(module) == b"\x01" * 32
    module.write_text("x = 2  # one\n")
    fingerprints.file_behaviour.cache_clear()
    assert fingerprints.file_behaviour(module) not in (first, b"\x01" * 32)
    entry.write_bytes(b"short")
    module.write_text("x = 1  # one\n")
    fingerprints.file_behaviour.cache_clear()
    assert fingerprints.file_behaviour(module) == first
    fingerprints.file_behaviour.cache_clear()
