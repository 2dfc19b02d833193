"""A Python file as statements in blocks: what the anchoring rules reason about.

Every statement gets its line span (decorators included), the block it sits in and its
position there, and the qualified name of the enclosing def/class. Statements are compared
by their AST (formatting-insensitive `ast.dump`), so a statement reflowed by a formatter is
still "the same statement". Line numbers here are 0-based; `end` is exclusive.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import itertools
import tokenize
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence

from sparkmods.pyindex import safeparse

__all__ = ["Stmt", "Block", "PyFile", "parse_py", "indent_of", "is_trivia"]

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_BODY_FIELDS = ("body", "orelse", "finalbody")


def indent_of(line: str) -> int:
    """Columns of leading whitespace (tabs count as one column, like ast's col_offset)."""
    return len(line) - len(line.lstrip(" \t"))


def is_trivia(line: str) -> bool:
    """A line that no statement owns when it sits between statements: blank or comment."""
    text = line.strip()
    return not text or text.startswith("#")


@dataclass(eq=False)
class Block:
    """One statement list: a module, a def/class body, an if/else branch, a handler body..."""

    owner: Optional["Stmt"]
    field: str  # body, orelse, finalbody, handler:<dump>, case:<dump>
    stmts: List["Stmt"] = dataclasses.field(default_factory=list)  # (`field` is a field name here)
    head_end: Optional[int] = None  # first line after the block's header (None: unknown)
    elif_: bool = False  # the orelse of an `if` that is an `elif` chain

    @property
    def indent(self) -> Optional[int]:
        return self.stmts[0].indent if self.stmts else None


@dataclass(eq=False)
class Stmt:
    node: ast.stmt
    start: int
    end: int
    block: Block
    index: int
    scope: str  # qualname of the enclosing def/class; "" at module level
    indent: int
    blocks: List[Block] = dataclasses.field(default_factory=list)  # the blocks this statement owns

    @property
    def is_def(self) -> bool:
        return isinstance(self.node, _DEFS)

    @property
    def qualname(self) -> str:
        name = getattr(self.node, "name", "")
        return f"{self.scope}.{name}" if self.scope else name

    @property
    def inner_scope(self) -> str:
        """The scope of the statements this one owns."""
        return self.qualname if self.is_def else self.scope


class PyFile:
    """A parsed Python file; build with `parse_py` (None when the text does not parse)."""

    def __init__(self, lines: Sequence[str], tree: ast.Module) -> None:
        self.lines = list(lines)
        self.module = Block(None, "body", head_end=0)
        self.stmts: List[Stmt] = []
        self._keys: Dict[int, str] = {}
        self._head_keys: Dict[int, str] = {}
        self._fill(self.module, tree.body, "")
        self.defs: Dict[str, List[Stmt]] = {}
        for st in self.stmts:
            if st.is_def:
                self.defs.setdefault(st.qualname, []).append(st)

    # -- construction -------------------------------------------------------------------
    def _fill(self, block: Block, nodes: List[ast.stmt], scope: str) -> None:
        for index, node in enumerate(nodes):
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
            end = node.end_lineno or node.lineno
            st = Stmt(node, start, end, block, index, scope, indent_of(self.lines[start]))
            block.stmts.append(st)
            self.stmts.append(st)
            inner = st.inner_scope
            for name in _BODY_FIELDS:
                body = getattr(node, name, None)
                if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                    if name == "orelse" and isinstance(node, ast.If) and _is_elif(self.lines, body[0]):
                        # an elif: its If sits at the outer indentation; no slots of its own
                        sub = Block(st, "orelse", head_end=None, elif_=True)
                    else:
                        sub = Block(st, name, head_end=self._head_end(st, name, body))
                    st.blocks.append(sub)
                    self._fill(sub, body, inner)
            for handler in getattr(node, "handlers", []) or []:
                sub = Block(st, "handler:" + ast.dump(handler.type) if handler.type else "handler:",
                            head_end=self._colon_end(handler.lineno - 1))
                st.blocks.append(sub)
                self._fill(sub, handler.body, inner)
            for case in getattr(node, "cases", []) or []:
                sub = Block(st, "case:" + ast.dump(case.pattern) + ast.dump(case.guard or ast.Constant(None)),
                            head_end=self._colon_end(case.pattern.lineno - 1))
                st.blocks.append(sub)
                self._fill(sub, case.body, inner)

    def _head_end(self, st: Stmt, name: str, body: List[ast.stmt]) -> Optional[int]:
        if name == "body":
            return self._colon_end(st.node.lineno - 1)
        # `else:` / `finally:` have no AST position: find the keyword line above the block.
        first = body[0].lineno - 1
        keyword = "else" if name == "orelse" else "finally"
        for i in range(first - 1, st.start, -1):
            code = self.lines[i].split("#", 1)[0].strip()
            if code == keyword + ":":
                return i + 1
            if code:
                return None
        return None

    def _colon_end(self, first: int) -> Optional[int]:
        """The line after the `:` that ends a compound statement's header starting at `first`."""
        depth = 0
        rest = itertools.islice(self.lines, first, None)
        try:
            for tok in tokenize.generate_tokens(lambda: next(rest, "")):
                if tok.type == tokenize.OP:
                    if tok.string in "([{":
                        depth += 1
                    elif tok.string in ")]}":
                        depth -= 1
                    elif tok.string == ":" and depth == 0:
                        return first + tok.end[0]
                elif tok.type == tokenize.NAME and tok.string == "lambda" and depth == 0:
                    return None  # a lambda's colon at depth 0 would fool us: give up
        except (tokenize.TokenError, IndentationError, SyntaxError):
            return None
        return None

    # -- queries -------------------------------------------------------------------------
    def key(self, st: Stmt) -> str:
        """Formatting-insensitive identity of the whole statement."""
        k = self._keys.get(id(st))
        if k is None:
            k = self._keys[id(st)] = ast.dump(st.node)
        return k

    def head_key(self, st: Stmt) -> str:
        """Identity of a compound statement's header only (its bodies left out)."""
        k = self._head_keys.get(id(st))
        if k is None:
            shallow = copy.copy(st.node)
            for name in _BODY_FIELDS + ("handlers", "cases"):
                if hasattr(shallow, name):
                    setattr(shallow, name, [])
            k = self._head_keys[id(st)] = ast.dump(shallow)
        return k

    def text(self, start: int, end: int) -> List[str]:
        return self.lines[start:end]

    def head_span(self, st: Stmt) -> Optional[int]:
        """End of a compound statement's header (first body line), None for simple ones."""
        for block in st.blocks:
            if block.field == "body" or block.field.startswith("case:"):
                return block.head_end
        return None

    def in_scope(self, scope: str) -> Iterator[Stmt]:
        """Every statement whose enclosing def/class is `scope` (any nesting of if/for/...)."""
        return (st for st in self.stmts if st.scope == scope)

    def innermost(self, base_start: int, base_end: int) -> Optional[Stmt]:
        """The innermost statement whose span holds lines [base_start, base_end) and, for an insertion
        (base_start == base_end), holds the point strictly inside."""
        best = None
        for st in self.stmts:
            if base_start == base_end:
                inside = st.start < base_start < st.end
            else:
                inside = st.start <= base_start and base_end <= st.end
            if inside:
                best = st  # statements are in pre-order: a later hit is nested deeper
        return best

    def scope_at(self, line: int) -> str:
        """Qualname of the innermost def/class whose span holds the line ("" for module level)."""
        best = ""
        for st in self.stmts:
            if st.is_def and st.start <= line < st.end:
                best = st.qualname
        return best

    def find_def(self, other: "PyFile", st: Stmt) -> Optional[Stmt]:
        """The def/class in this file that is `st` (a def of `other`): same qualname, and
        when several share it (property setters, overloads), the same decorators."""
        mine = self.defs.get(st.qualname, [])
        theirs = other.defs.get(st.qualname, [])
        if len(mine) > 1 or len(theirs) > 1:
            want = _decorators(st)
            mine = [c for c in mine if _decorators(c) == want]
            theirs = [c for c in theirs if _decorators(c) == want]
        return mine[0] if len(mine) == 1 and len(theirs) == 1 else None

    def scope_exists(self, other: "PyFile", scope: str) -> bool:
        """True when `scope` (a qualname of other) names exactly one def/class here too."""
        if not scope:
            return True
        return len(self.defs.get(scope, [])) == 1 and len(other.defs.get(scope, [])) == 1


def _decorators(st: Stmt) -> List[str]:
    return [ast.dump(d) for d in getattr(st.node, "decorator_list", [])]


def _is_elif(lines: Sequence[str], node: ast.stmt) -> bool:
    return lines[node.lineno - 1].lstrip().startswith("elif")


def parse_py(lines: Sequence[str]) -> Optional[PyFile]:
    """A PyFile, or None when the text is not Python this interpreter can parse."""
    try:
        tree = safeparse.parse("".join(lines))
    except (SyntaxError, ValueError, RecursionError):
        return None
    return PyFile(lines, tree)
