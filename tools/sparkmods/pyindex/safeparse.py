"""`ast.parse` that is safe to call from the check and matrix thread pools.

CPython 3.11 keeps the AST validator's recursion-depth bookkeeping in state shared between
threads that release the GIL mid-parse, so two threads parsing at once can fail with
"SystemError: AST constructor recursion depth mismatch". Parsing is CPU-bound and holds the GIL anyway, so serialising it costs
nothing; every parse in the tool goes through here.

The cyclic garbage collector is paused while the parser builds a tree: a large file is
hundreds of thousands of new node objects, each allocation counts towards a collection, and
every full collection walks all the trees kept alive by the parse cache. A tree holds no
reference cycles, so pausing it frees nothing later (the figures:
ci/bench/results/host-constants-any-cpu.md).
"""

from __future__ import annotations

import ast
import threading

from sparkmods.pyindex import gcpause

_LOCK = threading.Lock()


def parse(source: str | bytes) -> ast.Module:
    """ast.parse(source) under one process-wide lock (raises SyntaxError as ast.parse does)."""
    with _LOCK, gcpause.paused():
        return ast.parse(source)
