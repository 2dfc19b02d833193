"""Facts about the target vLLM, read from its own source files rather than guessed.

Which speculative methods it accepts and which KV-cache dtypes it knows are `Literal[...]`
type aliases in vllm/config/speculative.py and vllm/config/cache.py; we evaluate those aliases
with `ast` (no import, so this works on a wheel read over HTTP or an image we never start).
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Dict, FrozenSet, Iterable, Optional, Set

from sparkmods.pyindex import safeparse

if TYPE_CHECKING:
    from sparkmods.sources.base import VllmSource

__all__ = ["VllmFacts", "literal_alias", "SPECULATIVE_PY", "CACHE_PY", "ARG_UTILS_PY", "RUNNER_PY", "KV_INTERFACE_PY"]

SPECULATIVE_PY = "vllm/config/speculative.py"
CACHE_PY = "vllm/config/cache.py"
ARG_UTILS_PY = "vllm/engine/arg_utils.py"
# vLLM 0.20.x refuses TurboQuant KV caches on hybrid models with this message; 0.21 lifted it.
TURBOQUANT_HYBRID_REFUSAL = "TurboQuant KV cache is not supported for hybrid"
# vLLM 0.25.0-0.26.x: the model runner shapes every layer whose cache spec has no quantisation
# mode as "auto", and TurboQuant layers get no mode before 0.27.0 adds `is_turboquant` to the
# spec, so no turboquant_* cache starts (ValueError: Unknown TurboQuant cache dtype: 'auto';
# seen on the H100, ci/bench/results/gpu-e2e-0.26.0-h100/). From 0.29 the runner test is gone.
RUNNER_PY = "vllm/v1/worker/gpu_model_runner.py"
KV_INTERFACE_PY = "vllm/v1/kv_cache_interface.py"
RUNNER_AUTO_SHAPE = "kv_quant_mode == KVQuantMode.NONE"
TURBOQUANT_SPEC_MODE = "def is_turboquant"


def _aliases(tree: ast.Module) -> Dict[str, ast.expr]:
    """Module-level `Name = <expr>` and `Name: TypeAlias = <expr>` assignments."""
    out: Dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            out[node.target.id] = node.value
    return out


def _is_literal(node: ast.expr) -> bool:
    func = node.value if isinstance(node, ast.Subscript) else None
    return (isinstance(func, ast.Name) and func.id == "Literal") or (
        isinstance(func, ast.Attribute) and func.attr == "Literal")


def _strings(node: ast.expr, aliases: Dict[str, ast.expr], seen: Set[str]) -> Optional[Set[str]]:
    """The strings a Literal alias admits; None when it is not a (nested) Literal of strings."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Name):
        if node.id in seen or node.id not in aliases:
            return None
        return _strings(aliases[node.id], aliases, seen | {node.id})
    if isinstance(node, ast.Subscript) and _is_literal(node):
        items: Iterable[ast.expr] = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        out: Set[str] = set()
        for item in items:
            got = _strings(item, aliases, seen)
            if got is None:
                return None
            out |= got
        return out
    return None


def literal_alias(source_text: str, name: str) -> Optional[FrozenSet[str]]:
    """Evaluate the module-level Literal alias `name` of a Python file; None if absent/unknown."""
    try:
        tree = safeparse.parse(source_text)
    except SyntaxError:
        return None
    aliases = _aliases(tree)
    if name not in aliases:
        return None
    got = _strings(aliases[name], aliases, {name})
    return frozenset(got) if got is not None else None


class VllmFacts:
    """Lazy, cached reads of one VllmSource (anything with label, version, read(), prefetch())."""

    def __init__(self, source: VllmSource) -> None:
        self.source = source
        self._text: Dict[str, Optional[str]] = {}

    @property
    def label(self) -> str:
        return f"vLLM {self.source.version} ({self.source.label})"

    def prefetch(self) -> None:
        self.source.prefetch([SPECULATIVE_PY, CACHE_PY, ARG_UTILS_PY, RUNNER_PY, KV_INTERFACE_PY])

    def text(self, path: str) -> Optional[str]:
        if path not in self._text:
            data = self.source.read(path)
            self._text[path] = data.decode("utf-8", "replace") if data is not None else None
        return self._text[path]

    def _alias(self, path: str, name: str) -> Optional[FrozenSet[str]]:
        text = self.text(path)
        return literal_alias(text, name) if text is not None else None

    def speculative_methods(self) -> Optional[FrozenSet[str]]:
        return self._alias(SPECULATIVE_PY, "SpeculativeMethod")

    def cache_dtypes(self) -> Optional[FrozenSet[str]]:
        return self._alias(CACHE_PY, "CacheDType")

    def refuses_turboquant_on_hybrid(self) -> bool:
        text = self.text(ARG_UTILS_PY)
        return text is not None and TURBOQUANT_HYBRID_REFUSAL in text

    def shapes_turboquant_as_auto(self) -> bool:
        """True where no turboquant_* cache can start (0.25.0-0.26.x, on any model)."""
        runner, spec = self.text(RUNNER_PY), self.text(KV_INTERFACE_PY)
        return runner is not None and RUNNER_AUTO_SHAPE in runner and (spec is None or TURBOQUANT_SPEC_MODE not in spec)
