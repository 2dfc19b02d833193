"""The lint and type gates: `ruff check` and `mypy` with the configuration in pyproject.toml
report nothing. Both come with the test extra (CI installs it); where one is missing the test
says so and skips. And sparkmods' modules import one another without a cycle."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(tool: str, args: List[str]) -> subprocess.CompletedProcess:
    if importlib.util.find_spec(tool) is None:
        pytest.skip(f"{tool} is not installed (pip install -e .[test] brings it)")
    return subprocess.run([sys.executable, "-m", tool, *args], cwd=REPO, capture_output=True, text=True)


def test_ruff_reports_nothing() -> None:
    done = _run("ruff", ["check", "--quiet"])
    assert done.returncode == 0 and not done.stdout, done.stdout + done.stderr


def test_mypy_reports_nothing() -> None:
    done = _run("mypy", [])
    assert done.returncode == 0, done.stdout + done.stderr


def _module_names(root: Path) -> Dict[str, Path]:
    """Dotted module name -> file, for every .py under root/sparkmods (packages by their __init__)."""
    names = {}
    for path in (root / "sparkmods").rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _imported(name: str, path: Path, node: ast.AST, names: Dict[str, Path]) -> List[str]:
    """The project modules an import statement in module `name` loads, nearest existing module first."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    if isinstance(node, ast.Import):
        wanted = [alias.name for alias in node.names]
    else:
        assert isinstance(node, ast.ImportFrom)
        base = node.module or ""
        if node.level:
            base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1], *filter(None, [node.module])])
        wanted = [f"{base}.{alias.name}" for alias in node.names] + [base]
    found = []
    for target in wanted:
        while target and target not in names:
            target = target.rpartition(".")[0]
        if target:
            found.append(target)
    return found


def import_graph(root: Path) -> Dict[str, Set[str]]:
    """Module -> the project modules it imports, at the top or inside a function; a package's
    submodules importing the package itself are left out (it is already loading them)."""
    names = _module_names(root)
    graph: Dict[str, Set[str]] = {name: set() for name in names}
    for name, path in names.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[name].update(t for t in _imported(name, path, node, names)
                                   if t != name and not name.startswith(t + "."))
    return graph


def find_cycle(graph: Dict[str, Set[str]]) -> List[str]:
    """One import cycle as [a, b, ..., a], or [] when there is none."""
    state: Dict[str, str] = {}
    stack: List[str] = []

    def visit(node: str) -> List[str]:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return []

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return []


def test_function_level_imports_hide_no_import_cycle() -> None:
    """Imports inside functions are for start-up time only, never a way around a cycle: counted
    with them, sparkmods' modules import one another without one."""
    graph = import_graph(REPO / "tools")
    assert len(graph) > 100 and graph["sparkmods.cli"]
    assert find_cycle(graph) == []


def test_a_cycle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "sparkmods" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "sparkmods" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from .a import run\n")
    (pkg / "a.py").write_text("from sparkmods.sub import b\n\ndef run():\n    return b.VALUE\n")
    (pkg / "b.py").write_text("VALUE = 1\n\ndef later():\n    from . import a\n    return a\n")
    graph = import_graph(tmp_path)
    assert graph["sparkmods.sub.a"] == {"sparkmods.sub.b"} and graph["sparkmods.sub"] == {"sparkmods.sub.a"}
    assert find_cycle(graph) == ["sparkmods.sub.a", "sparkmods.sub.b", "sparkmods.sub.a"]
    (pkg / "b.py").write_text("VALUE = 1\n")
    assert find_cycle(import_graph(tmp_path)) == []
