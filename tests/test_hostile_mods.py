"""Malformed and hostile mods: one line naming the file, exit 2, nothing written, never a hang.

Each case runs the real run.sh in a subprocess (and `sparkmods check` where the host reads the
same input). "Nothing written" means the vLLM tree is byte-identical afterwards and no state
folder was created (not even the lock: inputs are validated before anything is written).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

import realtree
from modfactory import ORIGINAL, PATCHED, TARGET, make_mod, make_site, run_sh, unified
from sparkmods.cli import main
from sparkmods.sync import sync


def assert_refused(mod: Path, site: Path, cwd: Path, *words: str) -> str:
    """run.sh exits 2 with one ERROR line holding `words`; the tree is untouched."""
    before = realtree.snapshot(site)
    out = run_sh(mod, site, cwd)
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "ERROR" in lines[0] and "Traceback" not in text, text
    for word in words:
        assert word in lines[0], lines[0]
    assert realtree.snapshot(site) == before
    assert not (site / ".sparkmods").exists()
    return lines[0]


def host_check_fails(mod: Path, capsys) -> str:
    """`sparkmods check` on the same mod: exit 2, one line on stderr."""
    code = main(["check", "--mods-dir", str(mod.parent), mod.name, "--vllm", f"dir:{mod.parent.parent / 'site'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def patched_mod(tmp_path: Path, target: str, body: str = "x = 1\n") -> Path:
    """A mod whose only patch creates `target` (whatever the path says)."""
    patch = f"--- /dev/null\n+++ {target}\n@@ -0,0 +1 @@\n+{body}"
    return make_mod(tmp_path / "mods", patch=patch)


@pytest.mark.parametrize("target,word", [
    ("/opt/x", "only files inside the vllm/ package"),          # absolute: stripped to opt/x, outside vllm/
    ("b/zz.pth", "only files inside the vllm/ package"),
    ("b/vllm/zz.pth", ".pth files"),
    ("b/.sparkmods/other/state.json", "only files inside the vllm/ package"),
    ("b/vllm/../evil.py", "'..'"),
    ("b/vllm/.x.py.sparkmods-tmp", "temp files"),
])
def test_patch_targets_outside_vllm_are_refused(tmp_path: Path, capsys, target: str, word: str) -> None:
    site = make_site(tmp_path / "site")
    mod = patched_mod(tmp_path, target)
    line = assert_refused(mod, site, tmp_path, "demo.patch", word)
    assert not (site / "opt").exists() and not (site / "zz.pth").exists(), line
    assert word in host_check_fails(mod, capsys)


def test_nul_byte_in_a_patch_path(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site")
    mod = patched_mod(tmp_path, "b/vllm/a\x00b.py")
    assert_refused(mod, site, tmp_path, "demo.patch", "control character")


def test_binary_patch(tmp_path: Path, capsys) -> None:
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods")
    (mod / "patches" / "v1" / "demo.patch").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00binary")
    assert_refused(mod, site, tmp_path, "demo.patch", "not UTF-8")
    assert "not UTF-8" in host_check_fails(mod, capsys)


def test_fifo_patch_is_refused_without_opening_it(tmp_path: Path, capsys) -> None:
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods")
    fifo = mod / "patches" / "v1" / "demo.patch"
    fifo.unlink()
    os.mkfifo(fifo)
    assert_refused(mod, site, tmp_path, "demo.patch", "not a regular file")  # run_sh times out on a hang
    assert "not a regular file" in host_check_fails(mod, capsys)


def test_patches_folder_symlinked_out_of_the_mod(tmp_path: Path, capsys) -> None:
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods")
    outside = tmp_path / "elsewhere"
    (mod / "patches").rename(outside)
    (mod / "patches").symlink_to(outside)
    assert_refused(mod, site, tmp_path, "demo.patch", "leads outside the mod folder")
    assert "outside the mod folder" in host_check_fails(mod, capsys)


def _with_install(tmp_path: Path, dest: str, make_source: Callable[[Path], None]) -> Path:
    mod = make_mod(tmp_path / "mods", toml_extra=f'install = [{{ src = "files/t.jinja", dest = "{dest}" }}]\n')
    (mod / "files").mkdir()
    make_source(mod / "files" / "t.jinja")
    sync(mod)
    return mod


def test_missing_install_source_is_not_ok_before_anything_is_patched(tmp_path: Path, capsys) -> None:
    site = make_site(tmp_path / "site")
    mod = _with_install(tmp_path, "workspace:t.jinja", lambda p: None)
    assert_refused(mod, site, tmp_path, "t.jinja", "cannot read install source")
    assert (site / TARGET).read_text() == ORIGINAL
    assert "install source" in host_check_fails(mod, capsys)


def test_install_source_symlink_out_of_the_mod(tmp_path: Path, capsys) -> None:
    site = make_site(tmp_path / "site")
    mod = _with_install(tmp_path, "workspace:t.jinja", lambda p: p.symlink_to("/etc/passwd"))
    assert_refused(mod, site, tmp_path, "t.jinja", "leads outside the mod folder")
    assert not (tmp_path / "t.jinja").exists()


@pytest.mark.parametrize("dest", ["site:zz.pth", "site:vllm/x.pth", "site:../x.py", "site:/etc/x"])
def test_site_install_outside_vllm_is_a_manifest_error(tmp_path: Path, capsys, dest: str) -> None:
    site = make_site(tmp_path / "site")
    mod = _with_install(tmp_path, "site:vllm/ok.py", lambda p: p.write_text("x = 1\n"))
    generated = mod / "manifest.json"  # what run.sh reads (sync refuses such a mod.toml)
    generated.write_text(generated.read_text().replace("site:vllm/ok.py", dest))
    assert_refused(mod, site, tmp_path, "manifest.json", "install[0].dest")
    toml = mod / "mod.toml"
    toml.write_text(toml.read_text().replace("site:vllm/ok.py", dest))
    assert "install[0].dest" in host_check_fails(mod, capsys)


def test_site_install_is_journaled_and_reverted(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site")
    mod = _with_install(tmp_path, "site:vllm/sparkmods_extra.py", lambda p: p.write_text("EXTRA = 1\n"))
    out = run_sh(mod, site, tmp_path)
    assert out.returncode == 0 and "installed vllm/sparkmods_extra.py" in out.stdout, out.stdout
    assert (site / "vllm/sparkmods_extra.py").read_text() == "EXTRA = 1\n" and (site / TARGET).read_text() == PATCHED
    assert "already applied" in run_sh(mod, site, tmp_path).stdout
    out = run_sh(mod, site, tmp_path, "revert")
    assert out.returncode == 0 and not (site / "vllm/sparkmods_extra.py").exists()
    assert (site / TARGET).read_text() == ORIGINAL


@pytest.mark.parametrize("toml,generated,word", [
    (b"\x00\x01\xff\xfe binary", b"\x00\x01\xff\xfe binary", "not UTF-8"),
    (b"a = " + b"[" * 100000 + b"]" * 100000 + b"\n", b"[" * 100000 + b"]" * 100000, "nested too deeply"),
])
def test_binary_or_deeply_nested_manifest(tmp_path: Path, capsys, toml: bytes, generated: bytes, word: str) -> None:
    """run.sh reads the generated manifest.json, the host mod.toml: each refuses its own bad file."""
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods")
    (mod / "manifest.json").write_bytes(generated)
    assert_refused(mod, site, tmp_path, "manifest.json", word)
    (mod / "mod.toml").write_bytes(toml)
    assert word in host_check_fails(mod, capsys)


@pytest.mark.parametrize("reported", ["3.6", "2.7", ""])
def test_old_python_says_what_it_needs(tmp_path: Path, reported: str) -> None:
    """An interpreter older than 3.9 (here a stand-in reporting its version) never runs our code."""
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods")
    fake = tmp_path / "python-old"
    fake.write_text(f"#!/bin/sh\necho '{reported}'\n" if reported else "#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    out = run_sh(mod, site, tmp_path, env_extra={"SPARKMODS_PYTHON": str(fake)})
    assert out.returncode == 2 and "SyntaxError" not in out.stderr
    assert f"needs Python >= 3.9; {fake} is {reported or 'not a working Python'}" in out.stderr, out.stderr
    assert (site / TARGET).read_text() == ORIGINAL


def test_a_write_error_names_the_file_and_rolls_back(tmp_path: Path) -> None:
    """A file-size limit makes the write of the new module fail half-way through the apply."""
    site = make_site(tmp_path / "site")
    lines = [f"y{i} = {i}\n" for i in range(4000)]  # ~40 KB, over the 16 KB limit below
    patch = f"--- /dev/null\n+++ b/vllm/big.py\n@@ -0,0 +1,{len(lines)} @@\n" + "".join("+" + x for x in lines)
    mod = make_mod(tmp_path / "mods", patch=unified(TARGET, ORIGINAL, PATCHED) + patch)
    before = realtree.snapshot(site)
    env = {"PATH": os.environ["PATH"], "PYTHON_ROOT": str(site), "SPARKMODS_PYTHON": sys.executable}
    out = subprocess.run(["bash", "-c", f"ulimit -f 16; exec bash {mod / 'run.sh'}"], env=env, text=True,
                         capture_output=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "big.py" in out.stdout and "File too large" in out.stdout and "rolled back" in out.stdout, out.stdout
    assert realtree.snapshot(site) == before and realtree.strays(site, []) == []
    assert (site / TARGET).read_text() == ORIGINAL
