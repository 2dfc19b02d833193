"""Checkpoint tools killed at every file operation, and corrupt checkpoints: never a broken model.

A forked child runs `sparkmods checkpoint add-mtp` / `build-hybrid` and dies (os._exit(137),
what SIGKILL leaves) right before its N-th file operation, for every N until it completes.
After each kill, what vLLM would read (the index and every file it names, or the output
folder) is either the old checkpoint or the complete new one; the next run then finishes
and leaves no temp file, no `.partial-*` / `.old-*` folder and no extra `.bak.N`.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator, List

import pytest

import ckptfactory as cf
from sparkmods.checkpoint.layout import INDEX_NAME, Checkpoint
from sparkmods.cli import main

MTP = "model_extra_tensors.safetensors"
# The file operations the tools use to write; the child dies right before the N-th call.
OPS = [(os, name) for name in ("open", "write", "replace", "rename", "link", "unlink", "mkdir", "copy_file_range",
                               "fsync", "chmod")] + [(shutil, "copyfile"), (shutil, "rmtree")]


def killed_at(limit: int, argv: List[str]) -> int:
    """Run the CLI in a child that exits 137 before its `limit`-th file operation."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 99
        try:
            count = [0]

            def wrap(fn: Callable) -> Callable:
                def counted(*args, **kwargs):
                    count[0] += 1
                    if count[0] > limit:
                        os._exit(137)
                    return fn(*args, **kwargs)
                return counted

            sink = os.open(os.devnull, os.O_WRONLY)
            os.dup2(sink, 1)
            os.dup2(sink, 2)
            for module, name in OPS:
                if hasattr(module, name):
                    setattr(module, name, wrap(getattr(module, name)))
            code = main(argv)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def every_kill(argv: List[str], reset: Callable[[], None]) -> Iterator[int]:
    """Yield after each killed run (state left as the kill left it); stop once a run completes."""
    for limit in range(2000):
        reset()
        status = killed_at(limit, argv)
        if status == 0:
            return
        assert status == 137, status
        yield limit
    pytest.fail("the command never completed")


def sound_tensors(root: Path) -> dict:
    """What vLLM would load from root: the index's files, all present with valid headers."""
    ck = Checkpoint.open(root)
    ck.require_sound()
    assert ck.index is not None
    return {t.name: (t.dtype, t.shape) for file, t in ck.tensors() if ck.index.weight_map.get(t.name) == file}


def test_add_mtp_killed_anywhere(tmp_path: Path) -> None:
    source = cf.write_int4_autoround(tmp_path / "intel", mtp="indexed")
    pristine = cf.write_int4_autoround(tmp_path / "pristine", mtp="absent")
    target = tmp_path / "target"
    argv = ["checkpoint", "add-mtp", "--source", str(source), "--target", str(target)]
    old = sound_tensors(pristine)

    def reset() -> None:
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(pristine, target)

    reset()
    assert killed_at(10_000, argv) == 0
    new = sound_tensors(target)
    assert len(new) > len(old)
    kills = 0
    for _ in every_kill(argv, reset):
        kills += 1
        assert sound_tensors(target) in (old, new)  # the index and its files: old or complete new
        assert main(argv) == 0
        assert sound_tensors(target) == new
        assert main(argv) == 0  # a retry changes nothing and piles nothing up
        leftovers = sorted(p.name for p in target.iterdir() if p.name.endswith(".tmp") or ".bak." in p.name)
        assert leftovers == [], leftovers
        assert (target / f"{INDEX_NAME}.bak").exists() or not any(target.glob("*.bak*"))
    assert kills > 5


