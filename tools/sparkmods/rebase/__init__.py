"""Rebase: carry a patch from the vLLM it was written for to another vLLM, never misplacing
a change (three-way merge + Python-aware anchoring + move detection + exact regeneration).

The names below come from .core on first use: the drift checks import rebase.resolve, and
importing this package eagerly made every check load the merge machinery as well, which no
check uses."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .core import BaseMismatch, FileOutcome, RebaseResult, Tree, rebase_patches

__all__ = ["BaseMismatch", "FileOutcome", "RebaseResult", "Tree", "rebase_patches"]


def __getattr__(name: str) -> object:
    if name in __all__:
        from sparkmods.rebase import core

        return getattr(core, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
