"""Rebase: carry a patch from the vLLM it was written for to another vLLM, never misplacing
a change (three-way merge + Python-aware anchoring + move detection + exact regeneration)."""

from __future__ import annotations

from .core import BaseMismatch, FileOutcome, RebaseResult, Tree, rebase_patches

__all__ = ["BaseMismatch", "FileOutcome", "RebaseResult", "Tree", "rebase_patches"]
