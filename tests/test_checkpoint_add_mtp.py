"""`sparkmods checkpoint add-mtp`: same folder, another folder, HF snapshots, idempotency."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import ckptfactory as cf
from sparkmods.checkpoint.layout import INDEX_NAME
from sparkmods.cli import main

MTP = "model_extra_tensors.safetensors"


def add_mtp(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    code = main(["checkpoint", "add-mtp", *args, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out else {}


def index(root: Path) -> dict:
    return json.loads((root / INDEX_NAME).read_text())


def header_bytes(root: Path, names: list[str]) -> int:
    return sum(len(cf.read_tensors(root / MTP)[n][2]) for n in names)


def test_same_folder_indexes_every_header_tensor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = cf.write_int4_autoround(tmp_path / "int4", mtp="unindexed")
    before = index(root)
    code, result = add_mtp(capsys, "--source", str(root))
    after = index(root)
    mtp_names = sorted(cf.read_tensors(root / MTP))
    assert code == 0 and result["placed"] == "same" and result["added"] == len(mtp_names)
    assert {n for n, f in after["weight_map"].items() if f == MTP} == set(mtp_names)
    assert after["metadata"]["total_size"] == before["metadata"]["total_size"] + header_bytes(root, mtp_names)
    assert json.loads((root / f"{INDEX_NAME}.bak").read_text()) == before
    # Now inspect is clean, and the MTP head is loaded.
    assert main(["checkpoint", "inspect", str(root)]) == 0


def test_idempotent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = cf.write_int4_autoround(tmp_path / "int4", mtp="unindexed")
    add_mtp(capsys, "--source", str(root))
    snapshot = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in root.iterdir()}
    code, result = add_mtp(capsys, "--source", str(root))
    assert code == 0 and result["added"] == 0 and result["backup"] is None
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in root.iterdir()} == snapshot


def test_other_target_gets_a_hardlink_not_a_copy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = cf.write_int4_autoround(tmp_path / "intel")
    target = cf.write_int4_autoround(tmp_path / "hybrid", mtp="absent")
    code, result = add_mtp(capsys, "--source", str(source), "--target", str(target))
    assert code == 0 and result["placed"] == "hardlinked"
    assert (target / MTP).stat().st_ino == (source / MTP).stat().st_ino
    assert {n for n, f in index(target)["weight_map"].items() if f == MTP} == set(cf.read_tensors(source / MTP))
    code, result = add_mtp(capsys, "--source", str(source), "--target", str(target))
    assert (result["placed"], result["added"]) == ("same", 0)


def test_identical_copy_already_there_is_not_rewritten(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = cf.write_int4_autoround(tmp_path / "intel")
    target = cf.write_int4_autoround(tmp_path / "copy", mtp="unindexed")  # same seed: same bytes
    inode = (target / MTP).stat().st_ino
    code, result = add_mtp(capsys, "--source", str(source), "--target", str(target))
    assert code == 0 and result["placed"] == "identical" and result["added"] > 0
    assert (target / MTP).stat().st_ino == inode


def test_hf_snapshot_index_becomes_a_real_file_and_blobs_stay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = cf.write_int4_autoround(tmp_path / "download", mtp="unindexed")
    snap = cf.hf_snapshot(tmp_path / "hub", "Intel/Qwen3.5-tiny-int4-AutoRound", src)
    blob = (snap / INDEX_NAME).resolve()
    blob_text = blob.read_text()
    blobs = {p: p.read_bytes() for p in blob.parent.iterdir()}
    code, result = add_mtp(capsys, "--source", str(snap))
    assert code == 0 and result["added"] > 0
    assert not (snap / INDEX_NAME).is_symlink()
    assert (snap / MTP).is_symlink()  # the 1-file "same" case touches nothing
    assert blob.read_text() == blob_text
    assert {p: p.read_bytes() for p in blob.parent.iterdir()} == blobs
    backup = snap / f"{INDEX_NAME}.bak"
    assert not backup.is_symlink() and backup.read_text() == blob_text


def test_hf_snapshot_as_target(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = cf.write_int4_autoround(tmp_path / "intel")
    snap = cf.hf_snapshot(tmp_path / "hub", "someone/hybrid", cf.write_int4_autoround(tmp_path / "dl", mtp="absent"))
    code, result = add_mtp(capsys, "--source", str(source), "--target", str(snap))
    assert code == 0 and result["placed"] == "hardlinked"
    assert not (snap / MTP).is_symlink() and not (snap / INDEX_NAME).is_symlink()


def test_refusals_are_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = cf.write_int4_autoround(tmp_path / "intel")
    no_mtp = cf.write_int4_autoround(tmp_path / "plain", mtp="absent")
    assert main(["checkpoint", "add-mtp", "--source", str(no_mtp)]) == 2
    assert "model_extra_tensors.safetensors does not exist" in capsys.readouterr().err

    (no_mtp / INDEX_NAME).rename(no_mtp / "moved.json")
    assert main(["checkpoint", "add-mtp", "--source", str(source), "--target", str(no_mtp)]) == 2
    assert "--target must be a sharded checkpoint" in capsys.readouterr().err
    assert not (no_mtp / MTP).exists()

    clash = cf.write_int4_autoround(tmp_path / "clash", mtp="absent")
    cf.edit_index(clash, lambda doc: doc["weight_map"].update({"mtp.fc.weight": "model-00001-of-00004.safetensors"}))
    assert main(["checkpoint", "add-mtp", "--source", str(source), "--target", str(clash)]) == 2
    err = capsys.readouterr().err
    assert "already indexed to other files" in err and err.count("\n") == 1

    differs = cf.write_int4_autoround(tmp_path / "differs", mtp="unindexed", seed=7)
    assert main(["checkpoint", "add-mtp", "--source", str(source), "--target", str(differs)]) == 2
    assert "differs" in capsys.readouterr().err


def test_text_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = cf.write_int4_autoround(tmp_path / "int4", mtp="unindexed")
    assert main(["checkpoint", "add-mtp", "--source", str(root)]) == 0
    n = len(cf.mtp_specs(cf.Shape()))
    assert f"indexed {n} of {n} tensors" in capsys.readouterr().out
    assert main(["checkpoint", "add-mtp", "--source", str(root)]) == 0
    assert "already indexed, nothing to do" in capsys.readouterr().out
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(".")) == []  # no temp files
    assert os.listdir(root).count(f"{INDEX_NAME}.bak") == 1
