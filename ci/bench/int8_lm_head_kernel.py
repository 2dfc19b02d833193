"""Load the int8-lm-head kernel module out of the mod's own patch, and write that patch.

The module ships only as a new-file hunk; benchmarks and tests import the text that hunk
creates (through the sparkmods patch engine), so what is measured is what the mod installs.
Needs no vLLM: the module guards its vLLM import.

    python3 ci/bench/int8_lm_head_kernel.py --extract FILE   # the module text, to edit
    python3 ci/bench/int8_lm_head_kernel.py --write FILE     # FILE becomes the new-file hunk

--write regenerates the patch with the rebase tooling's own diff writer and proves, with the
engine run.sh uses, that the patch recreates FILE byte for byte.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
PATCH = REPO / "mods" / "int8-lm-head" / "patches" / "common" / "int8_lm_head.patch"
MODULE_PATH = "vllm/model_executor/layers/int8_lm_head.py"


def _tools_on_path() -> None:
    tools = str(REPO / "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)


def patch_source(patch_text: str) -> str:
    """The module text a new-file patch creates."""
    _tools_on_path()
    from sparkmods.runtime.engine import plan
    from sparkmods.runtime.udiff import parse_patch

    results = plan(parse_patch(patch_text), lambda _path: None)
    created = [r for r in results if r.path == MODULE_PATH and r.after is not None]
    if len(created) != 1:
        raise RuntimeError(f"{PATCH}: expected one new-file hunk creating {MODULE_PATH}")
    return created[0].after.decode("utf-8")


def kernel_source() -> str:
    """The module text the mod's patch creates."""
    return patch_source(PATCH.read_text(encoding="utf-8"))


def module_patch(source: str) -> str:
    """The new-file patch creating MODULE_PATH with source, verified to recreate it exactly."""
    _tools_on_path()
    from sparkmods.rebase.regen import file_diff

    text = file_diff(MODULE_PATH, None, source.splitlines(keepends=True))
    if patch_source(text) != source:
        raise RuntimeError(f"{PATCH}: the regenerated patch does not recreate the module")
    return text


def load_kernel_module(workdir: Path) -> ModuleType:
    """Write the module into workdir and import it as `int8_lm_head`.

    With TRITON_INTERPRET=1 set before the call, the kernels run in Triton's interpreter on
    CPU tensors (the variable must stay set while they run); see enable_interpreter.
    """
    path = workdir / "int8_lm_head.py"
    path.write_text(kernel_source(), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("int8_lm_head", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["int8_lm_head"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def enable_interpreter() -> None:
    """Make Triton 3.6's interpreter run kernels whose loops have a runtime bound on NumPy >= 2.4.

    The interpreter hands scalar arguments to the kernel as one-element arrays and turns them
    into Python ints with int(array), which NumPy 2.4 refuses for arrays with ndim > 0; a
    `for k0 in range(0, K, BLOCK_K)` loop then fails. This replaces only that conversion,
    inside the interpreter's own patch scope (restored after every launch). No-op off the
    interpreter. Two more limits of this interpreter, seen on Triton 3.6: bf16 `tl.dot` and
    int8 -> bf16 casts give wrong values, so interpreted runs use fp16 (the GPU does bf16).
    """
    if os.environ.get("TRITON_INTERPRET", "0") != "1":
        return
    import triton.runtime.interpreter as interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_sparkmods_index_fix", False):
        return

    def patch_tensor(tensor: type, scope: object) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch_tensor._sparkmods_index_fix = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patch_tensor


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--extract", type=Path, metavar="FILE", help="write the module text the patch creates")
    group.add_argument("--write", type=Path, metavar="FILE", help="regenerate the patch from this module text")
    args = parser.parse_args(argv)
    if args.extract:
        args.extract.write_text(kernel_source(), encoding="utf-8")
        print(f"wrote {args.extract} from {PATCH.relative_to(REPO)}")
        return 0
    try:
        source = args.write.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        print(f"int8_lm_head_kernel: cannot read {args.write}: {exc}; pass the module file to write", file=sys.stderr)
        return 2
    PATCH.write_text(module_patch(source), encoding="utf-8")
    print(f"wrote {PATCH.relative_to(REPO)} ({len(source.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
