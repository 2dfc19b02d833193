"""mtp-weights at work in real vLLM releases (marker vllm_runtime: installs vLLM).

For the newest release each variant was verified on: install it from PyPI (vllmenv, cached),
apply the mod to a private copy of its site-packages with the mod's own run.sh, and run
mod_mtp_probe.py under that release's python on tiny Qwen3.5-MoE AutoRound
checkpoints from ckptfactory whose MTP head is indexed, un-indexed, absent, or absent next
to an un-indexed file of other tensors. The newest release is also probed unpatched, to show
the behaviour the mod changes. The nightly heal names one vLLM and the mods folder instead
(vllmenv.runtime_releases, runtime_mods).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

import ckptfactory as cf
from probekit import run_job
from vllmenv import run_sh, runtime_mods, runtime_releases, vllm_env

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

pytestmark = pytest.mark.vllm_runtime

MOD = runtime_mods() / "mtp-weights"
PROBE = Path(__file__).resolve().parent / "mod_mtp_probe.py"
SHARDS = [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)]
EXTRA = "model_extra_tensors.safetensors"
MTP_TENSORS = len(cf.mtp_specs(cf.Shape()))
ERROR = "ValueError: sparkmods mtp-weights: MTP speculative decoding was requested"


def newest_verified() -> List[str]:
    manifest = tomllib.loads((MOD / "mod.toml").read_text(encoding="utf-8"))
    return [variant["verified"][-1] for variant in manifest["variant"]]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    base = tmp_path_factory.mktemp("mtp-ckpt")
    found = {mode: cf.write_int4_autoround(base / mode, mtp=mode) for mode in ("indexed", "unindexed", "absent")}
    # an un-indexed file that is not an MTP head (here a copy of lm_head) must stay ignored
    stray = cf.write_int4_autoround(base / "stray", mtp="absent")
    cf.write_safetensors(stray / "extra_copy.safetensors", [cf.Spec("lm_head.weight", "BF16", (320, 256))])
    found["stray"] = stray
    return found


def run_probe(version: str, tmp: Path, checkpoints: Dict[str, Path], patched: bool = True) -> Dict[str, Any]:
    env = vllm_env(version)
    site = env.overlay(tmp / "site")  # unpatched too: a heal's wheel is only in the overlay
    if patched:
        applied = run_sh(MOD, site, tmp / "workspace")
        assert applied.returncode == 0 and "applied variant" in applied.stdout, applied.stdout + applied.stderr
    return run_job(env, PROBE, [{"name": n, "checkpoint": str(p)} for n, p in checkpoints.items()], tmp, site)


@pytest.fixture(scope="module", params=runtime_releases(newest_verified))
def report(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           checkpoints: Dict[str, Path]) -> Dict[str, Any]:
    return run_probe(request.param, tmp_path_factory.mktemp(f"mtp-{request.param}"), checkpoints)


def test_unindexed_mtp_file_is_selected_and_loaded(report: Dict[str, Any]) -> None:
    case = report["unindexed"]
    assert case["files"] == SHARDS + [EXTRA]
    assert case["draft_model_type"] == "qwen3_5_mtp" and case["quantization"] == "inc"
    assert case["mtp_tensors"] == MTP_TENSORS
    assert case["load"] == "ok"


def test_indexed_checkpoint_loads_as_before(report: Dict[str, Any]) -> None:
    case = report["indexed"]
    assert case["files"] == SHARDS + [EXTRA] and case["mtp_tensors"] == MTP_TENSORS and case["load"] == "ok"


def test_missing_mtp_head_is_a_clear_startup_error(report: Dict[str, Any], checkpoints: Dict[str, Path]) -> None:
    for name in ("absent", "stray"):
        case = report[name]
        assert case["files"] == SHARDS, case  # the stray file is not an MTP head: still ignored
        assert case["mtp_tensors"] == 0
        assert case["load"].startswith(ERROR), case["load"]
        assert str(checkpoints[name]) in case["load"] and "sparkmods checkpoint add-mtp" in case["load"]


def test_stock_vllm_ignores_the_file_and_says_nothing(tmp_path: Path, checkpoints: Dict[str, Path]) -> None:
    """The behaviour the mod exists for, on the newest release without it."""
    stock = run_probe(runtime_releases(newest_verified)[-1], tmp_path, checkpoints, patched=False)
    assert stock["unindexed"]["files"] == SHARDS and stock["unindexed"]["mtp_tensors"] == 0
    assert stock["unindexed"]["load"] == stock["absent"]["load"] == "ok"
