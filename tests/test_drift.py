"""Semantic drift checks on small vLLM trees: what the patch adds must parse, import names
that exist, call with arguments the callee accepts, and override with a compatible signature.
Only the patch's own lines are judged; what Python decides at run time is left alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from drifttree import IMPORTS, MOD, TREE, add, check
from modfactory import make_mod, make_site, unified
from sparkmods.checking.drift import check_patched, drift_status, new_findings
from sparkmods.cli import main
from sparkmods.runtime.manifest import load_manifest
from sparkmods.runtime.modcheck import check_mod, variant_patches


def test_the_unpatched_demo_is_clean():
    assert check(add("        y = y + 1\n")) == []


def test_a_patched_file_that_does_not_parse():
    (finding,) = check(add("        y = (y + \n"))
    assert finding.startswith("syntax: does not parse")


@pytest.mark.parametrize("line, problem", [
    ("from vllm.model_executor.layers.quantization.helpers import shift", "defines no shift"),
    ("from vllm.model_executor.layers.quantization.fp9 import Fp9Config", "module vllm.model_executor.layers.quantization.fp9 does not exist"),
    ("from vllm.model_executor.layers.quantization import Fp8Config", "only under TYPE_CHECKING"),
    ("import vllm.model_executor.layers.nope", "no such module"),
    ("from .quantization.helpers import nothing", "defines no nothing"),
    ("from ..quantization.helpers import scale", "module vllm.model_executor.quantization.helpers does not exist"),
])
def test_imports_of_names_the_release_lacks(line, problem):
    (finding,) = check(add(f"        {line}\n"))
    assert finding.startswith("import:") and problem in finding


@pytest.mark.parametrize("line", [
    "from vllm.model_executor.layers.quantization import QuantizationConfig",  # re-exported by the package
    "from vllm.model_executor.layers.quantization import scale",  # through a star import, in __all__
    "from vllm.model_executor.layers.quantization import fp8",  # a submodule
    "from vllm import anything_at_all",  # module-level __getattr__: cannot tell, not drift
    "from .quantization.helpers import Box",  # relative to the patched module
    "import torch.nn",  # not vLLM
])
def test_imports_that_resolve_or_cannot_be_judged(line):
    assert check(add(f"        {line}\n")) == []


@pytest.mark.parametrize("handler", ["ImportError", "ModuleNotFoundError", "(AttributeError, ImportError)", ""])
def test_an_import_guarded_against_its_own_failure_is_not_drift(handler):
    guarded = ("        try:\n            from vllm.model_executor.layers.quantization.helpers import shift\n"
               f"        except {handler}:\n            shift = None\n").replace("except :", "except:")
    assert check(add(guarded)) == []


def test_a_try_that_catches_something_else_does_not_hide_the_import():
    (finding,) = check(add("        try:\n            from vllm.model_executor.layers.quantization.helpers import shift\n"
                           "        except KeyError:\n            shift = None\n"))
    assert finding.startswith("import:") and "defines no shift" in finding


def test_a_star_import_honours_all():
    (finding,) = check(add("        from vllm.model_executor.layers.quantization import _private\n"))
    assert "defines no _private" in finding


@pytest.mark.parametrize("call, problem", [
    ("scale(y, factor=2)", "no parameter named 'factor'"),
    ("scale(y)", "does not pass required 'by'"),
    ("scale(y, 2, True)", "passes 3 positional arguments, the function takes 2"),
    ("Box(3, 4)", "passes 2 positional arguments, the function takes 1"),
    ("self.get_name(1)", "passes 1 positional arguments, the function takes 0"),
    ("super().maybe_update_config()", "does not pass required 'model_name'"),
    ("QuantizationConfig.from_config({}, loose=True)", "no parameter named 'loose'"),
])
def test_calls_that_cannot_bind(call, problem):
    found = check(add(IMPORTS + f"        y = {call}\n"))
    assert found and all(f.startswith("call:") for f in found) and any(problem in f for f in found), found


@pytest.mark.parametrize("call", [
    "scale(y, 2, clamp=True)",
    "scale(*args)",  # unknown positional count: not judged
    "scale(y, **options)",
    "Box(size=3)",
    "torch.relu(y, nonsense=1)",  # not vLLM
    "Record(name='x', extra=1)",  # a dataclass: its __init__ is generated
])
def test_calls_that_bind_or_cannot_be_judged(call):
    imports = IMPORTS + "        from vllm.model_executor.layers.quantization.records import Record\n"
    assert check(add(imports + f"        y = {call}\n")) == []


HOOK = ("    def get_name(self) -> str:\n",
        "    def maybe_update_config(self, model_name: str):\n        self.name = model_name\n\n"
        "    def get_name(self) -> str:\n")


def test_an_override_missing_keywords_the_base_method_takes():
    (finding,) = check(TREE[MOD].replace(*HOOK))
    assert finding.startswith("override: DemoConfig.maybe_update_config(model_name) overrides "
                               "QuantizationConfig.maybe_update_config(model_name, hf_config, revision)")
    assert "does not accept 'hf_config', 'revision'" in finding


@pytest.mark.parametrize("signature", ["(self, model_name: str, **kwargs)",
                                       "(self, model_name, hf_config=None, revision=None, extra=None)"])
def test_compatible_overrides(signature):
    assert check(TREE[MOD].replace(*HOOK).replace("(self, model_name: str):", signature + ":")) == []


def test_an_override_requiring_what_callers_do_not_pass():
    (finding,) = check(TREE[MOD].replace(*HOOK).replace("(self, model_name: str):", "(self, model_name, hf_config=None, revision=None, *, must):"))
    assert "requires 'must'" in finding


def test_only_what_the_patch_touches_is_judged():
    """vLLM's own file may hold code the checks would question; untouched lines are not ours."""
    tree = dict(TREE)
    tree[MOD] = TREE[MOD].replace(*HOOK)  # the bad override is upstream's now
    assert check(tree[MOD].replace("        y = x * 2\n", "        y = x * 3\n"), tree) == []


