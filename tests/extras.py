"""Imports from the `kernels` extra (torch, triton, transformers) for the tests that need them.

The default tier runs with the light `test` extra alone: a module or test that needs the kernels
extra calls need() and is skipped, with the line that installs it, where the import fails.
"""

from __future__ import annotations

from types import ModuleType

import pytest

INSTALL = "pip install -e '.[kernels]'"


def need(module: str) -> ModuleType:
    """module imported, or the caller (a test module at import, or one test) skipped saying why."""
    __tracebackhide__ = True  # the skip is reported at the caller's line
    return pytest.importorskip(module, reason=f"needs {module} from the kernels extra: {INSTALL}")
