"""The int8-lm-head module loaded with its Triton kernels under the interpreter (CPU tensors).

Shared by the kernel and tensor-parallel tests. The module is read from the mod's own patch.
TRITON_INTERPRET must be set while the kernels are decorated (load) and while they run (the
module's dispatch reads it per call): `interpreted_module` sets it for the load,
`interpret_env` for each test. The kernels call no @triton.jit helper of Triton's own
(tl.cdiv is one), so they run interpreted whichever mode triton was first imported in.
Nothing imports triton at collection: other test files that need to import it first under
their own settings are unaffected.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

from extras import need

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "ci" / "bench"


def bench_module(name: str) -> ModuleType:
    """A module of ci/bench by import name (`sweep_int8_lm_head`, `benchlib.int8_lm_head_kernel`), with
    ci/bench on the path as a benchmark run as a script has it."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)


def interpreted_module(workdir: Path) -> ModuleType:
    """The patch's module with interpreted kernels (Triton imported here, at fixture time)."""
    loader = bench_module("benchlib.int8_lm_head_kernel")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        need("triton")
        loader.enable_interpreter()
        module = loader.load_kernel_module(workdir)
    assert type(module._int8_head_mma_kernel).__name__ == "InterpretedFunction"
    return module
