"""Load the int8-lm-head kernel module out of the mod's own patch, and write that patch.

The module ships only as a new-file hunk; benchmarks and tests import the text that hunk
creates (through the sparkmods patch engine), so what is measured is what the mod installs.
Needs no vLLM: the module guards its vLLM import.

    python3 ci/bench/benchlib/int8_lm_head_kernel.py --extract FILE   # the module text, to edit
    python3 ci/bench/benchlib/int8_lm_head_kernel.py --write FILE     # FILE becomes the new-file hunk
    python3 ci/bench/benchlib/int8_lm_head_kernel.py --set-dispatch DIR/sweep.json  # the sweep's suggested table

--write regenerates the patch with the rebase tooling's own diff writer and proves, with the
engine run.sh uses, that the patch recreates FILE byte for byte. --set-dispatch replaces the
module's DISPATCH block with the one a GPU sweep (sweep_int8_lm_head.py) suggests, checks that
the module still imports with it, and writes the patch the same way.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[3]
PATCH = REPO / "mods" / "int8-lm-head" / "patches" / "common" / "int8_lm_head.patch"
MODULE_PATH = "vllm/model_executor/layers/int8_lm_head.py"
# The fitting rule and tune table shared with turboquant: one source, a second new-file hunk here.
SHARED = REPO / "mods" / "turboquant" / "files" / "sparkmods_kerneltune.py"
SHARED_PATH = "vllm/model_executor/layers/sparkmods_kerneltune.py"
DISPATCH_OPEN, DISPATCH_CLOSE = "\nDISPATCH = (\n", "\n)\n"


class DispatchError(Exception):
    """A sweep result or module text --set-dispatch cannot use; the message says what to do."""


def _tools_on_path() -> None:
    tools = str(REPO / "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)


def patch_source(patch_text: str, path: str = MODULE_PATH) -> str:
    """The text a new-file patch creates at path (the module unless named)."""
    _tools_on_path()
    from sparkmods.runtime.engine import plan
    from sparkmods.runtime.udiff import parse_patch

    results = plan(parse_patch(patch_text), lambda _path: None)
    created = [r for r in results if r.path == path and r.after is not None]
    if len(created) != 1:
        raise RuntimeError(f"{PATCH}: expected one new-file hunk creating {path}")
    return created[0].after.decode("utf-8")


def kernel_source() -> str:
    """The module text the mod's patch creates."""
    return patch_source(PATCH.read_text(encoding="utf-8"))


def module_patch(source: str) -> str:
    """The new-file patch creating MODULE_PATH with source and SHARED_PATH with SHARED's text,
    verified to recreate both exactly."""
    _tools_on_path()
    from sparkmods.rebase.regen import file_diff

    shared = SHARED.read_text(encoding="utf-8")
    text = file_diff(MODULE_PATH, None, source.splitlines(keepends=True)) + file_diff(
        SHARED_PATH, None, shared.splitlines(keepends=True))
    if patch_source(text) != source or patch_source(text, SHARED_PATH) != shared:
        raise RuntimeError(f"{PATCH}: the regenerated patch does not recreate the module")
    return text


def load_kernel_module(workdir: Path, source: "str | None" = None) -> ModuleType:
    """Write the module (the patch's, or source) into workdir and import it as `int8_lm_head`.

    With TRITON_INTERPRET=1 set before the call, the kernels run in Triton's interpreter on
    CPU tensors (the variable must stay set while they run); see enable_interpreter.
    """
    _tools_on_path()
    from sparkmods.outputfile import write_atomic

    # Atomic: processes that load the module into one workdir at once (gb10_readiness's workers)
    # must never import a half-written file.
    path = workdir / "int8_lm_head.py"
    write_atomic(path, kernel_source() if source is None else source)
    write_atomic(workdir / SHARED.name, patch_source(PATCH.read_text(encoding="utf-8"), SHARED_PATH))
    spec = importlib.util.spec_from_file_location("int8_lm_head", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["int8_lm_head"] = module  # dataclasses resolve their module by name
    sys.modules.pop(SHARED.stem, None)  # the copy beside this module, not one imported earlier
    sys.path.insert(0, str(workdir))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(workdir))
    return module


