"""`sparkmods matrix` on local vLLM trees: outputs, determinism, --check and --against."""

from __future__ import annotations

import json
import re
from pathlib import Path

from modfactory import ORIGINAL, PATCHED, TARGET, make_mod, make_site, unified
from sparkmods.cli import main


def setup(tmp_path: Path):
    good = make_site(tmp_path / "v0191", "0.19.1")
    bad = make_site(tmp_path / "v0200", "0.20.0", files={TARGET: ORIGINAL.replace("y = x * 2", "y = x * 4")})
    mods = tmp_path / "mods"
    make_mod(mods)
    out = tmp_path / "matrix"
    args = ["matrix", "--mods-dir", str(mods), "--out", str(out), "--vllm", f"dir:{good}", "--vllm", f"dir:{bad}"]
    return mods, out, args


def test_matrix_writes_json_markdown_svg(tmp_path, capsys):
    _mods, out, args = setup(tmp_path)
    assert main(args) == 0
    doc = json.loads((out / "matrix.json").read_text())
    assert doc["schema"] == 1 and doc["generated_by"].startswith("sparkmods ")
    assert [r["vllm"] for r in doc["releases"]] == ["0.19.1", "0.20.0"]
    assert [(c["vllm"], c["status"], c["variant"]) for c in doc["cells"]] == [
        ("0.19.1", "ok", "v1"), ("0.20.0", "conflict", "v1")]
    assert doc["mods"][0]["content_hash"] and doc["cells"][1]["files"][0]["hunks"][0]["outcome"] == "conflict"
    md = (out / "MATRIX.md").read_text()
    assert "| **demo** | ✅ v1 | ❌ v1 |" in md
    assert re.search(r"\*\*demo\*\* on vLLM 0\.20\.0 .*`conflict`.*hunk 1", md)
    svg = (out / "matrix.svg").read_text()
    assert svg.startswith("<svg") and svg.count("<rect") >= 3 and "demo on dir:" in svg


def test_matrix_is_deterministic_apart_from_timestamp(tmp_path):
    _mods, out, args = setup(tmp_path)
    assert main(args) == 0
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main(args) == 0
    second = {p.name: p.read_bytes() for p in out.iterdir()}
    assert first == second  # unchanged inputs keep even the timestamp


def edit_patch(mod: Path) -> None:
    """Change the demo mod's patch (it still applies)."""
    (mod / "patches" / "v1" / "demo.patch").write_text(unified(TARGET, ORIGINAL, PATCHED.replace("# demo", "# a")))


def test_check_detects_a_mod_change_and_hand_edits(tmp_path, capsys):
    mods, out, args = setup(tmp_path)
    main(args)
    assert main(["matrix", "--check", "--mods-dir", str(mods), "--out", str(out)]) == 0
    (mods / "demo" / "README.md").write_text("changed\n")  # decides no cell
    assert main(["matrix", "--check", "--mods-dir", str(mods), "--out", str(out)]) == 0
    edit_patch(mods / "demo")
    assert main(["matrix", "--check", "--mods-dir", str(mods), "--out", str(out)]) == 1
    assert "mod demo changed since the matrix was generated" in capsys.readouterr().out
    main(args)
    (out / "MATRIX.md").write_text("edited by hand\n")
    assert main(["matrix", "--check", "--mods-dir", str(mods), "--out", str(out)]) == 1


def test_against_reports_regressions_and_fixes(tmp_path, capsys):
    _mods, out, args = setup(tmp_path)
    main(args)
    old = tmp_path / "old.json"
    doc = json.loads((out / "matrix.json").read_text())
    doc["cells"][1]["status"] = "ok"  # pretend 0.20.0 used to be green
    doc["cells"][0]["status"] = "conflict"  # and 0.19.1 used to be broken
    doc["releases"] = doc["releases"][:1]
    old.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(args + ["--against", str(old)]) == 1
    text = capsys.readouterr().out
    assert "regressions: demo on vLLM 0.20.0: ok -> conflict" in text
    assert "fixes: demo on vLLM 0.19.1: conflict -> ok" in text
    assert "new release: 0.20.0" in text


def test_committed_matrix_is_current():
    """A mod change without a regenerated matrix cannot land."""
    repo = Path(__file__).resolve().parents[1]
    assert main(["matrix", "--check", "--mods-dir", str(repo / "mods"), "--out", str(repo / "matrix")]) == 0


class _CountingSource:
    """A release-like source with a wheel sha256 that counts its reads (a stand-in for a
    remote wheel, whose real range reads are covered by the sources tests)."""

    def __init__(self, site: Path, version: str, sha256: str) -> None:
        self.label, self.version, self.commit, self.sha256 = f"pypi:{version}", version, None, sha256
        self.site, self.reads = site, 0

    def prefetch(self, paths) -> None:
        pass

    def read(self, path: str):
        self.reads += 1
        target = self.site / path
        return target.read_bytes() if target.is_file() else None


def test_incremental_rechecks_only_changed_inputs(tmp_path):
    from sparkmods.matrix.build import build

    mods = tmp_path / "mods"
    mod = make_mod(mods)
    site = make_site(tmp_path / "site", "0.19.1")
    first = _CountingSource(site, "0.19.1", "a" * 64)
    doc = build([mod], [first])
    assert first.reads == 1 and doc["cells"][0]["status"] == "ok"
    same = _CountingSource(site, "0.19.1", "a" * 64)
    assert build([mod], [same], previous=doc)["cells"] == doc["cells"] and same.reads == 0
    rebuilt = _CountingSource(site, "0.19.1", "b" * 64)  # the wheel changed
    build([mod], [rebuilt], previous=doc)
    assert rebuilt.reads == 1
    (mod / "README.md").write_text("edited\n")  # decides no cell
    unchanged = _CountingSource(site, "0.19.1", "a" * 64)
    build([mod], [unchanged], previous=doc)
    assert unchanged.reads == 0
    edit_patch(mod)  # the mod changed
    again = _CountingSource(site, "0.19.1", "a" * 64)
    build([mod], [again], previous=doc)
    assert again.reads == 1
    older_checks = _CountingSource(site, "0.19.1", "a" * 64)  # same inputs, other drift-check code
    build([mod], [older_checks], previous={**doc, "checker": "0" * 64})
    assert older_checks.reads >= 1


def test_check_detects_changed_drift_checks(tmp_path, capsys):
    mods, out, args = setup(tmp_path)
    main(args)
    doc = json.loads((out / "matrix.json").read_text())
    doc["checker"] = "0" * 64
    (out / "matrix.json").write_text(json.dumps(doc))
    assert main(["matrix", "--check", "--mods-dir", str(mods), "--out", str(out)]) == 1
    assert "the drift checks changed since the matrix was generated" in capsys.readouterr().out
