"""The int8-lm-head mod on real vLLM releases (CPU): applied by the runtime, then exercised.

For every release in the mod's `verified` lists (cached venvs from vllmenv.py, installed on
first use) the mod is applied with the same applier run.sh uses, onto a hardlinked overlay of
that release, and mod_int8_lm_head_probe.py runs vLLM's own ParallelLMHead and
LogitsProcessor on it. There is no GPU here, so the mod's torch path computes the logits;
the Triton kernel is checked on a GPU by ci/bench/gpu_check_int8_lm_head.py.
SPARKMODS_VLLM_PYTHON (interpreter paths joined by os.pathsep) replaces the releases; the
nightly heal names one release and the mods folder (vllmenv.runtime_releases, runtime_mods).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, List

import pytest

from mod_int8_lm_head_probe import ORG_VOCAB, ROWS
from probekit import read_report
from sparkmods.runtime.applier import apply_mod
from sparkmods.runtime.manifest import load_manifest
from vllmenv import runtime_mods, runtime_releases, vllm_env

pytestmark = pytest.mark.vllm_runtime
MOD_DIR = runtime_mods() / "int8-lm-head"
PROBE = Path(__file__).resolve().parent / "mod_int8_lm_head_probe.py"


def targets() -> List[str]:
    configured = os.environ.get("SPARKMODS_VLLM_PYTHON", "")
    if configured:
        return [p for p in configured.split(os.pathsep) if p]
    return runtime_releases(lambda: [v for variant in load_manifest(MOD_DIR).variants for v in variant.verified])


def _overlay_of_interpreter(python: str, dest: Path) -> Path:
    """Hardlink (or copy) the interpreter's vllm/ and dist-info into dest, a site dir."""
    site = subprocess.run([python, "-c", "import os, vllm; print(os.path.dirname(vllm.__path__[0]))"],
                          capture_output=True, text=True, check=True, timeout=300).stdout.strip()
    dest.mkdir(parents=True, exist_ok=True)
    for src in [Path(site) / "vllm", *Path(site).glob("vllm-*.dist-info")]:
        try:
            shutil.copytree(src, dest / src.name, copy_function=os.link, symlinks=True)
        except OSError:  # another filesystem: no hardlinks
            shutil.rmtree(dest / src.name, ignore_errors=True)
            shutil.copytree(src, dest / src.name, symlinks=True)
    return dest


@pytest.fixture(scope="module", params=targets())
def report(request: Any, tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    """Apply the mod to an overlay of the target and run the probe once."""
    tmp = tmp_path_factory.mktemp("int8-lm-head")
    target: str = request.param
    if os.sep in target:
        site = _overlay_of_interpreter(target, tmp / "site")
        argv = [target, str(PROBE)]
    else:
        env = vllm_env(target)
        site = env.overlay(tmp / "site")
        argv = [str(env.python), str(PROBE)]
    assert apply_mod(MOD_DIR, site, workspace=tmp) == 0
    proc = subprocess.run(argv, env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True,
                          text=True, timeout=900, check=False)
    result = read_report(proc, target)
    result["site"] = str(site)
    return result


def test_patched_module_is_imported(report: Dict[str, Any]) -> None:
    assert report["hooked"]
    assert report["module_file"].startswith(report["site"])


def test_switch_off_leaves_vllm_stock(report: Dict[str, Any]) -> None:
    off = report["off"]
    assert off["equal_to_stock"] and off["weight_numel_after"] > 0
    assert any("switched off by SPARKMODS_INT8_LM_HEAD" in line for line in off["log"])


def test_torch_path_matches_float_reference_and_vllm_trims(report: Dict[str, Any]) -> None:
    on = report["on"]
    assert report["torch_fallback_used"]
    assert on["shape"] == [ROWS, ORG_VOCAB], "padding rows must be trimmed by vLLM after the hook"
    assert on["dtype"] == "torch.bfloat16"
    assert not on["equal_to_stock"]  # INT8 weights really were used
    assert on["within_quant_bound"]
    assert on["max_err_vs_dequant_over_bf16_ulp"] <= 1.0
    assert on["weight_numel_after"] == 0


def test_one_log_line_states_the_saving(report: Dict[str, Any]) -> None:
    (line,) = report["on"]["log"]
    assert "active (torch path)" in line and "MiB saved" in line and "1024x64" in line


def test_top_token_paths_run_after_the_weight_is_freed(report: Dict[str, Any]) -> None:
    on = report["on"]
    assert on["top_tokens_are_argmax"]
    if "topk_matches_logits" in on:  # get_top_k_tokens exists from 0.28.0
        assert on["topk_matches_logits"]


def test_tied_embeddings_are_left_alone(report: Dict[str, Any]) -> None:
    for case in ("tied", "embedding_as_head"):
        got = report[case]
        assert got["equal_to_stock"] and got["weight_numel_after"] > 0, case
        assert len(got["log"]) == 1 and "not used" in got["log"][0], case
    assert report["tied"]["embedding_intact"]
