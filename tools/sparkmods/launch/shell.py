"""Bash text helpers: every value that reaches a script goes through shlex.quote here.

Nothing user-supplied is ever interpolated raw into bash: not JSON with braces, not paths with
spaces, not node names. Secrets never reach these helpers as values, only as names. shlex.quote
writes POSIX single quotes (`'"'"'` for a quote), read alike by bash and dash; words the script
sends over ssh are quoted again at run time by the script's posix_words (standalone.py).
"""

from __future__ import annotations

import shlex
from typing import Iterable, List, Sequence

__all__ = ["q", "assign", "array", "rows", "comment", "header"]


def q(value: object) -> str:
    text = shlex.quote(str(value))
    # Commas are safe unquoted, but shellcheck reads `(a,b)` as a mistaken array: quote them.
    return f"'{text}'" if "," in text and not text.startswith("'") else text


def assign(name: str, value: object) -> str:
    return f"{name}={q(value)}"


def array(name: str, items: Sequence[object], per_line: int = 0) -> str:
    """`name=(a b c)`; with per_line, long arrays wrap every per_line items for review."""
    words = [q(i) for i in items]
    if not per_line or len(words) <= per_line:
        return f"{name}=({' '.join(words)})"
    rows = [" ".join(words[k:k + per_line]) for k in range(0, len(words), per_line)]
    return f"{name}=(\n    " + "\n    ".join(rows) + "\n)"


def rows(name: str, groups: Sequence[Sequence[object]]) -> str:
    """`name=(...)` with one group of words per line (an option and its value, say)."""
    body = "\n    ".join(" ".join(q(w) for w in group) for group in groups)
    return f"{name}=(\n    {body}\n)"


def comment(text: str) -> str:
    """A comment line; control characters (a newline would end the comment) become spaces."""
    clean = "".join(c if c.isprintable() else " " for c in text)
    return f"# {clean}".rstrip()


def header(lines: Iterable[str]) -> List[str]:
    """Shebang, the explanatory comment block, strict mode."""
    return ["#!/usr/bin/env bash", *(comment(line) for line in lines), "set -euo pipefail", ""]
