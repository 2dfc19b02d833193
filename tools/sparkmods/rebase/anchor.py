"""Python-aware placement: where an edit of base goes in onto, found through the code's
structure instead of through line context.

Rules (each returns a placement only when it is unambiguous; otherwise a reason):
  statement     an insertion between two statements of a block: the neighbours are found in
                the same block of onto (same def/class by qualified name, same branch) by
                their AST (a def/class neighbour by its name); when one neighbour changed
                upstream, the other must still be found and the changed one must still be
                recognisably there (similar text) or gone;
  block-start   an insertion at the top of a body: the body's owner is found (def/class by
                qualified name, others by their header's AST) even when its header changed;
  import        an import inserted into an import block: neighbouring imports are recognised
                by the module they import from, so a reformatted or extended import still anchors;
  replace       removed lines that are whole statements: the same statements (by AST) once in
                the counterpart block; reformatted statements are replaced whole;
  intra         an edit inside one statement (an argument line, a decorator, a parameter):
                that statement (or, for a header edit, that header) is unchanged in onto.
Everything else is refused, with the reason, for a human.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Callable, List, Optional, Sequence, Set, Tuple, Union

from sparkmods.pyindex import safeparse

from .pyscope import Block, PyFile, Stmt, indent_of, is_trivia

__all__ = ["Placement", "Anchorer"]

SIMILAR = 0.6  # a changed neighbour must keep this much of its text to count as "still there"


@dataclass(frozen=True)
class Placement:
    onto_start: int
    onto_end: int
    rule: str


Result = Tuple[Optional[Placement], str]


@dataclass(frozen=True)
class Answer:
    """A placement, or why not; `veto` marks an edit inside a statement that upstream changed,
    which must be flagged even when the line alignment alone would carry it."""

    placement: Optional[Placement]
    reason: str = ""
    veto: bool = False


class Anchorer:
    def __init__(self, base: PyFile, onto: PyFile) -> None:
        self.b, self.o = base, onto

    # -- entry point ---------------------------------------------------------------------
    def place(self, base_start: int, base_end: int, new: Sequence[str]) -> Answer:
        veto = self._cut_statement_changed(base_start, base_end)
        if veto:
            return Answer(None, veto, veto=True)
        if base_start == base_end:
            slot = self._slot(base_start, base_end, new)
            if slot is not None:
                return Answer(*self._insert(base_start, new, *slot))
            return self._intra(base_start, base_end)
        aligned = self._aligned(base_start, base_end)
        if aligned is not None:
            if isinstance(aligned, str):
                return Answer(None, aligned)
            return Answer(*self._replace(base_start, base_end, *aligned))
        if all(is_trivia(line) for line in self.b.lines[base_start:base_end]):
            slot = self._slot(base_start, base_end, self.b.lines[base_start:base_end])
            if slot is None:
                return Answer(None, "edits comment lines whose place cannot be told")
            return Answer(*self._gap_edit(base_start, base_end, *slot))
        return self._intra(base_start, base_end)

    def _cut_statement_changed(self, base_start: int, base_end: int) -> str:
        """Why the edit must be flagged whatever else says: it cuts into a simple statement
        (changes some of its lines, or inserts inside it) that upstream changed too. A line
        merge would combine both edits of one statement; its meaning changed under us."""
        for st in self.b.stmts:
            if st.blocks:
                continue
            if base_start == base_end:
                inside = st.start < base_start < st.end
            else:
                inside = st.start < base_end and base_start < st.end
            if not inside or (base_start != base_end and base_start <= st.start and st.end <= base_end):
                continue
            key = self.b.key(st)
            if not self.o.scope_exists(self.b, st.scope):
                continue
            if not any(self.o.key(x) == key for x in self.o.in_scope(st.scope)):
                return f"{_describe(st)} changed upstream"
        return ""

    # -- base-side structure ---------------------------------------------------------------
    def _blocks(self, pf: PyFile) -> List[Block]:
        out = [pf.module]
        for st in pf.stmts:
            out.extend(st.blocks)
        return out

    def _gap_end(self, pf: PyFile, start: int) -> int:
        i = start
        while i < len(pf.lines) and is_trivia(pf.lines[i]):
            i += 1
        return i

    def _gap(self, pf: PyFile, block: Block, j: int) -> Optional[Tuple[int, int]]:
        """Lines [g0, g1) between statement j-1 and j of block (j may be 0 or len)."""
        stmts = block.stmts
        g0 = stmts[j - 1].end if j > 0 else block.head_end
        if g0 is None:
            return None
        g1 = stmts[j].start if j < len(stmts) else self._gap_end(pf, g0)
        return (g0, g1) if g0 <= g1 else None

    def _slot(self, base_start: int, base_end: int, lines: Sequence[str]) -> Optional[Tuple[Block, int, int, int]]:
        """The one (block, j, g0, g1) whose gap holds [base_start, base_end) at the lines' indentation."""
        code = [line for line in lines if not is_trivia(line)] or [line for line in lines if line.strip()]
        want = indent_of(code[0]) if code else None
        found = []
        for block in self._blocks(self.b):
            if not block.stmts or block.elif_ or (want is not None and block.indent != want):
                continue
            for j in range(len(block.stmts) + 1):
                gap = self._gap(self.b, block, j)
                if gap and gap[0] <= base_start and base_end <= gap[1]:
                    found.append((block, j, gap[0], gap[1]))
        return found[0] if len(found) == 1 else None

    # -- counterpart lookup ----------------------------------------------------------------
    def _unique(self, pf: PyFile, stmts: Sequence[Stmt], key: str, keyf: Callable[[PyFile, Stmt], str]) -> Optional[Stmt]:
        hits = [s for s in stmts if keyf(pf, s) == key]
        return hits[0] if len(hits) == 1 else None

    def counterpart_owner(self, owner: Stmt) -> Optional[Stmt]:
        if owner.is_def:
            return self.o.find_def(self.b, owner)
        if not self.o.scope_exists(self.b, owner.scope):
            return None
        head = self.b.head_key(owner)
        if sum(1 for s in self.b.in_scope(owner.scope) if self.b.head_key(s) == head) != 1:
            return None
        return self._unique(self.o, list(self.o.in_scope(owner.scope)), head, PyFile.head_key)

    def counterpart_block(self, block: Block) -> Optional[Block]:
        if block.owner is None:
            return self.o.module
        owner = self.counterpart_owner(block.owner)
        if owner is None:
            return None
        same = [b for b in owner.blocks if b.field == block.field]
        if len(same) != 1 or (same[0].stmts and same[0].indent != block.indent):
            return None
        return same[0]

    def search_space(self, block: Block) -> Optional[Tuple[List[Stmt], List[Stmt]]]:
        """(base statements, onto statements) among which a statement of `block` must be
        unique: the block and its counterpart when the counterpart's owner is found; else
        every block of the same kind and indentation in the same def/class on both sides
        (the neighbours themselves then tell which block it is)."""
        oblock = self.counterpart_block(block)
        if oblock is not None:
            return block.stmts, oblock.stmts
        scope = block.stmts[0].scope
        if block.owner is None or not self.o.scope_exists(self.b, scope):
            return None
        kind = block.field.split(":")[0]

        def peers(pf: PyFile) -> List[Stmt]:
            return [s for s in pf.in_scope(scope) if s.block.owner is not None
                    and s.block.field.split(":")[0] == kind and s.indent == block.indent]
        return peers(self.b), peers(self.o)

    def _find(self, space: Tuple[List[Stmt], List[Stmt]], st: Optional[Stmt], imports: bool) -> Optional[Stmt]:
        """st's counterpart: the one onto statement with its AST (or, for imports, its module)."""
        if st is None:
            return None
        keyf = _import_key if imports and _is_import(st.node) else _def_key if st.is_def else PyFile.key
        key = keyf(self.b, st)
        if sum(1 for s in space[0] if keyf(self.b, s) == key) != 1:
            return None
        return self._unique(self.o, space[1], key, keyf)

    def _matches_any(self, block: Block, vo: Stmt, after: Optional[int] = None, before: Optional[int] = None) -> bool:
        key = self.o.key(vo)
        for s in block.stmts:
            if (after is None or s.index > after) and (before is None or s.index < before) and self.b.key(s) == key:
                return True
        return False

    def _similar(self, st: Stmt, vo: Stmt) -> bool:
        a = [line.strip() for line in self.b.text(st.start, st.end)]
        c = [line.strip() for line in self.o.text(vo.start, vo.end)]
        if sum(map(len, a)) + sum(map(len, c)) > 2000:  # long statements: line by line (bounded cost)
            m = SequenceMatcher(None, a, c, autojunk=False)
        else:
            m = SequenceMatcher(None, "\n".join(a), "\n".join(c), autojunk=False)
        return m.real_quick_ratio() >= SIMILAR and m.quick_ratio() >= SIMILAR and m.ratio() >= SIMILAR

    # -- insertions between statements -----------------------------------------------------
    def _insert(self, p: int, new: Sequence[str], block: Block, j: int, g0: int, g1: int) -> Result:
        space = self.search_space(block)
        if space is None:
            return None, f"the enclosing {_where(block)} is not found in onto (renamed, removed or ambiguous)"
        imports = _all_imports(new)
        s = block.stmts[j - 1] if j > 0 else None
        t = block.stmts[j] if j < len(block.stmts) else None
        so, to = self._find(space, s, imports), self._find(space, t, imports)
        oblock = self._block_of(block, so, to)
        if oblock is None:
            return None, (f"the enclosing {_where(block)} is not found in onto (renamed, removed or ambiguous)"
                          if so is None and to is None else "the statements around the insertion are no longer in one block")
        slot, why = self._decide(block, oblock, j, s, t, so, to, imports)
        if slot is None:
            return None, why
        rule = "import" if imports else ("block-start" if j == 0 else "statement")
        return self._gap_place(p, p, g0, g1, oblock, slot, rule)

    def _block_of(self, block: Block, so: Optional[Stmt], to: Optional[Stmt]) -> Optional[Block]:
        """The onto block: the counterpart found through the owner, else the neighbours' block."""
        oblock = self.counterpart_block(block)
        if oblock is not None:
            return oblock if oblock.stmts else None
        found = {id(x.block): x.block for x in (so, to) if x is not None}
        return next(iter(found.values())) if len(found) == 1 else None

    def _decide(self, block: Block, oblock: Block, j: int, s: Optional[Stmt], t: Optional[Stmt],
                so: Optional[Stmt], to: Optional[Stmt], imports: bool) -> Tuple[Optional[int], str]:
        """The slot index in oblock between the counterparts of s and t, or None and why."""
        ostmts = oblock.stmts
        if so is not None and to is not None:
            if to.index == so.index + 1:
                return to.index, ""
            return None, "onto has other code between the statements around the insertion"
        if s is None:  # the top of a body stays the top, whatever upstream did below it
            if to is not None:
                return (0, "") if to.index == 0 else (None, "onto has new code at the top of the block")
            if _is_docstring(ostmts[0]) and not _is_docstring(t):  # type: ignore[arg-type]  # s is None: j == 0, so t is the block's first statement (a body has one)
                return None, "onto added a docstring where the insertion goes"
            return 0, ""
        if t is None:  # the end of a body stays the end
            if so is not None:
                return (so.index + 1, "") if so.index == len(ostmts) - 1 else (
                    None, "onto has new code at the end of the block")
            return len(ostmts), ""
        if so is not None:  # t changed or went away
            nxt = ostmts[so.index + 1] if so.index + 1 < len(ostmts) else None
            if nxt is None or self._similar(t, nxt) or self._matches_any(block, nxt, after=t.index) or (
                    imports and _is_import(nxt.node)):
                return so.index + 1, ""
            return None, "the statement after the insertion changed beyond recognition"
        if to is not None:  # s changed or went away
            prv = ostmts[to.index - 1] if to.index > 0 else None
            if prv is None or self._similar(s, prv) or self._matches_any(block, prv, before=s.index) or (
                    imports and _is_import(prv.node)):
                return to.index, ""
            return None, "the statement before the insertion changed beyond recognition"
        return None, "both statements around the insertion changed upstream"

    def _gap_place(self, base_start: int, base_end: int, g0: int, g1: int, oblock: Block, slot: int,
                   rule: str) -> Result:
        """Carry a position inside the base gap [g0, g1) into the onto gap at slot."""
        h = self._gap(self.o, oblock, slot)
        if h is None:
            return None, "the header of the block could not be located in onto"
        h0, h1 = h
        if self.b.lines[g0:g1] == self.o.lines[h0:h1]:
            return Placement(h0 + (base_start - g0), h0 + (base_end - g0), rule), ""
        if base_start == base_end == g0:
            return Placement(h0, h0, rule), ""
        return None, "the comments or blank lines around it changed upstream"

    def _gap_edit(self, base_start: int, base_end: int, block: Block, j: int, g0: int, g1: int) -> Result:
        space = self.search_space(block)
        if space is None:
            return None, f"the enclosing {_where(block)} is not found in onto"
        s = block.stmts[j - 1] if j > 0 else None
        t = block.stmts[j] if j < len(block.stmts) else None
        so, to = self._find(space, s, False), self._find(space, t, False)
        oblock = self._block_of(block, so, to)
        if oblock is None or (s is not None and so is None) or (t is not None and to is None):
            return None, "the statements around the edited comment lines changed upstream"
        slot = to.index if to is not None else (so.index + 1 if so is not None else 0)
        if so is not None and to is not None and to.index != so.index + 1:
            return None, "onto has other code between the statements around the edited lines"
        return self._gap_place(base_start, base_end, g0, g1, oblock, slot, "statement")

    # -- replacing whole statements ----------------------------------------------------------
    def _aligned(self, base_start: int, base_end: int) -> Union[str, Tuple[Block, int, int], None]:
        """(block, i, k) when [base_start, base_end) is statements i..k of one block plus blank/comment
        lines; a reason string when it partly overlaps statements; None when it holds none."""
        inside = [s for s in self.b.stmts if base_start <= s.start and s.end <= base_end]
        if not inside:
            return None
        top = [s for s in inside if not (s.block.owner is not None and s.block.owner in inside)]
        block = top[0].block
        idx = [s.index for s in top]
        if any(s.block is not block for s in top) or idx != list(range(idx[0], idx[-1] + 1)):
            return "the removed lines span statements of different blocks"
        for s in self.b.stmts:
            overlaps = s.start < base_end and base_start < s.end
            if overlaps and s not in inside and not (s.start <= base_start and base_end <= s.end):
                return None  # cuts through a statement: an intra-statement edit
        covered: Set[int] = set()
        for s in top:
            covered.update(range(s.start, s.end))
        if any(not is_trivia(self.b.lines[i]) for i in range(base_start, base_end) if i not in covered):
            return "the removed lines are not whole statements"
        return block, idx[0], idx[-1]

    def _replace(self, base_start: int, base_end: int, block: Block, i: int, k: int) -> Result:
        space = self.search_space(block)
        if space is None:
            return None, f"the enclosing {_where(block)} is not found in onto (renamed, removed or ambiguous)"
        keys = [self.b.key(s) for s in block.stmts[i:k + 1]]
        if len(_runs_of(self.b, space[0], keys)) != 1:
            return None, "the removed statements occur more than once in their block"
        hits = _runs_of(self.o, space[1], keys)
        if len(hits) != 1:
            why = "changed or removed upstream" if not hits else "found more than once"
            return None, f"the removed statements are {why} in onto"
        first, last = hits[0][0], hits[0][-1]
        bs, bt = block.stmts[i].start, block.stmts[k].end
        lead, trail = self.b.lines[base_start:bs], self.b.lines[bt:base_end]
        onto_start, onto_end = first.start - len(lead), last.end + len(trail)
        if self.b.lines[bs:bt] == self.o.lines[first.start:last.end]:
            if (onto_start >= 0 and self.o.lines[onto_start:first.start] == lead
                    and self.o.lines[last.end:onto_end] == trail):
                return Placement(onto_start, onto_end, "replace"), ""
            return None, "the comments around the removed statements changed upstream"
        if lead or trail or first.indent != block.stmts[i].indent:
            return None, "the removed statements were reformatted upstream together with comments around them"
        return Placement(first.start, last.end, "replace-reformatted"), ""

    # -- edits inside one statement -------------------------------------------------------------
    def _intra(self, base_start: int, base_end: int) -> Answer:
        st = self.b.innermost(base_start, base_end)
        if st is None:
            return Answer(None, "not inside any statement and not between statements")
        if not self.o.scope_exists(self.b, st.scope):
            return Answer(None, f"{st.scope or 'the module'} is not found once in onto")
        head = self.b.head_span(st)
        if head is not None and base_start < head and base_end <= head:
            so = self.counterpart_owner(st)
            if so is not None:
                ohead = self.o.head_span(so)
                if ohead is not None and self.b.text(st.start, head) == self.o.text(so.start, ohead):
                    return Answer(Placement(so.start + (base_start - st.start), so.start + (base_end - st.start),
                                            "intra-header"))
                return Answer(None, f"the header of {_describe(st)} changed upstream", veto=True)
            return Answer(None, f"{_describe(st)} is not found once in onto")
        key = self.b.key(st)
        mine = list(self.o.in_scope(st.scope))
        if sum(1 for s in self.b.in_scope(st.scope) if self.b.key(s) == key) != 1:
            return Answer(None, f"{_describe(st)} occurs more than once")
        so = self._unique(self.o, mine, key, PyFile.key)
        if so is None:
            return Answer(None, f"{_describe(st)} changed upstream")
        if self.b.text(st.start, st.end) != self.o.text(so.start, so.end):
            return Answer(None, f"{_describe(st)} was reformatted upstream")
        return Answer(Placement(so.start + (base_start - st.start), so.start + (base_end - st.start), "intra"))