def test_new_findings_ignore_what_the_base_release_already_showed():
    bad = check_patched({MOD: (None, TREE[MOD].replace(*HOOK).encode())},
                        {k: v.encode() for k, v in TREE.items()}.get)
    assert len(bad) == 1 and new_findings(bad, bad) == [] and new_findings(bad, []) == bad


def hooked_mod(tmp_path: Path) -> "tuple[Path, Path]":
    """(site of TREE as vLLM 0.20.0, a mod `hooked` whose override drifts there)."""
    site = make_site(tmp_path / "site", "0.20.0", TREE)
    mod = make_mod(tmp_path / "mods", "hooked", vllm=">=0.19.0", verified='["0.20.0"]',
                   patch=unified(MOD, TREE[MOD], TREE[MOD].replace(*HOOK)))
    return site, mod


def test_drift_status_for_check(tmp_path: Path):
    """The hook for `sparkmods check`: a green row whose patch would break vLLM."""
    site, mod = hooked_mod(tmp_path)
    manifest = load_manifest(mod)

    class Source:
        version = "0.20.0"

        @staticmethod
        def read(path: str):
            p = site / path
            return p.read_bytes() if p.is_file() else None

    row = check_mod(manifest, mod, "0.20.0", Source.read)
    assert row.status == "ok"
    status, reason = drift_status(Source, row)
    assert status == "drift" and "does not accept 'hf_config', 'revision'" in reason and MOD in reason
    (site / MOD).write_text(TREE[MOD].replace(*HOOK))  # now the tree is already patched
    applied = check_mod(manifest, mod, "0.20.0", Source.read)
    assert applied.status == "applied" and drift_status(Source, applied) is None  # no patches: nothing to diff
    patches = variant_patches(mod, manifest.variants[0])
    assert drift_status(Source, applied, patches)[0] == "drift"
    fine = make_mod(tmp_path / "mods2", vllm=">=0.19.0", verified='["0.20.0"]',
                    patch=unified(MOD, TREE[MOD], TREE[MOD].replace("y = x * 2", "y = x * 4")))
    (site / MOD).write_text(TREE[MOD])
    assert drift_status(Source, check_mod(load_manifest(fine), fine, "0.20.0", Source.read)) is None


def test_check_and_check_patch_report_drift(tmp_path: Path, capsys):
    """`sparkmods check` and `check-patch` run the drift checks on every row that applies."""
    site, mod = hooked_mod(tmp_path)
    make_mod(tmp_path / "mods", "harmless", vllm=">=0.19.0", verified='["0.20.0"]',
             patch=unified(MOD, TREE[MOD], TREE[MOD].replace("y = x * 2", "y = x * 4")))
    assert main(["check", "--mods-dir", str(tmp_path / "mods"), "--vllm", f"dir:{site}", "--json"]) == 1
    rows = {r["mod"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    assert rows["hooked"]["status"] == "drift" and "does not accept 'hf_config', 'revision'" in rows["hooked"]["reason"]
    assert rows["harmless"]["status"] == "ok"
    (tmp_path / "loose.patch").write_text((mod / "patches" / "v1" / "demo.patch").read_text())
    assert main(["check-patch", str(tmp_path / "loose.patch"), "--vllm", f"dir:{site}"]) == 1
    assert "drift" in capsys.readouterr().out


def test_nightly_report_says_why_a_row_drifts(tmp_path: Path):
    from sparkmods.nightly import run_job

    site, mod = hooked_mod(tmp_path)
    report = run_job([mod], [f"dir:{site}"])
    assert [r.result.status for r in report.broken] == ["drift"]
    md = report.markdown()
    assert "`drift`, variant `v1`" in md and "does not accept 'hf_config', 'revision'" in md


def test_a_module_read_while_another_thread_collects_it_waits_for_the_whole_table(monkeypatch):
    """Modules are shared by the check threads and collected on first use; a second reader
    must wait for the first one's collection, not see its half-filled tables (a matrix cell
    once said 'fp8.py defines no Fp8Config' that way)."""
    import threading
    import time

    from sparkmods.pyindex import resolve

    started = threading.Event()
    collect = resolve._collect

    def slow_collect(mod, body, typing_only):
        started.set()
        time.sleep(0.3)
        collect(mod, body, typing_only)

    monkeypatch.setattr(resolve, "_collect", slow_collect)
    module = resolve.Module("vllm.x", "vllm/x.py", False, b"class Fp8Config:\n    pass\n")
    first = threading.Thread(target=lambda: module.bindings)
    first.start()
    assert started.wait(10)
    assert "Fp8Config" in module.bindings  # read while the first thread is still collecting
    first.join()
