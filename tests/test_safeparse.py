"""Every parse of Python source in the tool goes through sparkmods.pyindex.safeparse (one lock).

The check and matrix commands parse vLLM files from a thread pool, and CPython 3.11's
ast.parse is not safe there (CI failed with "AST constructor recursion depth mismatch").
"""

from __future__ import annotations

import ast
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sparkmods.pyindex import safeparse

TOOLS = Path(__file__).resolve().parents[1] / "tools" / "sparkmods"


def test_no_module_calls_ast_parse_directly() -> None:
    """Host code only: the runtime runs in run.sh's single thread and may not import the host's
    modules; its one compile (boot.RuntimeLoader._compile, for the modules it loads) is allowed."""
    direct = [f"{p.relative_to(TOOLS)}:{n}" for p in sorted(TOOLS.rglob("*.py")) if p.name != "safeparse.py"
              for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
              if re.search(r"\bast\.parse\(|\bcompile\(", line) and "re.compile(" not in line]
    runtime = [d for d in direct if d.startswith("runtime/boot.py:")]
    assert len(runtime) == 1 and direct == runtime, "parse through sparkmods.pyindex.safeparse.parse: " + ", ".join(direct)


def test_parallel_parses_give_the_trees_a_serial_parse_gives() -> None:
    sources = [f"def f{i}(a, b={{'k': [{i}]}}):\n    return " + "(" * 40 + "a" + ")" * 40 + "\n" for i in range(64)]
    with ThreadPoolExecutor(8) as pool:
        trees = list(pool.map(safeparse.parse, sources))
    assert [ast.dump(t) for t in trees] == [ast.dump(ast.parse(s)) for s in sources]


def test_a_syntax_error_is_raised_as_ast_parse_raises_it() -> None:
    with pytest.raises(SyntaxError):
        safeparse.parse("def (:\n")