def suggested_dispatch(sweep_json: Path) -> str:
    """The DISPATCH block a GPU sweep suggests (tuning.dispatch_python of its sweep.json)."""
    try:
        data = json.loads(sweep_json.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DispatchError(f"{sweep_json}: cannot read the sweep results ({exc}); pass DIR/sweep.json of sweep_int8_lm_head.py") from None
    tuning = data.get("tuning") if isinstance(data, dict) else None
    if not isinstance(tuning, dict) or not isinstance(tuning.get("dispatch_python"), str):
        raise DispatchError(f"{sweep_json}: no suggested DISPATCH (a --no-tune run?); run the sweep with tuning")
    if "interpreter" in str(data.get("device", "")):
        raise DispatchError(f"{sweep_json}: timed under Triton's interpreter ({data['device']}); use a GPU sweep")
    return tuning["dispatch_python"].strip()


def with_dispatch(source: str, dispatch: str) -> str:
    """source with its `DISPATCH = (` ... `)` block replaced by dispatch, checked to import and to be a table."""
    start = source.find(DISPATCH_OPEN)
    end = source.find(DISPATCH_CLOSE, start + 1)
    if start < 0 or end < 0 or not dispatch.startswith(DISPATCH_OPEN.strip()):
        raise DispatchError(f"{PATCH}: no 'DISPATCH = (' ... ')' block to replace; restore the module's table first")
    text = source[: start + 1] + dispatch + source[end + len(DISPATCH_CLOSE) - 1 :]
    with tempfile.TemporaryDirectory() as tmp:
        try:
            table = load_kernel_module(Path(tmp), text).DISPATCH
        except Exception as exc:  # noqa: BLE001 - any failure of the edited module is the table's
            raise DispatchError(f"{PATCH}: the module does not import with the new DISPATCH ({type(exc).__name__}: "
                                f"{exc}); check the sweep's dispatch_python") from None
    limits = [limit for limit, _ in table]
    if not table or limits[-1] is not None or limits[:-1] != sorted(set(limits[:-1])):
        raise DispatchError(f"{PATCH}: the new DISPATCH must rise in row count and end with None; got {limits}")
    return text


def enable_interpreter() -> None:
    """Make Triton 3.6's interpreter run kernels whose loops have a runtime bound on NumPy >= 2.4.

    The interpreter hands scalar arguments to the kernel as one-element arrays and turns them
    into Python ints with int(array), which NumPy 2.4 refuses for arrays with ndim > 0; a
    `for k0 in range(0, K, BLOCK_K)` loop then fails. This replaces only that conversion,
    inside the interpreter's own patch scope (restored after every launch). No-op off the
    interpreter. Two more limits of this interpreter, seen on Triton 3.6: bf16 `tl.dot` and
    int8 -> bf16 casts give wrong values, so interpreted runs use fp16 (the GPU does bf16).
    """
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        fix_interpreter_scalars()


def fix_interpreter_scalars() -> None:
    """The conversion fix of enable_interpreter, whatever TRITON_INTERPRET says now (once per process)."""
    import triton.runtime.interpreter as interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_sparkmods_index_fix", False):
        return

    def patch_tensor(tensor: type, scope: object) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch_tensor._sparkmods_index_fix = True
    interpreter._patch_lang_tensor = patch_tensor


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--extract", type=Path, metavar="FILE", help="write the module text the patch creates")
    group.add_argument("--write", type=Path, metavar="FILE", help="regenerate the patch from this module text")
    group.add_argument("--set-dispatch", type=Path, metavar="SWEEP_JSON", help="put a sweep's suggested DISPATCH in the patch")
    args = parser.parse_args(argv)
    if args.extract:
        args.extract.write_text(kernel_source(), encoding="utf-8")
        print(f"wrote {args.extract} from {os.path.relpath(PATCH, REPO)}")
        return 0
    try:
        if args.set_dispatch:
            source = with_dispatch(kernel_source(), suggested_dispatch(args.set_dispatch))
        else:
            source = args.write.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        print(f"int8_lm_head_kernel: cannot read {args.write}: {exc}; pass the module file to write", file=sys.stderr)
        return 2
    except DispatchError as exc:
        print(f"int8_lm_head_kernel: {exc}", file=sys.stderr)
        return 2
    PATCH.write_text(module_patch(source), encoding="utf-8")
    print(f"wrote {os.path.relpath(PATCH, REPO)} ({len(source.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
