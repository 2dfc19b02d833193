"""defscan.defines finds a module-level def or class in a file's bytes without parsing it, and
never claims one that is not there: lines inside string literals (docstrings above all),
indented defs, other names and other statements are not definitions."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from sparkmods.pyindex.defscan import defines
from sparkmods.pyindex.resolve import Module, VllmTree

TOOLS = Path(__file__).resolve().parents[1] / "tools" / "sparkmods"


@pytest.mark.parametrize("source", [
    b"class LinearBase(torch.nn.Module):\n    pass\n",
    b"class LinearBase:\n    pass\n",
    b"@decorated\ndef LinearBase(x):\n    return x\n",
    b"async def LinearBase ():\n    pass\n",
    b"'''doc'''\n# a comment with a quote ' in it\nx = \"\\\"\"\nclass LinearBase(Base):\n    pass\n",
    b"s = r'\\\\'\nclass LinearBase: pass\n",
    b"t = '''\n'''\r\nclass LinearBase: pass\n",
])
def test_a_module_level_definition_is_found(source: bytes) -> None:
    assert defines(source, "LinearBase")
    assert "LinearBase" in Module("vllm.x", "vllm/x.py", False, source).bindings


@pytest.mark.parametrize("source", [
    b'"""Example:\nclass LinearBase(Base):\n    pass\n"""\n',
    b"x = '''\ndef LinearBase(y):\n'''\n",
    b'x = "a\\\nclass LinearBase: pass"\n',
    b'"""an escaped quote \\""" is no end\nclass LinearBase: pass\n"""\n',
    b"class Other:\n    def LinearBase(self):\n        pass\n",
    b"class LinearBaseX(Base):\n    pass\n",
    b"# class LinearBase(Base):\n",
    b"LinearBase = make()\n",
    b"from vllm.y import LinearBase\n",
    b"if TYPE_CHECKING:\n    class LinearBase: pass\n",
    b"class LinearBase[T]: pass\n",
    b"x = '''\nclass LinearBase: pass\n",
])
def test_nothing_else_is_taken_for_a_definition(source: bytes) -> None:
    assert not defines(source, "LinearBase")


def test_only_ascii_identifiers_are_looked_for() -> None:
    assert not defines("class Größe: pass\n".encode(), "Größe")
    assert not defines(b"class A: pass\n", "A(")


def test_every_definition_found_in_this_repository_is_bound() -> None:
    """Soundness on real files: a name found is always one the parsed module binds (the
    check was also run over 4,000 files of the standard library and site-packages)."""
    found = 0
    for path in sorted(TOOLS.rglob("*.py")):
        data = path.read_bytes()
        bound = {n.name for n in ast.parse(data).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        for name in {m.decode() for m in re.findall(rb"(?:def|class)[ \t]+(\w+)", data)}:
            if defines(data, name):
                assert name in bound, (path, name)
                found += 1
    assert found > 300


def test_has_name_answers_a_visible_definition_without_parsing() -> None:
    files = {"vllm/__init__.py": b"", "vllm/x.py": b'"""doc"""\nclass Fp8Config:\n    pass\n\ndef helper(): pass\n'}
    tree = VllmTree(files.get)
    assert tree.has_name("vllm.x", "Fp8Config") == (True, "")
    assert not tree.module("vllm.x")._done  # not parsed
    assert tree.has_name("vllm.x", "Missing") == (False, "vllm/x.py defines no Missing")
    assert tree.module("vllm.x")._done

