"""File moves: byte-range copies (kernel and bounded-buffer paths), no writes through
symlinks, no re-copying of files already in place, backups."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sparkmods.checkpoint import fileops
from sparkmods.errors import SparkmodsError

DATA = os.urandom(3 * fileops.CHUNK + 12345)


def _copy(src: Path, dst: Path, offset: int, length: int) -> list[int]:
    seen: list[int] = []
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        fout.write(b"HDR")
        fout.flush()
        fileops.copy_range(fin.fileno(), fout.fileno(), offset, length, seen.append)
    return seen


@pytest.mark.parametrize("kernel", [True, False], ids=["copy_file_range", "buffered"])
def test_copy_range_appends_exact_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel: bool) -> None:
    if not kernel:
        monkeypatch.delattr(os, "copy_file_range", raising=False)
    src = tmp_path / "src"
    src.write_bytes(DATA)
    seen = _copy(src, tmp_path / "dst", 777, len(DATA) - 1000)
    assert (tmp_path / "dst").read_bytes() == b"HDR" + DATA[777:-223]
    assert sum(seen) == len(DATA) - 1000
    if not kernel:
        assert max(seen) <= fileops.CHUNK  # bounded buffer


def test_copy_range_refuses_a_source_that_shrank(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(DATA[:1000])
    with pytest.raises(SparkmodsError, match="ended 500 bytes early"):
        _copy(src, tmp_path / "dst", 500, 1000)


def test_atomic_write_replaces_a_symlink_not_its_target(tmp_path: Path) -> None:
    blob = tmp_path / "blob"
    blob.write_text("original")
    link = tmp_path / "index.json"
    link.symlink_to(blob)
    fileops.atomic_write_text(link, "new")
    assert not link.is_symlink() and link.read_text() == "new"
    assert blob.read_text() == "original"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blob", "index.json"]  # no temp left


def test_backup_copies_content_and_picks_a_free_name(tmp_path: Path) -> None:
    blob = tmp_path / "blob"
    blob.write_text("v1")
    link = tmp_path / "index.json"
    link.symlink_to(blob)
    first = fileops.backup_file(link)
    assert fileops.backup_file(link) == first  # same bytes: reused, retries pile nothing up
    blob.write_text("v2")
    second = fileops.backup_file(link)
    assert (first.name, second.name) == ("index.json.bak", "index.json.bak.1")
    assert not first.is_symlink() and first.read_text() == "v1" and second.read_text() == "v2"


def test_place_file_outcomes(tmp_path: Path) -> None:
    src = tmp_path / "a" / "mtp.safetensors"
    src.parent.mkdir()
    src.write_bytes(DATA)
    dst_dir = tmp_path / "b"
    dst_dir.mkdir()
    dst = dst_dir / src.name
    assert fileops.place_file(src, src) == "same"
    assert fileops.place_file(src, dst) == "hardlinked"
    assert dst.stat().st_ino == src.stat().st_ino
    assert fileops.place_file(src, dst) == "same"
    dst.unlink()
    dst.write_bytes(DATA)
    mtime = dst.stat().st_mtime_ns
    assert fileops.place_file(src, dst) == "identical"
    assert dst.stat().st_mtime_ns == mtime
    dst.write_bytes(DATA[:-1] + b"!")
    with pytest.raises(SparkmodsError, match="differs"):
        fileops.place_file(src, dst)


def test_place_file_copies_across_filesystems(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs a second filesystem at /dev/shm")
    src = tmp_path / "mtp.safetensors"
    src.write_bytes(DATA)
    dst_dir = shm / f"sparkmods-test-{os.getpid()}"
    dst_dir.mkdir()
    try:
        assert fileops.place_file(src, dst_dir / src.name) == "copied"
        assert (dst_dir / src.name).read_bytes() == DATA
        assert [p.name for p in dst_dir.iterdir()] == [src.name]
    finally:
        for p in dst_dir.iterdir():
            p.unlink()
        dst_dir.rmdir()


def test_place_file_refuses_a_dangling_symlink(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"x")
    dangling = tmp_path / "dst"
    dangling.symlink_to(tmp_path / "gone")
    with pytest.raises(SparkmodsError, match="broken symlink"):
        fileops.place_file(src, dangling)
