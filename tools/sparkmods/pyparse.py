"""`ast.parse` that is safe to call from the check and matrix thread pools.

CPython 3.11 keeps the AST validator's recursion-depth bookkeeping in state shared between
threads that release the GIL mid-parse, so two threads parsing at once can fail with
"SystemError: AST constructor recursion depth mismatch" (seen in CI on 3.11.7 with the
8-thread check pool). Parsing is CPU-bound and holds the GIL anyway, so serialising it costs
nothing; every parse in the tool goes through here.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str) -> ast.Module:
    """ast.parse(source) under one process-wide lock (raises SyntaxError as ast.parse does)."""
    with _LOCK:
        return ast.parse(source)
