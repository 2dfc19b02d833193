"""`sparkmods check` as a person reads it: one row per mod and target, the reason for anything
not green on the same row, a summary line, and no padding at line ends."""

from __future__ import annotations

from modfactory import ORIGINAL, TARGET, make_mod, make_site
from sparkmods.cli import main


def test_table_rows_reasons_and_summary(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)  # a log or pipe: no width to fold to
    good = make_site(tmp_path / "good", "0.19.1")
    bad = make_site(tmp_path / "bad", "0.20.0", files={TARGET: ORIGINAL.replace("y = x * 2", "y = x * 4")})
    make_mod(tmp_path / "mods")
    code = main(["check", "--mods-dir", str(tmp_path / "mods"), "--vllm", f"dir:{good}", "--vllm", f"dir:{bad}"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 1
    assert lines[0].split() == ["mod", "vllm", "target", "variant", "status", "detail"]
    assert lines[1].split()[:5] == ["demo", "0.19.1", f"dir:{good}", "v1", "ok"]
    assert lines[2].split()[:5] == ["demo", "0.20.0", f"dir:{bad}", "v1", "conflict"]
    assert f"{TARGET} hunk 1" in "\n".join(lines[2:-1])
    assert lines[-1] == "2 checked, 1 green, 1 not"
    assert all(line == line.rstrip() for line in lines)
