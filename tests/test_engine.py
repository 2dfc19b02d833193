"""The patch engine: every hunk outcome, CRLF and no-newline files, path safety (atomic writes: test_crash_safety.py)."""

from __future__ import annotations

import difflib
import os

import pytest

from sparkmods.runtime.engine import UnsafePath, plan, plan_file, safe_target
from sparkmods.runtime.udiff import PatchParseError, parse_patch, reverse

BASE = [f"line {i}\n" for i in range(1, 41)]


def udiff(old: list, new: list, path: str = "vllm/x.py", n: int = 3) -> str:
    return "".join(difflib.unified_diff(old, new, f"a/{path}", f"b/{path}", n=n))


def edited(lines, at, insert):
    out = list(lines)
    out[at:at] = insert
    return out


def run(patch_text: str, content: "bytes | None"):
    (fp,) = parse_patch(patch_text)
    return plan_file(fp, content)


def joined(lines) -> bytes:
    return "".join(lines).encode()


def test_exact_apply():
    new = edited(BASE, 10, ["added\n"])
    res = run(udiff(BASE, new), joined(BASE))
    assert res.status == "ok" and [h.outcome for h in res.hunks] == ["exact"]
    assert res.after == joined(new)


def test_offset_when_code_moved_and_drift_carries_to_next_hunk():
    new = edited(edited(BASE, 30, ["second\n"]), 5, ["first\n"])
    patch = udiff(BASE, new)
    moved = ["header\n"] * 4 + BASE
    res = run(patch, joined(moved))
    assert res.status == "ok-offset"
    assert [(h.outcome, h.offset) for h in res.hunks] == [("offset", 4), ("offset", 4)]
    assert res.after == joined(["header\n"] * 4 + new)


def test_nearest_match_wins_and_equal_distance_is_a_conflict():
    block = ["def f():\n", "    a = 1\n", "    return a\n"]
    body = ["x\n"] * 10 + block + ["y\n"] * 10
    new_body = list(body)
    new_body[11:12] = ["    a = 2\n"]
    patch = udiff(body, new_body, n=1)
    # the same block twice: 3 lines above the stated place (line 11) and 9 lines below it
    target = ["x\n"] * 7 + block + ["z\n"] * 9 + block + ["y\n"] * 10
    res = run(patch, joined(target))
    assert res.status == "ok-offset" and res.hunks[0].line == 8  # the nearer, first block
    # symmetric distances: refuse to guess
    target = ["x\n"] * 7 + block + ["z\n"] * 3 + block + ["y\n"] * 10
    # stated index 10 (line 11): candidates at 7 and 13 -> distances 3 and 3
    res = run(patch, joined(target))
    assert res.status == "conflict" and "ambiguous" in res.hunks[0].reason


def test_applied_detected_and_idempotent():
    new = edited(BASE, 10, ["added\n"])
    patch = udiff(BASE, new)
    res = run(patch, joined(new))
    assert res.status == "applied" and res.after is None and not res.changes


def test_partly_applied_is_a_conflict():
    new = edited(edited(BASE, 30, ["second\n"]), 5, ["first\n"])
    patch = udiff(BASE, new)
    half = edited(BASE, 5, ["first\n"])
    res = run(patch, joined(half))
    assert res.status == "conflict" and "partly applied" in res.reason


def test_conflict_reports_near_match_without_fuzz():
    new = edited(BASE, 10, ["added\n"])
    patch = udiff(BASE, new)
    drifted = list(BASE)
    drifted[9] = "line 10 changed upstream\n"
    res = run(patch, joined(drifted))
    assert res.status == "conflict" and res.after is None
    near = res.hunks[0].near
    assert near is not None and near.line == 8 and near.matching == near.total - 1
    assert near.differing == [(10, "line 10", "line 10 changed upstream")]


def test_missing_file_and_new_and_deleted_files():
    assert run(udiff(BASE, BASE[:-1] + ["end\n"]), None).status == "missing-file"
    created = "--- /dev/null\n+++ b/vllm/new.py\n@@ -0,0 +1,2 @@\n+a\n+b\n"
    res = run(created, None)
    assert res.status == "ok" and res.after == b"a\nb\n"
    assert run(created, b"a\nb\n").status == "applied"
    assert run(created, b"other\n").status == "conflict"
    deleted = "--- a/vllm/old.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a\n-b\n"
    res = run(deleted, b"a\nb\n")
    assert res.status == "ok" and res.changes and res.after is None
    assert run(deleted, None).status == "applied"
    assert run(deleted, b"a\nc\n").status == "conflict"


