"""Read a vLLM tree's Python statically: which names a module binds, where a name really is
defined (through re-exports), and what signature a function has - all with `ast`, never by
importing vLLM (which needs a GPU stack and runs import-time code).

Used by the drift checks. Answers are three-valued where Python is dynamic: a module with a
module-level `__getattr__`, an extension module or a star import we cannot follow gives
"unknown", which the checks treat as fine rather than invent a problem.
"""

from __future__ import annotations

import ast
import bisect
import hashlib
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar, Union

from sparkmods.pyindex import safeparse
from sparkmods.pyindex.defscan import defines

__all__ = ["Module", "Symbol", "Signature", "VllmTree", "module_name", "absolute", "signature_keeping", "parse"]

Reader = Callable[[str], Optional[bytes]]
MAX_DEPTH = 12
# Decorators that leave a function's call signature as it was.
KEEPS_SIGNATURE = {"staticmethod", "classmethod", "abstractmethod", "override", "cache", "lru_cache",
                   "inference_mode", "no_grad", "contextmanager", "asynccontextmanager", "deprecated",
                   "wraps", "final"}
# try statements: `try: ... except* ...` (ast.TryStar) from Python 3.11
if sys.version_info >= (3, 11):
    _TRY = (ast.Try, ast.TryStar)
else:
    _TRY = (ast.Try,)
K = TypeVar("K")
V = TypeVar("V")


