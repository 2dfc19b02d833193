"""Semantic drift: a patch that applies cleanly can still break vLLM. On the patched files:

  syntax     every patched Python file parses;
  import     every name the patch imports from vLLM exists in that release (modules and
             names resolved by reading the tree's source with `ast`, never by importing);
  call       every vLLM function, method or class the patch calls accepts the arguments it
             passes (positional count, keyword names, required parameters);
  override   every method the patch defines or re-signs in a class accepts what the base
             class's method accepts in that release (vLLM calls hooks with new keywords).

Only code the patch adds or changes is checked (what vLLM ships is vLLM's business), and
anything Python decides at run time (module `__getattr__`, unknown decorators, bases outside
vLLM, `*args` at the call) is left alone rather than guessed: drift is reported only when
the release's source says the patched code cannot work.
"""

from __future__ import annotations

import ast
import bisect
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Set, Tuple, Union

from sparkmods.checking.driftmemo import Changes, DriftMemo, changes_key
from sparkmods.checking.linediff import changed_lines
from sparkmods.pyindex.resolve import Module, Signature, Symbol, VllmTree, module_name, parse, signature_keeping
from sparkmods.runtime.engine import APPLIED, OK, OK_OFFSET, plan_file
from sparkmods.runtime.modcheck import DRIFT, ModResult
from sparkmods.runtime.udiff import FilePatch, reverse

if TYPE_CHECKING:
    from sparkmods.sources.base import VllmSource

__all__ = ["DRIFT", "DriftFinding", "check_patched", "new_findings", "drift_status"]

Reader = Callable[[str], Optional[bytes]]
_CONSTRUCTORS = {"__init__", "__new__", "__post_init__", "__init_subclass__"}


@dataclass(frozen=True)
class DriftFinding:
    path: str
    line: int
    kind: str  # syntax, import, call, override
    message: str
    key: str  # identity without line numbers or path (files move), to compare releases

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"

    def to_dict(self) -> dict:
        return {"path": self.path, "line": self.line, "kind": self.kind, "message": self.message}


@functools.lru_cache(maxsize=64)
def _added_lines(before: Optional[bytes], after: bytes) -> FrozenSet[int]:
    """1-based line numbers of `after` that the patch added or changed, as difflib's
    SequenceMatcher marks them (linediff.py; kept for the next release, where the same file
    is usually patched the same way)."""
    new = after.decode("utf-8", "surrogateescape").splitlines()
    if before is None:
        return frozenset(range(1, len(new) + 1))
    old = before.decode("utf-8", "surrogateescape").splitlines()
    return frozenset(j + 1 for j in changed_lines(old, new))


def _touches(node: ast.AST, lines: Sequence[int], first: Optional[int] = None, last: Optional[int] = None) -> bool:
    """Whether a line of node's span (or of [first, last]) is in the sorted `lines`."""
    lo = first or int(getattr(node, "lineno", 0))
    hi = last or int(getattr(node, "end_lineno", None) or lo)
    i = bisect.bisect_left(lines, lo)
    return i < len(lines) and lines[i] <= hi


def _plain_super(call: ast.Call, cls: Symbol) -> bool:
    """`super()` or `super(EnclosingClass, self)`: both look up past the enclosing class; a
    super naming another class skips more of the MRO, which this check does not follow."""
    if not call.args and not call.keywords:
        return True
    return (len(call.args) == 2 and not call.keywords and isinstance(call.args[0], ast.Name)
            and call.args[0].id == cls.class_node.name)


def _first_line(node: Union[ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef]) -> int:
    """Where a def or class begins, its decorators included (they stand above `def`)."""
    return min([node.lineno] + [d.lineno for d in node.decorator_list])


