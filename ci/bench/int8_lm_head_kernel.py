"""Load the int8-lm-head kernel module out of the mod's own patch.

The module ships only as a new-file hunk; benchmarks and tests import the text that hunk
creates (through the sparkmods patch engine), so what is measured is what the mod installs.
Needs no vLLM: the module guards its vLLM import.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
PATCH = REPO / "mods" / "int8-lm-head" / "patches" / "common" / "int8_lm_head.patch"
MODULE_PATH = "vllm/model_executor/layers/int8_lm_head.py"


def kernel_source() -> str:
    """The module text the patch creates."""
    tools = str(REPO / "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    from sparkmods.runtime.engine import plan
    from sparkmods.runtime.udiff import parse_patch

    results = plan(parse_patch(PATCH.read_text(encoding="utf-8")), lambda _path: None)
    created = [r for r in results if r.path == MODULE_PATH and r.after is not None]
    if len(created) != 1:
        raise RuntimeError(f"{PATCH}: expected one new-file hunk creating {MODULE_PATH}")
    return created[0].after.decode("utf-8")


def load_kernel_module(workdir: Path) -> ModuleType:
    """Write the module into workdir and import it as `int8_lm_head`."""
    path = workdir / "int8_lm_head.py"
    path.write_text(kernel_source(), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("int8_lm_head", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["int8_lm_head"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module