def module_name(path: str) -> Optional[str]:
    """vllm/a/b.py -> vllm.a.b; vllm/a/__init__.py -> vllm.a; None for non-Python paths."""
    if not path.endswith(".py"):
        return None
    parts = path[:-3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def absolute(current: str, is_package: bool, level: int, module: Optional[str]) -> Optional[str]:
    """The absolute module a (possibly relative) import names, seen from module `current`."""
    if level == 0:
        return module
    parts = current.split(".")
    if not is_package:
        parts = parts[:-1]
    if level - 1 > len(parts):
        return None
    base = parts[:len(parts) - (level - 1)] if level > 1 else parts
    return ".".join(base + ([module] if module else [])) or None


@dataclass
class Signature:
    posonly: List[str]
    args: List[str]
    vararg: bool
    kwonly: List[str]
    kwarg: bool
    required: List[str]  # parameters without a default
    kind: str  # "function", "method", "staticmethod", "classmethod"

    @classmethod
    def of(cls, node: Union[ast.FunctionDef, ast.AsyncFunctionDef], in_class: bool) -> "Signature":
        a = node.args
        positional = [x.arg for x in a.posonlyargs + a.args]
        defaults = len(a.defaults)
        required = positional[:len(positional) - defaults] if defaults else list(positional)
        required += [x.arg for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is None]
        names = {_decorator_name(d) for d in node.decorator_list}
        kind = "function"
        if in_class:
            kind = "staticmethod" if "staticmethod" in names else "classmethod" if "classmethod" in names else "method"
        return cls([x.arg for x in a.posonlyargs], [x.arg for x in a.args], a.vararg is not None,
                   [x.arg for x in a.kwonlyargs], a.kwarg is not None, required, kind)

    def bound(self) -> "Signature":
        """The signature with its first parameter (self or cls) already supplied."""
        pos = self.posonly + self.args
        if not pos:
            return self
        first = pos[0]
        return Signature(self.posonly[1:] if self.posonly else [], self.args if self.posonly else self.args[1:],
                         self.vararg, self.kwonly, self.kwarg, [r for r in self.required if r != first], self.kind)

    @property
    def positional(self) -> List[str]:
        return self.posonly + self.args

    @property
    def keywords(self) -> List[str]:
        return self.args + self.kwonly

    def text(self) -> str:
        parts = list(self.posonly) + (["/"] if self.posonly else []) + list(self.args)
        if self.vararg:
            parts.append("*args")
        elif self.kwonly:
            parts.append("*")
        parts += self.kwonly
        if self.kwarg:
            parts.append("**kwargs")
        return "(" + ", ".join(parts) + ")"


def _decorator_name(node: ast.expr) -> str:
    while isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


class Module:
    """One module of a tree. Its source is parsed, and its module-level names collected, on
    first use of `tree` or the tables: a module asked about only for existence (`import
    vllm.x`, a package's submodule) is never parsed."""

    def __init__(self, name: str, path: str, is_package: bool, data: Optional[bytes] = None,
                 dynamic: bool = False) -> None:
        self.name, self.path, self.is_package = name, path, is_package
        self._data = data  # None: not Python we can read (namespace package, extension module)
        self._dynamic = dynamic
        self._done = data is None  # parsed and collected (or nothing to parse)
        self._tree: Optional[ast.Module] = None
        self._bindings: Dict[str, List[ast.AST]] = {}
        self._typing_only: Dict[str, List[ast.AST]] = {}
        self._stars: List[str] = []
        self._all_names: Optional[List[str]] = None

    def _ready(self) -> "Module":
        """Parse and collect once (under a lock: Modules are shared by the check threads).

        `_done` turns true only after the tables are complete: a thread that finds it false
        waits on the lock, so nobody reads half-collected tables (that read "defines no
        Fp8Config" in one matrix cell while another thread was still collecting fp8.py).
        """
        if not self._done:
            with _COLLECTING:
                if not self._done:
                    data, self._data = self._data, None
                    assert data is not None  # not done: there is source to parse
                    try:
                        self._tree = _PARSED.parse(data)
                    except (SyntaxError, ValueError):
                        self._tree = None
                    if self._tree is not None:
                        _collect(self, self._tree.body, typing_only=False)
                    self._done = True
        return self

    @property
    def tree(self) -> Optional[ast.Module]:
        """None: not Python we can read (extension module, namespace package, syntax error)."""
        return self._ready()._tree

    @property
    def bindings(self) -> Dict[str, List[ast.AST]]:
        return self._ready()._bindings

    @property
    def typing_only(self) -> Dict[str, List[ast.AST]]:
        return self._ready()._typing_only

    @property
    def stars(self) -> List[str]:
        return self._ready()._stars

    @property
    def dynamic(self) -> bool:
        """A module-level __getattr__ (or no Python to read): names it has are unknowable."""
        return self._ready()._dynamic

    @property
    def all_names(self) -> Optional[List[str]]:
        return self._ready()._all_names

    def absolute(self, level: int, module: Optional[str]) -> Optional[str]:
        return absolute(self.name, self.is_package, level, module)

    def defines(self, name: str) -> bool:
        """A module-level def or class `name` found in the source without parsing it
        (defscan.py; a syntax error elsewhere is possible: has_name says why that is fine).
        False when not found so, or once parsed (the tables answer then)."""
        data = self._data
        return data is not None and not self._done and defines(data, name)


_COLLECTING = threading.RLock()


@dataclass
class Symbol:
    module: Module
    node: ast.AST  # FunctionDef / AsyncFunctionDef / ClassDef
    qualname: str
    in_class: bool = False  # a def found as a class member (a method)

    @property
    def where(self) -> str:
        return f"{self.module.path}:{getattr(self.node, 'lineno', 0)}"

    @property
    def class_node(self) -> ast.ClassDef:
        """The node of a class symbol; asked of a def, a caller's bug, it raises."""
        if not isinstance(self.node, ast.ClassDef):
            raise TypeError(f"{self.qualname} ({self.where}) is not a class")
        return self.node

    @property
    def def_node(self) -> Union[ast.FunctionDef, ast.AsyncFunctionDef]:
        """The node of a def symbol; asked of a class, a caller's bug, it raises."""
        if not isinstance(self.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            raise TypeError(f"{self.qualname} ({self.where}) is not a def")
        return self.node


def _bind_targets(target: ast.AST, out: List[str]) -> None:
    if isinstance(target, ast.Name):
        out.append(target.id)
    elif isinstance(target, (ast.Tuple, ast.List)):
        for t in target.elts:
            _bind_targets(t, out)
    elif isinstance(target, ast.Starred):
        _bind_targets(target.value, out)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _collect(mod: Module, body: Sequence[ast.stmt], typing_only: bool) -> None:
    """Record what the statements bind at module level (TYPE_CHECKING imports apart)."""
    table = mod._typing_only if typing_only else mod._bindings
    for node in body:
        names: List[str] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
            if node.name == "__getattr__" and not isinstance(node, ast.ClassDef):
                mod._dynamic = True
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                _bind_targets(t, names)
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                mod._all_names = _literal_strings(node.value)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and getattr(node, "value", None) is not None:
            _bind_targets(node.target, names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                table.setdefault(alias.asname or alias.name.split(".")[0], []).append(alias)
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    target = mod.absolute(node.level, node.module)
                    if target:
                        mod._stars.append(target)
                else:
                    table.setdefault(alias.asname or alias.name, []).append(node)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            _bind_targets(node.target, names)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    _bind_targets(item.optional_vars, names)
        for n in names:
            table.setdefault(n, []).append(node)
        if isinstance(node, ast.If):
            _collect(mod, node.body, typing_only or _is_type_checking(node.test))
            _collect(mod, node.orelse, typing_only)
        elif isinstance(node, _TRY):
            for block in [node.body, node.orelse, node.finalbody] + [h.body for h in node.handlers]:
                _collect(mod, block, typing_only)
        elif isinstance(node, (ast.With, ast.AsyncWith, ast.For, ast.AsyncFor, ast.While)):
            _collect(mod, node.body, typing_only)


class _ParseCache:
    """Parsed files by content, and the Modules collected from them by (path, content), shared
    by every tree of a run.

    A check reads the same vLLM files for every mod, and most files are byte-identical from one
    release or nightly to the next, so each distinct file is parsed once (a SyntaxError is kept
    like a tree). Trees and Modules are never changed once built, which is what makes sharing
    them safe. Bounded, least recently used first, so a run over many builds stays small.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._parsed: "OrderedDict[bytes, Union[ast.Module, SyntaxError, ValueError]]" = OrderedDict()
        self._modules: "OrderedDict[Tuple[str, bytes], Module]" = OrderedDict()

    def _get(self, table: "OrderedDict[K, V]", key: K) -> Optional[V]:
        with self._lock:
            found = table.get(key)
            if found is not None:
                table.move_to_end(key)
            return found

    def _put(self, table: "OrderedDict[K, V]", key: K, value: V) -> None:
        with self._lock:
            table[key] = value
            while len(table) > self._limit:
                table.popitem(last=False)

    def parse(self, data: bytes) -> ast.Module:
        """safeparse.parse(data), answered once per distinct content."""
        key = hashlib.sha1(data).digest()
        found = self._get(self._parsed, key)
        if found is None:
            try:
                found = safeparse.parse(data)
            except (SyntaxError, ValueError) as exc:
                found = exc
            self._put(self._parsed, key, found)
        if isinstance(found, (SyntaxError, ValueError)):
            raise found.with_traceback(None)
        return found

    def module(self, name: str, path: str, package: bool, data: bytes) -> Module:
        """The Module for (path, content), shared; parsed when first asked about its names."""
        key = (path, hashlib.sha1(data).digest())
        found = self._get(self._modules, key)
        if found is None:
            found = Module(name, path, package, data)
            self._put(self._modules, key, found)
        return found


_PARSED = _ParseCache(limit=256)
parse = _PARSED.parse


class Listing:
    """A tree's file list, sorted, asked about names that are no .py file: folders (namespace
    packages) and extension modules. A lookup is a binary search, not a scan of every file."""

    def __init__(self, files: Sequence[str]) -> None:
        self._files = sorted(files)

    def _under(self, prefix: str) -> Iterator[str]:
        """The files whose path starts with prefix, in order."""
        i = bisect.bisect_left(self._files, prefix)
        while i < len(self._files) and self._files[i].startswith(prefix):
            yield self._files[i]
            i += 1

    def is_folder(self, base: str) -> bool:
        return next(self._under(base + "/"), None) is not None

    def is_extension(self, base: str) -> bool:
        return any(f.endswith((".so", ".pyd")) for f in self._under(base + "."))


# One question a VllmTree asked of its source, with the answer: ("read", path, sha1 of the
# bytes or None when absent), ("folder", base, bool) or ("extension", base, bool).
Observation = Tuple[str, str, object]


class VllmTree:
    """Modules of one vLLM tree, parsed on demand and cached (read: package path -> bytes).

    Every question asked of the source is kept in `observed`, in order: all that anything
    computed from this tree can depend on (driftmemo.py reuses results by it)."""

    def __init__(self, read: Reader, list_files: Optional[Callable[[], Sequence[str]]] = None) -> None:
        self._read = read
        self._list_files = list_files
        self._listed: Optional[Listing] = None
        self._modules: Dict[str, Optional[Module]] = {}
        self.observed: List[Observation] = []

    def answer(self, question: Observation) -> object:
        """What this tree's source answers to a recorded question (the answer slot ignored)."""
        kind, path, _ = question
        if kind == "read":
            data = self._read(path)
            return None if data is None else hashlib.sha1(data).digest()
        listing = self._listing()
        return listing.is_folder(path) if kind == "folder" else listing.is_extension(path)

    def _ask(self, kind: str, path: str) -> object:
        answer = self.answer((kind, path, None))
        self.observed.append((kind, path, answer))
        return answer

    # -- modules -------------------------------------------------------------------------
    def module(self, name: str) -> Optional[Module]:
        if name not in self._modules:
            self._modules[name] = self._load(name)
        return self._modules[name]

    def _load(self, name: str) -> Optional[Module]:
        base = name.replace(".", "/")
        for path, package in ((base + ".py", False), (base + "/__init__.py", True)):
            data = self._read(path)
            self.observed.append(("read", path, None if data is None else hashlib.sha1(data).digest()))
            if data is not None:
                return _PARSED.module(name, path, package, data)
        if self._ask("folder", base):
            return Module(name, base + "/", True, dynamic=True)  # namespace package
        if self._ask("extension", base):
            return Module(name, base + ".so", False, dynamic=True)  # extension module
        return None

    def _listing(self) -> "Listing":
        if self._listed is None:
            self._listed = Listing(self._list_files() if self._list_files else ())
        return self._listed

    def exists(self, name: str) -> bool:
        return self.module(name) is not None

    # -- names -----------------------------------------------------------------------------
    def has_name(self, modname: str, name: str, depth: int = 0) -> Tuple[Optional[bool], str]:
        """(True, "") bound; (False, why) missing; (None, why) cannot tell (dynamic module).

        A def or class the source visibly defines is (True, "") without parsing the module
        (Module.defines), even where a syntax error elsewhere would make it (None, why): the
        drift checks, its only user, find nothing in either case."""
        mod = self.module(modname)
        if mod is None:
            return False, f"module {modname} does not exist"
        if mod.is_package and self.exists(f"{modname}.{name}"):
            return True, ""
        if mod.defines(name) or name in mod.bindings:
            return True, ""
        for star in mod.stars:
            if depth < MAX_DEPTH:
                inner = self.module(star)
                if inner is not None and inner.all_names is not None and name not in inner.all_names:
                    continue
                found, _ = self.has_name(star, name, depth + 1)
                if found is not False:
                    return found, ""
        if mod.dynamic or mod.tree is None:
            return None, f"{mod.path} provides names dynamically"
        if name in mod.typing_only:
            return False, f"{mod.path} imports {name} only under TYPE_CHECKING"
        return False, f"{mod.path} defines no {name}"

    def resolve(self, modname: str, name: str, depth: int = 0) -> Optional[Union[Symbol, Module]]:
        """Where `modname.name` is defined: a def/class Symbol, a Module, or None (unknown)."""
        if depth > MAX_DEPTH:
            return None
        mod = self.module(modname)
        if mod is None:
            return None
        nodes = mod.bindings.get(name, [])
        if len(nodes) != 1:
            if not nodes and mod.is_package:
                return self.module(f"{modname}.{name}")
            if not nodes:
                for star in mod.stars:
                    found = self.resolve(star, name, depth + 1)
                    if found is not None:
                        return found
            return None
        node = nodes[0]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return Symbol(mod, node, name)
        if isinstance(node, ast.ImportFrom):
            alias = next(a for a in node.names if (a.asname or a.name) == name)
            target = mod.absolute(node.level, node.module)
            if target is None:
                return None
            return self.resolve(target, alias.name, depth + 1)
        if isinstance(node, ast.alias):
            return self.module(node.name) if node.asname else self.module(node.name.split(".")[0])
        return None

    def resolve_expr(self, mod: Module, expr: ast.expr, local: Optional[Dict[str, ast.AST]] = None) -> Optional[Union[Symbol, Module]]:
        """A Name or dotted Attribute seen from module `mod` (plus function-local imports)."""
        if isinstance(expr, ast.Name):
            node = (local or {}).get(expr.id)
            if node is not None:
                return self._from_import_node(mod, node, expr.id)
            return self.resolve(mod.name, expr.id)
        if isinstance(expr, ast.Attribute):
            owner = self.resolve_expr(mod, expr.value, local)
            if isinstance(owner, Module):
                return self.resolve(owner.name, expr.attr)
            if isinstance(owner, Symbol) and isinstance(owner.node, ast.ClassDef):
                return self.member(owner, expr.attr)
        return None

    def _from_import_node(self, mod: Module, node: ast.AST, name: str) -> Optional[Union[Symbol, Module]]:
        if isinstance(node, ast.ImportFrom):
            alias = next(a for a in node.names if (a.asname or a.name) == name)
            target = mod.absolute(node.level, node.module)
            if target is None:
                return None
            return self.resolve(target, alias.name) or self.module(f"{target}.{alias.name}")
        if isinstance(node, ast.alias):
            return self.module(node.name) if node.asname else self.module(node.name.split(".")[0])
        return None

    # -- classes ---------------------------------------------------------------------------
    def bases(self, cls: Symbol) -> List[Optional[Symbol]]:
        """The class's bases as Symbols (None for one we cannot read, e.g. torch.nn.Module)."""
        out: List[Optional[Symbol]] = []
        for expr in cls.class_node.bases:
            if isinstance(expr, ast.Subscript):  # Generic[T], SomeBase[X]
                expr = expr.value
            if isinstance(expr, ast.Name) and expr.id in ("object", "ABC", "Protocol", "Generic"):
                continue
            found = self.resolve_expr(cls.module, expr)
            out.append(found if isinstance(found, Symbol) and isinstance(found.node, ast.ClassDef) else None)
        return out

    def member(self, cls: Symbol, name: str, depth: int = 0, skip_self: bool = False) -> Optional[Symbol]:
        """The def `name` that the class (or, in MRO-like order, a base) provides; None when
        it is nowhere to be found or a base we cannot read might provide it."""
        if depth > MAX_DEPTH:
            return None
        if not skip_self:
            defs = [n for n in cls.class_node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and n.name == name]
            if defs:
                return Symbol(cls.module, defs[0], f"{cls.qualname}.{name}", True) if len(defs) == 1 else None
            if any(isinstance(n, (ast.Assign, ast.AnnAssign)) and name in _assigned(n) for n in cls.class_node.body):
                return None
        for base in self.bases(cls):
            if base is None:
                return None
            found = self.member(base, name, depth + 1)
            if found is not None:
                return found
        return None

    def generated_init(self, cls: Symbol, depth: int = 0) -> bool:
        """True when __init__ may be generated or replaced (dataclass-like decorators,
        metaclasses, __new__, unreadable bases): its signature is then not checked."""
        node = cls.class_node
        if node.decorator_list or node.keywords or depth > MAX_DEPTH:
            return True
        if any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "__new__" for n in node.body):
            return True
        if any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "__init__" for n in node.body):
            return False
        return any(b is None or self.generated_init(b, depth + 1) for b in self.bases(cls))


def _assigned(node: ast.AST) -> List[str]:
    names: List[str] = []
    for t in getattr(node, "targets", [getattr(node, "target", None)]):
        if t is not None:
            _bind_targets(t, names)
    return names


def _literal_strings(node: ast.expr) -> Optional[List[str]]:
    if not isinstance(node, (ast.List, ast.Tuple)):
        return None
    strings = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return strings if len(strings) == len(node.elts) else None


def signature_keeping(node: ast.AST) -> bool:
    """True when every decorator of the def leaves its signature alone."""
    return all(_decorator_name(d) in KEEPS_SIGNATURE for d in getattr(node, "decorator_list", []))