class _FileCheck:
    """The checks for one patched file against one tree."""

    def __init__(self, tree: VllmTree, path: str, mod: Module, touched: FrozenSet[int],
                 import_lines: Sequence[int]) -> None:
        self.tree, self.path, self.mod = tree, path, mod
        self.touched = sorted(touched)
        self.import_lines = import_lines  # sorted lines whose text has "import": no other line can hold one
        self.found: List[DriftFinding] = []

    def add(self, node: ast.AST, kind: str, message: str, key: str) -> None:
        self.found.append(DriftFinding(self.path, getattr(node, "lineno", 0), kind, message, f"{kind}|{key}"))

    # -- walk with context (enclosing classes / functions) ------------------------------------
    def run(self, body: Sequence[ast.stmt]) -> List[DriftFinding]:
        """The findings in `body`, the statements of the parsed module `mod`."""
        self._walk(body, None, {})
        return self.found

    def _walk(self, body: Sequence[ast.stmt], cls: Optional[Symbol], local: Dict[str, ast.AST]) -> None:
        for node in body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    not _touches(node, self.touched, _first_line(node)):
                continue  # nothing the patch wrote is inside: no finding can come from here
            if isinstance(node, ast.ClassDef):
                sym = Symbol(self.mod, node, (cls.qualname + "." if cls else "") + node.name)
                self._walk(node.body, sym, local)
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if cls is not None and self._header_touched(node):
                    self._override(cls, node)
                inner = dict(local)
                if _touches(node, self.import_lines):  # a def without the word has nothing to walk for
                    inner.update(_local_imports(node, self.import_lines))
                self._scan(node.decorator_list + list(node.args.defaults) + [d for d in node.args.kw_defaults if d], cls, local)
                self._walk(node.body, cls if cls is not None else None, inner)
                continue
            self._scan([node], cls, local)

    def _header_touched(self, node: Union[ast.FunctionDef, ast.AsyncFunctionDef]) -> bool:
        last = node.body[0].lineno - 1 if node.body[0].lineno > node.lineno else node.lineno
        return _touches(node, self.touched, _first_line(node), last)

    def _scan(self, nodes: Iterable[ast.AST], cls: Optional[Symbol], local: Dict[str, ast.AST]) -> None:
        for top in nodes:
            if getattr(top, "end_lineno", None) is not None and not _touches(top, self.touched):
                continue  # a node's children lie within its lines
            guarded: Set[int] = set()
            for node in _walk_no_defs(top, self.touched):
                if isinstance(node, ast.Try) and _catches_import_error(node):
                    guarded.update(id(n) for stmt in node.body for n in ast.walk(stmt))
                if isinstance(node, (ast.Import, ast.ImportFrom)) and _touches(node, self.touched):
                    if id(node) not in guarded:
                        self._import(node)
                elif isinstance(node, ast.Call) and _touches(node, self.touched):
                    self._call(node, cls, local)

    # -- imports ---------------------------------------------------------------------------------
    def _import(self, node: Union[ast.Import, ast.ImportFrom]) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "vllm" and not self.tree.exists(alias.name):
                    self.add(node, "import", f"`import {alias.name}`: no such module in this vLLM", alias.name)
            return
        target = self.mod.absolute(node.level, node.module)
        if target is None or target.split(".")[0] != "vllm":
            return
        if not self.tree.exists(target):
            self.add(node, "import", f"`from {target} import ...`: module {target} does not exist in this vLLM", target)
            return
        for alias in node.names:
            if alias.name == "*":
                continue
            found, why = self.tree.has_name(target, alias.name)
            if found is False:
                self.add(node, "import", f"`from {target} import {alias.name}`: {why}", f"{target}:{alias.name}")

    # -- calls -----------------------------------------------------------------------------------
    def _callee(self, func: ast.expr, cls: Optional[Symbol], local: Dict[str, ast.AST]) -> Tuple[Optional[Symbol], bool, str]:
        """(def or class, whether the first parameter is bound, how the callee was named)."""
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in ("self", "cls") and cls:
            m = self.tree.member(cls, func.attr)
            return m, True, f"{func.value.id}.{func.attr}"
        if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call) and isinstance(func.value.func, ast.Name)
                and func.value.func.id == "super" and cls):
            if not _plain_super(func.value, cls):
                return None, False, ""  # super(Other, self) starts past Other in the MRO: not judged
            return self.tree.member(cls, func.attr, skip_self=True), True, f"super().{func.attr}"
        if isinstance(func, (ast.Name, ast.Attribute)):
            target = self.tree.resolve_expr(self.mod, func, local)
            if isinstance(target, Symbol):
                bound = isinstance(func, ast.Attribute) and _is_classmethod(target.node)
                return target, bound, ast.unparse(func)
        return None, False, ""

    def _call(self, call: ast.Call, cls: Optional[Symbol], local: Dict[str, ast.AST]) -> None:
        sym, bound, named = self._callee(call.func, cls, local)
        if sym is None or not sym.module.name.startswith("vllm"):
            return
        if isinstance(sym.node, ast.ClassDef):
            if self.tree.generated_init(sym):
                return
            init = self.tree.member(sym, "__init__")
            if init is None:
                return
            sym, bound = init, True
        node = sym.def_node
        if not signature_keeping(node):
            return
        sig = Signature.of(node, in_class=sym.in_class)
        if sig.kind == "staticmethod":
            bound = False
        elif sig.kind == "classmethod":
            bound = True
        problems = _bind(sig.bound() if bound else sig, call)
        for problem in problems:
            self.add(call, "call", f"{named}(...): {problem}; {sym.qualname}{sig.text()} is at {sym.where}",
                     f"{sym.qualname}:{problem}")

    # -- overrides ---------------------------------------------------------------------------------
    def _override(self, cls: Symbol, node: Union[ast.FunctionDef, ast.AsyncFunctionDef]) -> None:
        if node.name in _CONSTRUCTORS or not signature_keeping(node):
            return  # constructors of subclasses legitimately take other arguments
        base = self.tree.member(cls, node.name, skip_self=True)
        if base is None or not base.module.name.startswith("vllm") or not signature_keeping(base.node):
            return
        mine = Signature.of(node, in_class=True)
        theirs = Signature.of(base.def_node, in_class=True)
        if mine.kind != theirs.kind:
            return
        if mine.kind != "staticmethod":
            mine, theirs = mine.bound(), theirs.bound()
        for problem in _accepts(mine, theirs):
            self.add(node, "override", f"{cls.qualname}.{node.name}{mine.text()} overrides "
                                       f"{base.qualname}{theirs.text()} ({base.where}) but {problem}",
                     f"{cls.qualname}.{node.name}:{problem}")


