"""turboquant: manifest, generated patch and launch rules (fast tier), plus the every-release check
and the shipped recipe on real releases (network).

What the patched vLLM does is test_mod_turboquant_runtime.py's job (a real 0.19.1 venv); the
kernels are tested against the PyTorch reference by the kernel tests of files/tq_*.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Dict, List, Optional, Sequence

import pytest

from modfactory import make_site
from scriptload import load_script
from sparkmods.cli import main
from sparkmods.launch.flagrules import kv_cache_dtype
from sparkmods.launch.plan import LaunchOptions, build_plan
from sparkmods.launch.problem import Context
from sparkmods.launch.recipe import load_recipe
from sparkmods.launch.vllmfacts import VllmFacts
from sparkmods.runtime.manifest import load_manifest
from sparkmods.runtime.modcheck import ModResult
from sparkmods.runtime.udiff import parse_patch
from sparkmods.sources import open_targets

REPO = Path(__file__).resolve().parents[1]
MOD = REPO / "mods" / "turboquant"
RECIPE = REPO / "launch" / "recipes" / "qwen3.5-122b-a10b-turboquant.yaml"
STAND_IN = Path(__file__).resolve().parent / "fixtures" / "launch-cluster.sh"


def load_maker(mod_dir: Path = MOD) -> ModuleType:
    return load_script(mod_dir / "make_patches.py", "turboquant_make_patches")


# ---- manifest ----


@pytest.mark.parametrize("version, label", [
    ("0.18.0", "v0.18.0"), ("0.19.1", "v0.18.0"), ("0.20.0.dev5", "v0.18.0"), ("0.20.0", "v0.20.0"),
    ("0.20.2", "v0.20.0"), ("0.21.0rc1", "v0.20.0"), ("0.21.0", "v0.21.0-kernels"), ("0.26.0", "v0.21.0-kernels"),
    ("0.27.0rc1", "v0.21.0-kernels"), ("0.27.0", "v0.27.0-kernels"), ("0.33.0", "v0.27.0-kernels"),
    ("1.0.0", "v0.27.0-kernels")])
def test_every_release_from_018_has_exactly_one_answer(version: str, label: str) -> None:
    """No upstream section: upstream serves TurboQuant from 0.21, and the mod replaces its kernels."""
    manifest = load_manifest(MOD)
    assert manifest.upstream is None
    assert manifest.select(version).label == label
    assert manifest.select("0.17.1") is None


def test_ranges_do_not_overlap_and_verified_releases_fall_inside() -> None:
    manifest = load_manifest(MOD)
    for variant in manifest.variants:
        for version in variant.verified:
            assert manifest.select(version) is variant, (variant.label, version)
        for patch in variant.patches:
            assert (MOD / patch).is_file()


# ---- the generated patch ----


def test_patch_holds_exactly_the_files_of_files_dir() -> None:
    maker = load_maker()
    assert (MOD / "patches" / "common" / "turboquant_files.patch").read_text(encoding="utf-8") == maker.render(), \
        "patches/common/turboquant_files.patch is stale: run python3 mods/turboquant/make_patches.py"
    created = {fp.path: "\n".join(line for h in fp.hunks for line in h.new_lines) + "\n"
               for fp in parse_patch(maker.render())}
    for src, dest in maker.FILES:
        assert created[dest] == (MOD / src).read_text(encoding="utf-8"), dest


def test_make_patches_check_fails_when_a_source_changes(tmp_path: Path) -> None:
    copy = tmp_path / "turboquant"
    shutil.copytree(MOD, copy, ignore=shutil.ignore_patterns("_sparkmods.py", "manifest.json", "run.sh"))
    script = copy / "make_patches.py"
    assert subprocess.run([sys.executable, str(script), "--check"], capture_output=True).returncode == 0
    backend = copy / "files" / "sparkmods_turboquant.py"
    backend.write_text(backend.read_text(encoding="utf-8") + "# drift\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert proc.returncode == 1 and "is out of date" in proc.stderr
    assert subprocess.run([sys.executable, str(script)], capture_output=True).returncode == 0
    assert subprocess.run([sys.executable, str(script), "--check"], capture_output=True).returncode == 0


def test_a_source_without_final_newline_is_one_line_exit_2(tmp_path: Path) -> None:
    copy = tmp_path / "turboquant"
    shutil.copytree(MOD, copy, ignore=shutil.ignore_patterns("_sparkmods.py", "manifest.json", "run.sh"))
    (copy / "files" / "tq_format.py").write_text("x = 1", encoding="utf-8")
    proc = subprocess.run([sys.executable, str(copy / "make_patches.py")], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "make_patches: vllm/v1/attention/ops/sparkmods_tq_format.py: the source must end with a newline"]


# ---- launch rules ----

CACHE_019 = 'from typing import Literal\nCacheDType = Literal["auto", "bfloat16", "fp8"]\n'
CACHE_020 = 'from typing import Literal\nCacheDType = Literal["auto", "fp8", "turboquant_k3v4_nc"]\n'
REFUSAL = 'raise NotImplementedError("TurboQuant KV cache is not supported for hybrid (attention + Mamba) models.")\n'


def problems(tmp_path: Path, version: str, cache_py: str, arg_utils: str, results: Sequence[ModResult],
             more: Optional[Dict[str, str]] = None) -> List[str]:
    site = make_site(tmp_path / f"site-{version}", version, {
        "vllm/config/cache.py": cache_py, "vllm/engine/arg_utils.py": arg_utils, **(more or {})})
    facts = VllmFacts(open_targets(f"dir:{site}#{version}")[0])
    plan = build_plan(load_recipe(RECIPE), LaunchOptions(), root=REPO)
    return [p.message for p in kv_cache_dtype(Context(plan, facts, list(results)))]


def green(mod: str, version: str, variant: str) -> ModResult:
    return ModResult(mod, version, "ok", variant)


@pytest.mark.parametrize("version, cache_py, arg_utils, variant", [
    ("0.19.1", CACHE_019, "", "v0.18.0"), ("0.20.0", CACHE_020, REFUSAL, "v0.20.0")])
def test_turboquant_recipe_is_fine_on_018_to_020_with_the_mod(tmp_path, version, cache_py, arg_utils, variant):
    others = [green("chat-template", version, "any")]
    assert problems(tmp_path, version, cache_py, arg_utils, others + [green("turboquant", version, variant)]) == []
    refused = problems(tmp_path, version, cache_py, arg_utils, others)
    assert len(refused) == 1 and "add mods/turboquant to the recipe's mods" in refused[0], refused
    if version == "0.19.1":
        assert refused[0].startswith("vLLM 0.19.1 (") and "has no KV-cache dtype 'turboquant_k3v4_nc'" in refused[0]
    else:
        assert "refuses TurboQuant KV caches on hybrid models like Qwen3.5" in refused[0]


# 0.25-0.26's runner shapes a layer whose spec has no quantisation mode as "auto"; 0.27 gives
# TurboQuant layers a mode (kv_cache_interface), 0.29 drops the runner test.
RUNNER_026 = 'layer_cache_dtype_str = ("auto" if kv_cache_spec.kv_quant_mode == KVQuantMode.NONE else dtype)\n'
SPEC_027 = "class KVQuantMode:\n    def is_turboquant(self):\n        return True\n"


def test_turboquant_recipe_on_025_026_needs_the_mod(tmp_path: Path) -> None:
    files = {"vllm/v1/worker/gpu_model_runner.py": RUNNER_026, "vllm/v1/kv_cache_interface.py": "class KVQuantMode:\n    NONE = 0\n"}
    others = [green("chat-template", "0.26.0", "any")]
    refused = problems(tmp_path, "0.26.0", CACHE_020, "", others, files)
    assert len(refused) == 1 and "cannot start a turboquant_k3v4_nc cache" in refused[0], refused
    assert "add mods/turboquant to the recipe's mods" in refused[0]
    assert problems(tmp_path, "0.26.0", CACHE_020, "", others + [green("turboquant", "0.26.0", "v0.21.0")], files) == []
    fixed = {**files, "vllm/v1/kv_cache_interface.py": SPEC_027}  # 0.27-0.28: same runner, the spec has the mode
    assert problems(tmp_path / "027", "0.27.0", CACHE_020, "", others, fixed) == []


def test_a_turboquant_mod_that_does_not_apply_does_not_lift_the_refusal(tmp_path: Path) -> None:
    broken = ModResult("turboquant", "0.19.1", "conflict", "v0.18.0", "vllm/config/cache.py: hunk 1 conflicts")
    assert len(problems(tmp_path, "0.19.1", CACHE_019, "", [broken])) == 1


def test_the_shipped_recipe_applies_the_mod() -> None:
    assert "mods/turboquant" in load_recipe(RECIPE).mods


# ---- real releases (network) ----


@pytest.mark.network
def test_every_release_from_018_is_green() -> None:
    """`sparkmods check turboquant` over every release >= 0.18.0, drift checks included."""
    sparkmods = Path(sys.executable).parent / "sparkmods"
    proc = subprocess.run([str(sparkmods), "check", "--json", "--mods-dir", str(MOD.parent), MOD.name,
                           "--vllm", ">=0.18.0"], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["vllm"]: r for r in json.loads(proc.stdout)["results"] if r["mod"] == MOD.name}
    assert len(rows) >= 23, sorted(rows)
    for version, row in rows.items():
        expected = {"v0.18.0": {"ok", "ok-offset"}, "v0.20.0": {"ok"}, "v0.21.0-kernels": {"ok", "ok-offset"},
                    "v0.27.0-kernels": {"ok", "ok-offset"}}[row["variant"]]
        assert row["status"] in expected, (version, row["status"], row.get("reason"))
    assert rows["0.19.1"]["variant"] == "v0.18.0" and rows["0.20.2"]["variant"] == "v0.20.0"
    assert rows["0.26.0"]["variant"] == "v0.21.0-kernels" and rows["0.33.0"]["variant"] == "v0.27.0-kernels"


@pytest.mark.network
@pytest.mark.parametrize("version", ["0.19.1", "0.20.0", "0.21.0"])
def test_sparkmods_launch_accepts_the_recipe_on_every_kind_of_release(version, tmp_path, capsys) -> None:
    code = main(["launch", str(RECIPE), "--vllm", version, "--launch-cluster", str(STAND_IN),
                 "--image", "sparkmods-no-such-image:0", "--solo", "-o", str(tmp_path / "launch.sh")])
    assert code == 0, capsys.readouterr().err

