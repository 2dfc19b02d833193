"""Drift on real vLLM releases from PyPI, where a signature really changed:
  - 0.20.0 gave `QuantizationConfig.maybe_update_config` the keywords `hf_config` and
    `revision` (vLLM's config code passes `hf_config=`): an override written for 0.19.1
    that takes only `model_name` breaks;
  - 0.20.0 renamed `should_use_deepgemm_for_fp8_linear(..., weight, ...)` to `weight_shape`.
"""

from __future__ import annotations

import json

import pytest

from modfactory import make_mod, unified
from sparkmods.checking.drift import check_patched, drift_status
from sparkmods.cli import main
from sparkmods.runtime.manifest import load_manifest
from sparkmods.runtime.modcheck import check_mod
from sparkmods.sources import open_targets

pytestmark = pytest.mark.network

INC = "vllm/model_executor/layers/quantization/inc.py"
HOOK = ("    def check_quantized(self, weight_bits: int) -> bool:\n",
        "    def maybe_update_config(self, model_name: str):\n"
        "        self.sparkmods_checkpoint = model_name\n\n"
        "    def check_quantized(self, weight_bits: int) -> bool:\n")
PROBE = "vllm/model_executor/layers/quantization/utils/sparkmods_probe.py"
PROBE_TEXT = ("import torch\n\n\ndef use_deep_gemm(layer):\n"
              "    from vllm.utils.deep_gemm import should_use_deepgemm_for_fp8_linear\n\n"
              "    return should_use_deepgemm_for_fp8_linear(torch.bfloat16, weight=layer.weight)\n")
# the patch that adds PROBE as a new file
PROBE_PATCH = (f"--- /dev/null\n+++ b/{PROBE}\n@@ -0,0 +1,{PROBE_TEXT.count(chr(10))} @@\n"
               + "".join("+" + line for line in PROBE_TEXT.splitlines(keepends=True)))


def source(version: str):
    (found,) = open_targets(f"pypi:{version}")
    return found


def test_an_override_written_for_0_19_1_drifts_on_0_20_0(tmp_path, capsys):
    base = source("0.19.1")
    old = base.read(INC).decode()
    new = old.replace(*HOOK)
    assert check_patched({INC: (old.encode(), new.encode())}, base.read, base.list_files) == []
    patch = tmp_path / "hook.patch"
    patch.write_text(unified(INC, old, new))
    code = main(["rebase-patch", str(patch), "--base", "0.19.1", "--onto", "0.20.0", "-o", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 1 and not (tmp_path / "out").exists()
    assert f"{INC}: rebased" in out  # every hunk carried ...
    assert ("drift: " in out and "INCConfig.maybe_update_config(model_name) overrides QuantizationConfig."
            "maybe_update_config(model_name, hf_config, revision)" in out)  # ... but vLLM would break
    assert "does not accept 'hf_config', 'revision'" in out


def test_a_call_to_a_renamed_parameter_drifts(tmp_path, capsys):
    patch = tmp_path / "probe.patch"
    patch.write_text(PROBE_PATCH)
    code = main(["rebase-patch", str(patch), "--base", "0.19.1", "--onto", "0.20.0"])
    out = capsys.readouterr().out
    assert code == 1 and "no parameter named 'weight'" in out and "required 'weight_shape'" in out
    mod = make_mod(tmp_path / "mods", vllm=">=0.19.0", verified='["0.19.1"]', patch=patch.read_text())
    manifest = load_manifest(mod)
    for version, drifts in (("0.19.1", False), ("0.20.0", True)):
        tree = source(version)
        row = check_mod(manifest, mod, version, tree.read)
        assert row.status == "ok"
        verdict = drift_status(tree, row)
        assert (verdict is not None) == drifts, verdict
        if drifts:
            assert verdict[0] == "drift" and "should_use_deepgemm_for_fp8_linear" in verdict[1]


def test_check_patch_reports_drift_on_the_release_that_renamed_the_parameter(tmp_path, capsys):
    """The same check as a user runs it: ok on 0.19.1, drift (exit 1) on 0.20.0."""
    patch = tmp_path / "deepgemm.patch"
    patch.write_text(PROBE_PATCH)
    assert main(["check-patch", str(patch), "--vllm", "0.19.1", "--vllm", "0.20.0", "--json"]) == 1
    rows = json.loads(capsys.readouterr().out)["results"]
    assert [(r["vllm"], r["status"]) for r in rows] == [("0.19.1", "ok"), ("0.20.0", "drift")]
    assert "no parameter named 'weight'" in rows[1]["reason"]