_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


_IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})


def _catches_import_error(node: ast.Try) -> bool:
    """Whether a handler of this try catches a failed import: code that says "this name may be
    missing" (e.g. one module serving several releases) is not drift when it is."""
    for handler in node.handlers:
        kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if any(k is None or (isinstance(k, ast.Name) and k.id in _IMPORT_ERRORS) for k in kinds):
            return True
    return False


def _walk_no_defs(node: ast.AST, touched: Sequence[int]) -> Iterable[ast.AST]:
    """ast.walk that does not enter nested defs/classes/lambdas (they are walked with context)
    and skips children that span none of the sorted `touched` lines (a node's children lie
    within its lines, so nothing there can be touched). ast.iter_child_nodes' order, without
    its two generators per node: the walk runs over every node the patches wrote."""
    stack = [node]
    while stack:
        cur = stack.pop()
        yield cur
        for field in cur._fields:
            value = getattr(cur, field, None)
            for child in value if isinstance(value, list) else (value,):
                if not isinstance(child, ast.AST) or isinstance(child, _NESTED):
                    continue
                end = getattr(child, "end_lineno", None)
                if end is not None:
                    i = bisect.bisect_left(touched, child.lineno)  # type: ignore[attr-defined]  # a node with end_lineno has lineno
                    if i == len(touched) or touched[i] > end:
                        continue
                stack.append(child)


def _local_imports(fn: ast.AST, import_lines: Sequence[int]) -> Dict[str, ast.AST]:
    """The names a def's own imports bind (later ones win); only the parts of it that span a
    line with the word `import` are walked, as no import statement can lie elsewhere."""
    out: Dict[str, ast.AST] = {}
    for node in _walk_no_defs(fn, import_lines):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                out[alias.asname or alias.name] = node
        elif isinstance(node, ast.Import):
            for alias in node.names:
                out[alias.asname or alias.name.split(".")[0]] = alias
    return out


def _is_classmethod(node: ast.AST) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "classmethod" for d in getattr(node, "decorator_list", []))


def _bind(sig: Signature, call: ast.Call) -> List[str]:
    """Why the call's arguments cannot bind to sig (empty: they can, or we cannot tell)."""
    starred = any(isinstance(a, ast.Starred) for a in call.args)
    dstar = any(k.arg is None for k in call.keywords)
    npos = len(call.args)
    problems = []
    if not starred and not sig.vararg and npos > len(sig.positional):
        problems.append(f"passes {npos} positional arguments, the function takes {len(sig.positional)}")
    for kw in call.keywords:
        if kw.arg is not None and kw.arg not in sig.keywords and not sig.kwarg:
            problems.append(f"no parameter named {kw.arg!r}")
    if not starred and not dstar:
        given = set(sig.positional[:npos]) | {k.arg for k in call.keywords if k.arg}
        missing = [r for r in sig.required if r not in given]
        if missing:
            problems.append("does not pass required " + ", ".join(repr(m) for m in missing))
    return problems


