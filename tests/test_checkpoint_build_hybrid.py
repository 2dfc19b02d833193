"""`sparkmods checkpoint build-hybrid`: byte-exact round trip through the real safetensors
library, dry run, refusals, failure halfway, HF snapshots and repo ids, bounded memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

import ckptfactory as cf
from sparkmods.checkpoint import hybrid_build
from sparkmods.checkpoint.header import itemsize, read_header
from sparkmods.checkpoint.hybrid_build import build_hybrid
from sparkmods.checkpoint.hybrid_plan import needed_fp8_files, plan_hybrid
from sparkmods.checkpoint.layout import INDEX_NAME, Checkpoint, Index
from sparkmods.cli import main
from sparkmods.errors import SparkmodsError

S = cf.Shape()
MTP = "model_extra_tensors.safetensors"
SHARED = [
    f"model.language_model.layers.{i}.mlp.shared_expert.{p}.weight"
    for i in range(S.num_layers) for p in ("gate_proj", "up_proj", "down_proj")
]


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    """Intel-style INT4 (MTP file present, index entries dropped) and Qwen-style FP8."""
    return cf.write_int4_autoround(tmp_path / "int4", mtp="unindexed"), cf.write_fp8(tmp_path / "fp8")


def all_tensors(root: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    out: dict = {}
    for path in sorted(root.glob("*.safetensors")):
        out.update(cf.read_tensors(path))
    return out


def build(int4: Path, fp8: Path, out: Path, *extra: str) -> int:
    return main(["checkpoint", "build-hybrid", "--int4", str(int4), "--fp8", str(fp8), "--out", str(out), *extra])


def test_round_trip_through_safetensors(pair: tuple[Path, Path], tmp_path: Path) -> None:
    int4, fp8 = pair
    out = tmp_path / "hybrid"
    assert build(int4, fp8, out) == 0
    got, old, new = all_tensors(out), all_tensors(int4), all_tensors(fp8)
    for name in SHARED:
        scale = name.replace(".weight", ".weight_scale_inv")
        assert got[name] == new[name] and got[name][0] == "F8_E4M3"
        assert got[scale] == new[scale] and got[scale][0] == "F32"
        assert old[name][1] == got[name][1]
    untouched = {n: v for n, v in old.items() if n not in SHARED}
    assert {n: got[n] for n in untouched} == untouched  # everything else byte for byte, MTP included
    assert set(got) == set(old) | {n.replace(".weight", ".weight_scale_inv") for n in SHARED}

    index = Index.load(out / INDEX_NAME)
    assert set(index.weight_map) == set(got)
    for path in out.glob("*.safetensors"):
        header = read_header(path)
        assert all(index.weight_map[n] == path.name for n in header.tensors)
        assert all((t.start - header.data_start) % itemsize(t.dtype) == 0 for t in header.tensors.values())
    assert index.total_size == sum(len(v[2]) for v in got.values())
    assert index.weight_map["mtp.fc.weight"] == MTP  # the MTP head is kept *and* indexed
    assert (out / MTP).stat().st_ino == (int4 / MTP).stat().st_ino  # unchanged file: hardlinked
    for name in ("config.json", "generation_config.json"):
        assert (out / name).read_bytes() == (int4 / name).read_bytes()
    assert oct(out.stat().st_mode & 0o777) != oct(0o700)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert main(["checkpoint", "inspect", str(out)]) == 0


def test_dry_run_plans_without_writing(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    int4, fp8 = pair
    out = tmp_path / "hybrid"
    assert build(int4, fp8, out, "--dry-run", "--json") == 0
    plan = json.loads(capsys.readouterr().out)
    assert not out.exists()
    assert sorted(plan["replaced"]) == sorted(SHARED) and plan["block"] == [128, 128]
    si, h = S.shared_intermediate, S.hidden
    fp8_bytes = 3 * S.num_layers * si * h
    scale_bytes = S.num_layers * 4 * (2 * 2 * 2 + 2 * 2)  # gate/up: 2x2 blocks, down: 2x2 (256x192)
    assert plan["bytes_replaced"] == 2 * fp8_bytes
    assert plan["bytes_saved"] == fp8_bytes - scale_bytes
    assert plan["mtp_tensors"] == len(cf.mtp_specs(S))
    unused = {(u["group"], u["reason"]) for u in plan["unused_fp8"]}
    assert ("Gated DeltaNet projections", "INT4 in --int4") in unused
    assert ("routed experts", "INT4 in --int4") in unused
    kept = {k["group"] for k in plan["kept_16bit"]}
    assert {"norms", "router gates", "shared-expert gates", "Gated DeltaNet in_proj_a/b"} <= kept

    assert build(int4, fp8, out, "--dry-run") == 0
    text = capsys.readouterr().out
    assert f"replace {len(SHARED)} shared-expert projections ({S.num_layers} layers)" in text
    assert "saves" in text and "MTP head: 29 tensors kept and indexed" in text


def test_existing_output_needs_force(pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    int4, fp8 = pair
    out = tmp_path / "hybrid"
    out.mkdir()
    (out / "keep-me").write_text("x")
    assert build(int4, fp8, out) == 2
    assert "pass --force" in capsys.readouterr().err and (out / "keep-me").exists()
    assert build(int4, fp8, out, "--force") == 0
    assert not (out / "keep-me").exists() and (out / INDEX_NAME).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fp8", "hybrid", "int4"]


def test_output_overlapping_an_input_is_refused(pair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    int4, fp8 = pair
    assert build(int4, fp8, int4, "--force") == 2
    assert "overlaps the input" in capsys.readouterr().err
    assert build(int4, fp8, int4.parent, "--force") == 2


def _truncate_source_of_last_swap(plan) -> Path:
    path = plan.swaps[-1].weight[0]
    os.truncate(path, plan.swaps[-1].weight[1].start + 10)
    return path


@pytest.mark.parametrize("existing", [False, True], ids=["fresh", "force-over-existing"])
def test_failure_halfway_leaves_no_output(pair: tuple[Path, Path], tmp_path: Path, existing: bool) -> None:
    int4, fp8 = pair
    out = tmp_path / "hybrid"
    if existing:
        out.mkdir()
        (out / "old").write_text("previous build")
    plan = plan_hybrid(Checkpoint.open(int4), Checkpoint.open(fp8))
    _truncate_source_of_last_swap(plan)  # the FP8 shard changes after planning
    with pytest.raises(SparkmodsError, match=r"ended .* bytes early"):
        build_hybrid(plan, out, force=existing, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["fp8", "int4"] + (["hybrid"] if existing else []))
    if existing:
        assert [p.name for p in out.iterdir()] == ["old"]


def test_interrupt_mid_copy_leaves_no_output(
    pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    int4, fp8 = pair
    copied = []

    @contextmanager
    def interrupting(total: int, description: str, enabled: bool = True) -> Iterator:
        def advance(n: int) -> None:
            copied.append(n)
            if sum(copied) > total // 2:
                raise KeyboardInterrupt

        yield advance

    monkeypatch.setattr(hybrid_build, "byte_progress", interrupting)
    plan = plan_hybrid(Checkpoint.open(int4), Checkpoint.open(fp8))
    with pytest.raises(KeyboardInterrupt):
        build_hybrid(plan, tmp_path / "hybrid", progress=False)
    assert sum(copied) > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fp8", "int4"]


def _rewrite(root: Path, edit) -> None:
    """Re-write a checkpoint folder with each spec passed through `edit` (None drops it)."""
    specs = []
    for path in sorted(root.glob("model-*.safetensors")):
        for name, (dtype, shape, _) in cf.read_tensors(path).items():
            spec = edit(cf.Spec(name, dtype, shape))
            if spec is not None:
                specs.append(spec)
    config = json.loads((root / "config.json").read_text())
    for path in root.glob("model-*.safetensors"):
        path.unlink()
    cf.write_checkpoint(root, specs, config=config)


SE1 = "model.language_model.layers.1.mlp.shared_expert"


@pytest.mark.parametrize(
    "side, edit, message",
    [
        ("fp8", lambda s: None if s.name == f"{SE1}.up_proj.weight_scale_inv" else s, "no weight_scale_inv"),
        ("fp8", lambda s: None if s.name == f"{SE1}.down_proj.weight" else s, "is not in --fp8"),
        ("fp8", lambda s: cf.Spec(s.name, "BF16", s.shape) if s.name == f"{SE1}.gate_proj.weight" else s,
         "expected FP8"),
        ("fp8", lambda s: cf.Spec(s.name, s.dtype, (4, 3)) if s.name == f"{SE1}.down_proj.weight_scale_inv" else s,
         "do not fit block size"),
        ("int4", lambda s: cf.Spec(s.name, "F8_E4M3", s.shape) if s.name == f"{SE1}.up_proj.weight" else s,
         "already a hybrid"),
    ],
    ids=["missing-scale", "missing-weight", "not-fp8", "block-mismatch", "already-hybrid"],
)
def test_bad_swaps_fail_the_plan(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], side: str, edit, message: str
) -> None:
    int4, fp8 = pair
    _rewrite(int4 if side == "int4" else fp8, edit)
    out = tmp_path / "hybrid"
    assert build(int4, fp8, out, "--dry-run") == 1
    assert message in capsys.readouterr().out
    assert build(int4, fp8, out) == 2
    err = capsys.readouterr().err
    assert "cannot build" in err and message in err and err.count("\n") == 1
    assert not out.exists()


def test_different_models_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    int4 = cf.write_int4_autoround(tmp_path / "int4")
    fp8 = cf.write_fp8(tmp_path / "fp8", cf.Shape(shared_intermediate=128))
    assert build(int4, fp8, tmp_path / "out") == 2
    assert "different models?" in capsys.readouterr().err


def test_not_an_autoround_checkpoint(pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, fp8 = pair
    assert build(fp8, fp8, tmp_path / "out") == 2
    assert "already FP8" in capsys.readouterr().err


def test_hf_snapshots_as_inputs_leave_the_blobs_alone(tmp_path: Path) -> None:
    int4 = cf.hf_snapshot(tmp_path / "hub", "Intel/tiny-int4", cf.write_int4_autoround(tmp_path / "a", mtp="unindexed"))
    fp8 = cf.hf_snapshot(tmp_path / "hub", "Qwen/tiny-fp8", cf.write_fp8(tmp_path / "b"))
    blobs = {p: p.read_bytes() for p in (tmp_path / "hub").rglob("blobs/*")}
    out = tmp_path / "hybrid"
    assert build(int4, fp8, out) == 0
    assert {p: p.read_bytes() for p in (tmp_path / "hub").rglob("blobs/*")} == blobs
    assert not any(p.is_symlink() for p in out.iterdir())
    assert set(all_tensors(out)) >= set(all_tensors(int4))


def test_hf_repo_ids_through_huggingface_hub(tmp_path: Path) -> None:
    """Real huggingface_hub resolving repo ids from a populated cache (offline mode)."""
    pytest.importorskip("huggingface_hub")
    cf.hf_snapshot(tmp_path / "hub", "Intel/tiny-int4", cf.write_int4_autoround(tmp_path / "a"))
    cf.hf_snapshot(tmp_path / "hub", "Qwen/tiny-fp8", cf.write_fp8(tmp_path / "b"))
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    out = tmp_path / "hybrid"
    cmd = [sys.executable, "-m", "sparkmods", "checkpoint", "build-hybrid",
           "--int4", "Intel/tiny-int4", "--fp8", "Qwen/tiny-fp8", "--out", str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert Index.load(out / INDEX_NAME).weight_map[SHARED[0].replace(".weight", ".weight_scale_inv")]
    done = subprocess.run([*cmd[:-6], "--int4", "Intel/absent", "--fp8", "Qwen/tiny-fp8", "--out", str(out)],
                          env=env, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2 and "Intel/absent: cannot fetch from Hugging Face" in done.stderr
    assert done.stderr.count("\n") == 1


def test_repo_id_without_huggingface_hub_is_one_clear_line(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['huggingface_hub'] = None\n"
        "from sparkmods.cli import main\n"
        "raise SystemExit(main(['checkpoint', 'build-hybrid', '--int4', 'Intel/x', '--fp8', 'Qwen/y', '--out', 'o']))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2
    assert "pip install 'sparkmods[hf]'" in done.stderr and done.stderr.count("\n") == 1


def test_needed_fp8_files_skip_shards_without_shared_experts(tmp_path: Path) -> None:
    fp8 = cf.write_fp8(tmp_path / "fp8", shard_bytes=256 << 10)
    index = Index.load(fp8 / INDEX_NAME)
    needed = needed_fp8_files(index)
    holders = {index.weight_map[n] for n in SHARED} | {index.weight_map[n.replace(".weight", ".weight_scale_inv")] for n in SHARED}
    assert set(needed) == holders and len(needed) < len(set(index.weight_map.values()))


# Runs the CLI and prints the process's own peak RSS (VmHWM, reset by exec). ru_maxrss of
# a child would not do: Linux folds the forking parent's RSS (pytest's) into it.
_MEASURE = (
    "import sys\n"
    "from sparkmods.cli import main\n"
    "rc = main(sys.argv[1:]) if len(sys.argv) > 1 else 0\n"
    "hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
    "print(int(hwm.split()[1]) * 1024, file=sys.stderr)\n"
    "raise SystemExit(rc)\n"
)


def _peak_rss(*args: str) -> int:
    done = subprocess.run([sys.executable, "-c", _MEASURE, *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return int(done.stderr.strip().splitlines()[-1])


def test_peak_memory_is_bounded_by_a_buffer_not_the_checkpoint(tmp_path: Path) -> None:
    """~300 MB of checkpoint with 50 MB tensors: the CLI's peak RSS grows by far less."""
    big = cf.Shape(num_layers=4, hidden=2048, shared_intermediate=4096, num_experts=2, moe_intermediate=256,
                   vocab=2048, vision=False)
    int4 = cf.write_int4_autoround(tmp_path / "int4", big, shard_bytes=128 << 20)
    fp8 = cf.write_fp8(tmp_path / "fp8", big, routed_experts=False, shard_bytes=128 << 20)
    size = sum(p.stat().st_size for p in int4.iterdir())
    baseline = _peak_rss()  # interpreter + CLI imports
    peak = _peak_rss("checkpoint", "build-hybrid", "--int4", str(int4), "--fp8", str(fp8),
                     "--out", str(tmp_path / "out"))
    assert size > 250e6
    assert peak - baseline < 20e6, (peak, baseline, size)