@pytest.mark.parametrize("existing", [False, True])
def test_build_hybrid_killed_anywhere(tmp_path: Path, existing: bool) -> None:
    int4 = cf.write_int4_autoround(tmp_path / "int4", mtp="unindexed")
    fp8 = cf.write_fp8(tmp_path / "fp8")
    out = tmp_path / "models" / "hybrid"
    argv = ["checkpoint", "build-hybrid", "--int4", str(int4), "--fp8", str(fp8), "--out", str(out), "--force"]
    previous = tmp_path / "previous"
    shutil.copytree(int4, previous)  # an older model at --out, replaced only when the new one is whole

    def reset() -> None:
        if out.parent.exists():
            shutil.rmtree(out.parent)
        out.parent.mkdir()
        if existing:
            shutil.copytree(previous, out)

    reset()
    assert killed_at(10_000, argv) == 0
    new = sound_tensors(out)
    allowed = [new, sound_tensors(previous)] if existing else [new]
    kills = 0
    for _ in every_kill(argv, reset):
        kills += 1
        if os.path.lexists(out):
            assert sound_tensors(out) in allowed  # never a half-written model where vLLM reads
        assert main(argv) == 0
        assert sound_tensors(out) == new
        assert sorted(p.name for p in out.parent.iterdir()) == ["hybrid"]  # no .partial-*, no .old-*
    assert kills > 5


def nesting_bomb(depth: int = 100_000) -> bytes:
    return b"[" * depth + b"]" * depth


def safetensors_with_header(raw: bytes) -> bytes:
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """The real command in a subprocess: a hang (reading a FIFO) fails the timeout instead."""
    sparkmods = Path(sys.executable).parent / "sparkmods"
    return subprocess.run([str(sparkmods), *args], capture_output=True, text=True, timeout=60)


def assert_one_line_error(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr


@pytest.mark.parametrize("command", ["inspect", "add-mtp"])
def test_index_nesting_bomb(tmp_path: Path, command: str) -> None:
    root = cf.write_int4_autoround(tmp_path / "ck", mtp="unindexed")
    (root / INDEX_NAME).write_bytes(b'{"weight_map": ' + nesting_bomb() + b"}")
    args = [str(root)] if command == "inspect" else ["--source", str(root)]
    assert_one_line_error(run_cli("checkpoint", command, *args), INDEX_NAME, "nested too deeply")


def test_header_nesting_bomb(tmp_path: Path) -> None:
    root = cf.write_int4_autoround(tmp_path / "ck", mtp="unindexed")
    (root / MTP).write_bytes(safetensors_with_header(nesting_bomb()))
    proc = run_cli("checkpoint", "add-mtp", "--source", str(root))
    assert_one_line_error(proc, MTP, "nested too deeply")


@pytest.mark.parametrize("name", ["../outside.safetensors", "/tmp/outside.safetensors", "sub/x.safetensors"])
@pytest.mark.parametrize("command", ["inspect", "add-mtp"])
def test_index_entries_outside_the_folder_are_refused_unread(tmp_path: Path, name: str, command: str) -> None:
    root = cf.write_int4_autoround(tmp_path / "ck", mtp="unindexed")
    if name.startswith("../"):
        os.mkfifo(tmp_path / "outside.safetensors")  # opening it would hang: the timeout would fail
    cf.edit_index(root, lambda doc: doc["weight_map"].update({"model.norm.weight": name}))
    args = [str(root)] if command == "inspect" else ["--source", str(root)]
    assert_one_line_error(run_cli("checkpoint", command, *args), INDEX_NAME, repr(name), "own folder")


def test_config_nesting_bomb(tmp_path: Path) -> None:
    int4 = cf.write_int4_autoround(tmp_path / "int4", mtp="unindexed")
    fp8 = cf.write_fp8(tmp_path / "fp8")
    (int4 / "config.json").write_bytes(b'{"a": ' + nesting_bomb() + b"}")
    proc = run_cli("checkpoint", "build-hybrid", "--int4", str(int4), "--fp8", str(fp8), "--out", str(tmp_path / "o"))
    assert_one_line_error(proc, "config.json", "nested too deeply")
    assert not (tmp_path / "o").exists()
    assert json.loads((fp8 / "config.json").read_text())  # inputs untouched
