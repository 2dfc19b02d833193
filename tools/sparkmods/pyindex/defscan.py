"""Whether a Python file defines a module-level def or class of a given name, read from its
bytes without parsing it.

The drift checks ask of every `from vllm.x import Y` a patch writes whether vllm.x binds Y;
most imported names are a def or a class, and those are found here without parsing vllm.x
whole (modules such as layers/linear.py are asked only whether they define one class).

A line that begins with `def Y(`, `async def Y(` or `class Y(` / `class Y:` in a file that
parses is a module-level statement defining Y unless it lies inside a string literal: no
other place can hold a line that begins so (inside brackets, after a backslash or anywhere
else these words start no valid code). String literals and comments are skipped from the
start of the file up to the line. A file that does not parse has no module-level names to
read at all, and the drift checks treat "cannot tell" (what resolve.VllmTree.has_name says
then) like "bound": neither is a finding, so this answer changes no check's result.
Only ASCII names are looked for (the bytes of a file in another encoding could spell them
otherwise); False means "not found here", never "not defined".
"""

from __future__ import annotations

import re

__all__ = ["defines"]

_TOKEN = re.compile(rb"#|'''|\"\"\"|'|\"")


def defines(data: bytes, name: str) -> bool:
    """True when data has a module-level def or class named `name` (see the module docstring)."""
    if not (name.isascii() and name.isidentifier()):
        return False
    word = re.escape(name.encode("ascii"))
    line = re.compile(rb"^(?:(?:async[ \t]+)?def[ \t]+" + word + rb"[ \t]*\(|class[ \t]+" + word + rb"[ \t]*[(:])",
                      re.MULTILINE)
    scanned = 0  # data[:scanned] is outside any literal or comment
    for found in line.finditer(data):
        scanned = _skip_literals(data, scanned, found.start())
        if scanned < 0:
            return False  # the rest lies inside an unterminated literal
        if scanned <= found.start():
            return True
    return False


def _skip_literals(data: bytes, pos: int, stop: int) -> int:
    """From pos (outside literals and comments), past every string literal and comment that
    starts before stop: where the scan stands then (> stop: stop is inside one; -1: a
    literal never ends)."""
    while True:
        token = _TOKEN.search(data, pos, stop)
        if token is None:
            return max(pos, stop)
        if token.group() == b"#":
            end = data.find(b"\n", token.end())
            pos = len(data) if end < 0 else end + 1
        else:
            pos = _literal_end(data, token.end(), token.group())
            if pos < 0:
                return -1
        if pos > stop:
            return pos


def _literal_end(data: bytes, start: int, quote: bytes) -> int:
    """Where the literal opened by quote (ending just before start) ends: after the first
    occurrence of quote not escaped by a backslash (in raw strings too: r"\\"" is one
    literal); -1 when there is none."""
    at = start
    while True:
        at = data.find(quote, at)
        if at < 0:
            return -1
        backslashes = 0
        while at - backslashes - 1 >= start and data[at - backslashes - 1] == 0x5C:
            backslashes += 1
        if backslashes % 2 == 0:
            return at + len(quote)
        at += 1
