"""`sparkmods matrix` says how many cells it reused and how many it checked, and `--rebuild`
checks them all: on a fresh clone the committed matrix is reused whole, which must not pass for
a check. Real wheels over real HTTP on loopback (sha256 from the index, as from PyPI).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from modfactory import ORIGINAL, TARGET, make_mod
from sparkmods.cli import main
from wheelindex import make_wheel

pytestmark = pytest.mark.usefixtures("fresh_cache")

WHEEL = "vllm-{v}-cp38-abi3-manylinux_2_28_x86_64.whl"


def matrix(tmp_path: Path, index, *extra: str) -> int:
    return main(["matrix", "--mods-dir", str(tmp_path / "mods"), "--out", str(tmp_path / "matrix"),
                 "--index-url", f"{index.url}/simple", "--vllm", ">=0.19", *extra])


def test_reuse_is_reported_and_rebuild_rechecks_everything(loopback_index, tmp_path, capsys):
    make_mod(tmp_path / "mods", "demo")
    make_mod(tmp_path / "mods", "other")
    for version in ("0.19.1", "0.20.0"):
        loopback_index.add(make_wheel(tmp_path / WHEEL.format(v=version), version,
                                      extra={TARGET: ORIGINAL.encode()}))
    assert matrix(tmp_path, loopback_index) == 0
    assert capsys.readouterr().out.splitlines()[0] == "2 targets x 2 mods: 0 cells reused (inputs unchanged), 4 re-checked"

    before = len(loopback_index.file_hits())
    assert matrix(tmp_path, loopback_index) == 0
    assert capsys.readouterr().out.splitlines()[0] == ("2 targets x 2 mods: 4 cells reused (inputs unchanged), "
                                                       "0 re-checked; --rebuild re-checks all")
    assert len(loopback_index.file_hits()) == before  # reused: not a byte of any wheel read

    toml = tmp_path / "mods" / "other" / "mod.toml"
    toml.write_text(toml.read_text().replace("a demo mod", "a changed demo mod"))
    assert matrix(tmp_path, loopback_index) == 0
    assert capsys.readouterr().out.splitlines()[0] == "2 targets x 2 mods: 2 cells reused (inputs unchanged), 2 re-checked; --rebuild re-checks all"

    toml.write_text(toml.read_text().replace("a changed demo mod", "a demo mod"))
    assert matrix(tmp_path, loopback_index) == 0
    capsys.readouterr()
    written = {p.name: p.read_bytes() for p in (tmp_path / "matrix").iterdir()}
    assert matrix(tmp_path, loopback_index, "--rebuild") == 0
    assert capsys.readouterr().out.splitlines()[0] == "2 targets x 2 mods: 0 cells reused (inputs unchanged), 4 re-checked"
    # the same inputs checked again give the same files, timestamp included
    assert {p.name: p.read_bytes() for p in (tmp_path / "matrix").iterdir()} == written