def _accepts(mine: Signature, theirs: Signature) -> List[str]:
    """Why an override `mine` cannot take every call the base method `theirs` can."""
    problems = []
    missing = [n for n in theirs.keywords if n not in mine.keywords and not mine.kwarg]
    if missing:
        problems.append("does not accept " + ", ".join(repr(n) for n in missing))
    for i, name in enumerate(theirs.positional):
        # Required parameters may come positionally; optional ones are passed by keyword by
        # vLLM's hook callers, so `(self, model_name, **kwargs)` is a compatible override.
        if name in theirs.required and i >= len(mine.positional) and not mine.vararg:
            problems.append(f"takes no positional argument #{i + 1} ({name!r})")
    if theirs.vararg and not mine.vararg:
        problems.append("does not take *args")
    if theirs.kwarg and not mine.kwarg:
        problems.append("does not take **kwargs")
    extra = [r for r in mine.required if r not in theirs.positional + theirs.keywords]
    if extra:
        problems.append("requires " + ", ".join(repr(n) for n in extra) + ", which callers of the base do not pass")
    return problems


_MEMO: DriftMemo[Tuple[DriftFinding, ...]] = DriftMemo()


def check_patched(changes: Changes, read: Reader, list_files: Optional[Callable[[], Sequence[str]]] = None) -> List[DriftFinding]:
    """Drift findings for the patched files in `changes`, seen in the tree `read` serves
    (taken from the process's memo when an earlier tree answered the same; driftmemo.py)."""
    overlay = {p: after for p, (_, after) in changes.items()}
    tree = VllmTree(lambda p: overlay[p] if p in overlay else read(p), list_files)
    key = changes_key(changes)
    known = _MEMO.lookup(key, tree)
    if known is not None:
        return list(known)
    found = _findings(changes, tree)
    _MEMO.store(key, tree.observed, tuple(found))
    return found


def _findings(changes: Changes, tree: VllmTree) -> List[DriftFinding]:
    found: List[DriftFinding] = []
    for path in sorted(changes):
        before, after = changes[path]
        name = module_name(path)
        if after is None or name is None:
            continue
        try:
            parse(after)
        except SyntaxError as exc:
            if before is not None and not _parses(before):
                continue  # not Python this interpreter reads, before the patch either
            found.append(DriftFinding(path, exc.lineno or 0, "syntax", f"does not parse: {exc.msg}",
                                 f"syntax|{exc.msg}"))
            continue
        mod = tree.module(name)
        parsed = mod.tree if mod is not None else None
        if mod is None or parsed is None:
            continue
        found.extend(_FileCheck(tree, path, mod, _added_lines(before, after), _import_lines(after)).run(parsed.body))
    return found


def _import_lines(data: bytes) -> List[int]:
    """1-based numbers of the lines that contain `import` (as Python counts lines: \\n, \\r\\n
    or \\r ends one), so that an import statement can only start on one of them."""
    return [i for i, line in enumerate(data.splitlines(), 1) if b"import" in line]


def _parses(data: bytes) -> bool:
    try:
        parse(data)
        return True
    except (SyntaxError, ValueError):
        return False


def new_findings(onto: Sequence[DriftFinding], base: Sequence[DriftFinding]) -> List[DriftFinding]:
    """Findings on onto that the same patch did not have on its base release."""
    known = {f.key for f in base}
    return [f for f in onto if f.key not in known]


def drift_status(source: VllmSource, mod_result: ModResult, patches: Optional[Sequence[FilePatch]] = None) -> Optional[Tuple[str, str]]:
    """("drift", reason) when a mod that applies to `source` would break it; else None.

    `sparkmods check` (batch.check_source) calls it for every green variant row and replaces
    the status with `drift` when it returns a value. `applied` rows need the variant's parsed
    patches (to recover the unpatched file). `source` needs read() and, optionally, list_files().
    """
    if mod_result.status not in (OK, OK_OFFSET, APPLIED):
        return None
    by_path = {fp.path: fp for fp in patches or []}
    changes: Changes = {}
    for f in mod_result.files:
        if f.status in (OK, OK_OFFSET) and (f.after is not None or f.before is not None):
            changes[f.path] = (f.before, f.after)
        elif f.status == APPLIED and f.before is not None and f.path in by_path:
            original = plan_file(reverse(by_path[f.path]), f.before)
            if original.status in (OK, OK_OFFSET) and original.after is not None:
                changes[f.path] = (original.after, f.before)
    if not changes:
        return None
    findings = check_patched(changes, source.read, getattr(source, "list_files", None))
    if not findings:
        return None
    text = "; ".join(str(f) for f in findings[:3])
    more = f" (+{len(findings) - 3} more)" if len(findings) > 3 else ""
    return DRIFT, text + more
