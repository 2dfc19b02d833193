"""Import a script or module by its path (the ci/ scripts are not a package), registered in
sys.modules under its name: dataclasses look their module up there while a class is built."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: Path, name: str = "") -> ModuleType:
    """The module at `path`, imported as `name` (default: the file's stem)."""
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
