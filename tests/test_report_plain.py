"""In a pipe the check table is written without rich, and must be exactly what rich writes:
compared on tables with every column kind, drift-like details (`path:7:`), emoji-like codes,
markup-like brackets and long lines (the last three are left to rich)."""

from __future__ import annotations

import random

import pytest

from sparkmods.checking import report
from sparkmods.checking.rows import CheckRow
from sparkmods.runtime.engine import FileResult, HunkResult
from sparkmods.runtime.modcheck import ModResult

DETAILS = ["", "vllm/a.py:7: f(...): no parameter named 'w'; f(x) is at vllm/b.py:12", "vllm includes it: :100: too",
           "partly applied: vllm/x.py already patched", "see [bold]this[/]", "x" * 1200, "emoji :smile: here",
           "ratio 3:4:5 and a:b:c"]


def rows(seed: int, details: list) -> list:
    rng = random.Random(seed)
    out = []
    for i in range(rng.randint(1, 30)):
        status = rng.choice(["ok", "ok-offset", "applied", "upstream", "no-variant", "conflict", "drift"])
        files = []
        if status == "ok-offset":
            files = [FileResult("vllm/m.py", "ok-offset", [HunkResult(1, "offset", 10, 12, rng.randint(-50, 50))])]
        result = ModResult(rng.choice(["int8-lm-head", "chat-template", "m" * rng.randint(1, 30)]),
                           rng.choice(["0.19.1", "0.20.0.dev3+g1234567", "1.0"]), status,
                           rng.choice([None, "v1", "apply-head"]), rng.choice(details), files)
        target = rng.choice([f"pypi:{result.version}", f"dir:/tmp/site-{i}", f"index:http://h/simple#{result.version}"])
        out.append(CheckRow(target, None, None, result))
    return out


def rendered(capsys, table_rows: list) -> str:
    report.print_table(table_rows)
    return capsys.readouterr().out


@pytest.mark.parametrize("seed", range(40))
def test_plain_equals_rich(capsys, monkeypatch, seed: int) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    table_rows = rows(seed, DETAILS[:4] + DETAILS[7:] if seed % 2 else DETAILS)
    fast = rendered(capsys, table_rows)
    monkeypatch.setattr(report, "_plain_table", lambda columns, cells: None)  # rich lays it out
    assert fast == rendered(capsys, table_rows)


def test_plain_is_used_when_nothing_needs_rich(monkeypatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    table_rows = rows(1, DETAILS[:2])
    cells = [[r.result.mod, r.result.version, r.target, "-", r.result.status, report.detail(r)] for r in table_rows]
    columns = ["mod", "vllm", "target", "variant", "status", "detail"]
    assert report._plain_table(columns, cells) is not None
    assert report._plain_table(columns, cells + [["m", "1", "t", "-", "ok", "see [red]x[/]"]]) is None
    assert report._plain_table(columns, cells + [["m", "1", "t", "-", "ok", ":100:"]]) is None
    monkeypatch.setenv("COLUMNS", "80")
    assert report._plain_table(columns, cells) is None
