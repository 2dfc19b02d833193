"""`sparkmods check-patch` on what is not a patch: a FIFO (must not hang), a binary file,
non-UTF-8 text, a directory. Each is one line naming the file, exit 2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clirun import one_line_error, sparkmods

VALID_HEAD = b"--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1 +1 @@\n-a\n+b\n"
LATIN1 = VALID_HEAD.replace(b"+b\n", "+caf\u00e9\n".encode("latin-1"))


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _binary(path: Path) -> None:
    path.write_bytes(VALID_HEAD + bytes(range(256)) * 4)  # a real diff head, then binary bytes


def _latin1(path: Path) -> None:
    path.write_bytes(LATIN1)


def _folder(path: Path) -> None:
    path.mkdir()


@pytest.mark.parametrize("make, fragment", [
    (_fifo, "a FIFO, not a regular file (want a unified diff)"),
    (_binary, f"a binary file (NUL byte at offset {len(VALID_HEAD)}; want a unified diff)"),
    (_latin1, f"not UTF-8 text (byte {LATIN1.index(0xE9)}; want a unified diff)"),
    (_folder, "a directory, not a regular file (want a unified diff)"),
], ids=["fifo", "binary", "latin-1", "directory"])
def test_check_patch_refuses_what_is_not_a_text_patch(tmp_path, make, fragment):
    path = tmp_path / "mod.patch"
    make(path)
    done, seconds = sparkmods("check-patch", str(path), "--vllm", f"dir:{tmp_path}", timeout=30)
    assert one_line_error(done) == f"sparkmods: error: {path}: {fragment}"
    assert seconds < 20  # a FIFO that was opened would block until the timeout


def test_the_same_patch_as_utf8_text_gets_past_the_reader(tmp_path):
    """The control: the valid head alone is read and parsed; the error is then about the target."""
    path = tmp_path / "mod.patch"
    path.write_bytes(VALID_HEAD)
    done, _ = sparkmods("check-patch", str(path), "--vllm", f"dir:{tmp_path / 'none'}", timeout=30)
    line = one_line_error(done)
    assert str(path) not in line and "none" in line