def _runs_of(pf: PyFile, stmts: Sequence[Stmt], keys: List[str]) -> List[List[Stmt]]:
    """Every run of consecutive siblings among stmts whose ASTs are `keys`."""
    hits = []
    for st in stmts:
        sibs = st.block.stmts
        run = sibs[st.index:st.index + len(keys)]
        if len(run) == len(keys) and all(pf.key(x) == k for x, k in zip(run, keys)):
            hits.append(run)
    return hits


def _is_docstring(st: Stmt) -> bool:
    node = st.node
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _is_import(node: ast.AST) -> bool:
    return isinstance(node, (ast.Import, ast.ImportFrom))


def _import_key(pf: PyFile, st: Stmt) -> str:
    node = st.node
    if isinstance(node, ast.ImportFrom):
        return f"from:{node.level}:{node.module}"
    if isinstance(node, ast.Import):
        return "import:" + ",".join(sorted(a.name for a in node.names))
    return pf.key(st)


def _def_key(pf: PyFile, st: Stmt) -> str:
    """A def or class is itself by name, whatever upstream did inside it."""
    return "def:" + st.qualname + ":" + ",".join(ast.dump(d) for d in getattr(st.node, "decorator_list", []))


def _all_imports(new: Sequence[str]) -> bool:
    text = "".join(new)
    if not text.strip():
        return False
    try:
        tree = safeparse.parse(textwrap.dedent(text))
    except SyntaxError:
        return False
    return bool(tree.body) and all(_is_import(n) for n in tree.body)


def _describe(st: Stmt) -> str:
    name = getattr(st.node, "name", None)
    kind = type(st.node).__name__
    where = f" in {st.scope}" if st.scope else ""
    return f"{kind} {name}{where}" if name else f"the {kind} statement at base line {st.start + 1}{where}"


def _where(block: Block) -> str:
    if block.owner is None:
        return "module"
    return _describe(block.owner) + ("" if block.field == "body" else f" ({block.field.split(':')[0]})")