def test_git_style_headers_and_strip_level():
    text = ("diff --git a/vllm/x.py b/vllm/x.py\nindex 111..222 100644\n" + udiff(BASE, edited(BASE, 3, ["z\n"])))
    (fp,) = parse_patch(text)
    assert fp.path == "vllm/x.py"
    (fp0,) = parse_patch(text.replace("a/vllm", "vllm").replace("b/vllm", "vllm"), strip=0)
    assert fp0.path == "vllm/x.py"
    new_mode = "diff --git a/vllm/n.py b/vllm/n.py\nnew file mode 100644\nindex 0000000..e69de29\n--- /dev/null\n+++ b/vllm/n.py\n@@ -0,0 +1 @@\n+x\n"
    (fp,) = parse_patch(new_mode)
    assert fp.is_new and fp.path == "vllm/n.py"


def test_crlf_file_keeps_crlf_and_crlf_patch_applies():
    crlf = [line.replace("\n", "\r\n") for line in BASE]
    new = edited(BASE, 10, ["added\n"])
    res = run(udiff(BASE, new), joined(crlf))
    assert res.status == "ok"
    assert res.after == joined([line.replace("\n", "\r\n") for line in new])
    crlf_patch = udiff(BASE, new).replace("\n", "\r\n")
    assert run(crlf_patch, joined(crlf)).after == res.after


def test_no_newline_at_end_of_file_both_ways():
    add_line = ("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -2,2 +2,3 @@\n b\n-c\n"
                "\\ No newline at end of file\n+c\n+d\n\\ No newline at end of file\n")
    res = run(add_line, b"a\nb\nc")
    assert res.status == "ok" and res.after == b"a\nb\nc\nd"
    assert run(add_line, b"a\nb\nc\nd").status == "applied"
    add_eol = "--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+b\n"
    assert run(add_eol, b"a\nb").after == b"a\nb\n"


@pytest.mark.parametrize("text, message", [
    ("just words\n", "no file headers"),
    ("--- a/vllm/x.py\n+++ b/vllm/x.py\n", "header without hunks"),
    ("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1,3 +1,3 @@\n a\n-b\n", "hunk ends early"),
    ("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1,2 +1,2 @@\n a\n*b\n", "unexpected"),
    ("@@ -1 +1 @@\n-a\n+b\n", "before any"),
    ("--- x\n+++ x\n@@ -1 +1 @@\n-a\n+b\n", "cannot strip"),
    ("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -5,1 +5,1 @@\n-a\n+b\n@@ -1,1 +1,1 @@\n-c\n+d\n", "out of order"),
    ("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1,1 +1,1 @@\n-a\n+b\n+c\n", "longer than"),
])
def test_malformed_diffs_have_clear_errors(text, message):
    with pytest.raises(PatchParseError, match=message):
        parse_patch(text)


@pytest.mark.parametrize("path", ["/etc/passwd", "../x.py", "vllm/../../x.py", "C:/x.py"])
def test_path_escapes_refused_in_plan(path):
    text = f"--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-a\n+b\n".replace("a//", "/").replace("b//", "/")
    fps = parse_patch(text, strip=1 if not path.startswith("/") else 0)
    with pytest.raises(UnsafePath):
        plan(fps, lambda p: b"a\n")


def test_symlink_outside_tree_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.py").write_text("a\n")
    root = tmp_path / "site"
    (root / "vllm").mkdir(parents=True)
    os.symlink(outside, root / "vllm" / "evil")
    with pytest.raises(UnsafePath, match="outside"):
        safe_target(root, "vllm/evil/x.py")
    assert (outside / "x.py").read_text() == "a\n"


def test_reverse_undoes_a_patch():
    new = edited(BASE, 10, ["added\n"])
    (fp,) = parse_patch(udiff(BASE, new))
    res = plan_file(reverse(fp), joined(new))
    assert res.status == "ok" and res.after == joined(BASE)
