"""The runtime's diff parser against unidiff (tests/udiffref.py) on every patch the project holds:
each mod's patches, the community-mod fixtures and the examples. The rebase tests compare every
patch a rebase writes the same way (tests/rebasecase.py, `carried`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from udiffref import assert_parsed_alike, by_runtime

REPO = Path(__file__).resolve().parents[1]
PATCHES = sorted(p for top in ("mods", "tests/fixtures", "examples") for pattern in ("*.patch", "*.diff")
                 for p in (REPO / top).rglob(pattern))


def test_every_mod_has_patches_here() -> None:
    """The corpus is not empty by accident: every mod with a patches/ folder contributes."""
    with_patches = {p.parent.name for p in (REPO / "mods").glob("*/patches")}
    assert with_patches and with_patches <= {p.relative_to(REPO / "mods").parts[0] for p in PATCHES
                                             if p.is_relative_to(REPO / "mods")}


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: str(p.relative_to(REPO)))
def test_unidiff_reads_the_patch_as_the_runtime_does(patch: Path) -> None:
    assert_parsed_alike(patch.read_text(encoding="utf-8"), str(patch.relative_to(REPO)))


@pytest.mark.parametrize("text", [
    # a new file, a deleted file, and both sides without a final newline
    "--- /dev/null\n+++ b/new.py\n@@ -0,0 +1,2 @@\n+a\n+b\n",
    "--- a/old.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a\n-b\n",
    "--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@ def f():\n a\n-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n",
    # git headers, a timestamp after the name, a hunk without lengths (not CRLF: unidiff keeps the
    # \r in a CRLF patch's file names, where the runtime, as GNU patch, reads the name without it)
    "diff --git a/x.py b/x.py\nindex 1..2 100644\n--- a/x.py\n+++ b/x.py\n@@ -3 +3 @@\n-a\n+b\n",
    "--- a/x.py\t2026-01-01 00:00:00\n+++ b/x.py\t2026-01-02 00:00:00\n@@ -1,1 +1,1 @@\n-a\n+b\n",
], ids=["new", "deleted", "no-final-newline", "git", "timestamps"])
def test_the_forms_the_corpus_may_lack(text: str) -> None:
    assert by_runtime(text)  # parsed at all
    assert_parsed_alike(text, "case")
