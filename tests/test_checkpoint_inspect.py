"""`sparkmods checkpoint inspect`: one synthetic checkpoint per finding, through the CLI."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

import ckptfactory as cf
from sparkmods.cli import main

S = cf.Shape()


def inspect(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code = main(["checkpoint", "inspect", str(root), "--json"])
    return code, json.loads(capsys.readouterr().out)


def codes(report: dict) -> dict[str, str]:
    return {f["code"]: f["level"] for f in report["findings"]}


def finding(report: dict, code: str) -> dict:
    return next(f for f in report["findings"] if f["code"] == code)


def test_intel_autoround_checkpoint_is_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = cf.write_int4_autoround(tmp_path / "int4")
    code, report = inspect(root, capsys)
    assert code == 0
    assert codes(report) == {"hybrid-candidate": "info", "mtp": "info"}
    q = report["summary"]["quantization"]
    assert q["quant_method"] == "auto-round" and q["bits"] == 4 and q["group_size"] == 128
    deltanet = sum(S.layer_type(i) == "linear_attention" for i in range(S.num_layers))
    assert q["extra_config_16bit"] == 3 * S.num_layers + 2 * deltanet  # shared experts, in_proj_a/b
    assert report["summary"]["mtp"]["tensors"] == len(cf.mtp_specs(S))
    assert report["summary"]["fp8"] == {"layers": 0, "block": None}


def test_unindexed_mtp_head_points_to_add_mtp(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = cf.write_int4_autoround(tmp_path / "int4", mtp="unindexed")
    code, report = inspect(root, capsys)
    assert code == 1
    f = finding(report, "mtp-unindexed")
    assert f["level"] == "warning" and "not indexed" in f["message"]
    assert "sparkmods checkpoint add-mtp" in f["hint"] and "mtp-weights" in f["hint"]
    assert "unindexed-file" not in codes(report)  # the MTP file is reported once, as MTP


def test_missing_mtp_head_declared_by_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = cf.write_int4_autoround(tmp_path / "int4", mtp="absent")
    code, report = inspect(root, capsys)
    assert code == 1 and codes(report)["mtp-absent"] == "warning"
    assert "--target" in finding(report, "mtp-absent")["hint"]


def test_index_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = cf.write_int4_autoround(tmp_path / "int4")

    def damage(doc: dict) -> None:
        wm = doc["weight_map"]
        wm.pop("model.language_model.norm.weight")            # unindexed tensor
        wm["model.language_model.ghost.weight"] = "model-00001-of-00004.safetensors"  # not in that file
        wm["model.language_model.lost.weight"] = "model-00099-of-00099.safetensors"   # file absent
        doc["metadata"]["total_size"] += 1

    cf.edit_index(root, damage)
    code, report = inspect(root, capsys)
    found = codes(report)
    assert code == 1
    assert found["unindexed-tensor"] == "warning"
    assert found["index-tensor-missing"] == "error"
    assert found["index-missing-file"] == "error"
    assert found["total-size"] == "warning"
    assert "model.language_model.norm.weight" in finding(report, "unindexed-tensor")["message"]


def test_stray_and_duplicate_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = cf.write_int4_autoround(tmp_path / "int4")
    cf.write_safetensors(root / "stray.safetensors", [cf.Spec("lm_head.weight", "BF16", (S.vocab, S.hidden))])
    _code, report = inspect(root, capsys)
    assert codes(report)["unindexed-file"] == "warning"
    assert codes(report)["duplicate-tensor"] == "error"
    assert "lm_head.weight" in finding(report, "duplicate-tensor")["message"]


def test_corrupt_shard_is_a_finding_not_a_crash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = cf.write_int4_autoround(tmp_path / "int4")
    shard = root / "model-00002-of-00004.safetensors"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    code, report = inspect(root, capsys)
    assert code == 1 and codes(report)["invalid-header"] == "error"
    assert shard.name in finding(report, "invalid-header")["message"]


def test_qwen_fp8_checkpoint_block_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = cf.write_fp8(tmp_path / "fp8")
    code, report = inspect(root, capsys)
    assert code == 0
    assert report["summary"]["fp8"]["block"] == [128, 128]
    assert report["summary"]["quantization"]["weight_block_size"] == [128, 128]


def _fp8_variant(root: Path, drop: set[str] = frozenset(), reshape: dict | None = None, config: dict | None = None) -> Path:
    specs = [s for s in cf.main_specs(S, attn="fp8", experts="fp8", shared="fp8") if s.name not in drop]
    specs = [cf.Spec(s.name, s.dtype, (reshape or {}).get(s.name, s.shape)) for s in specs]
    return cf.write_checkpoint(root, specs, config=config or cf.model_config(S, cf.fp8_config()))


SE = "model.language_model.layers.1.mlp.shared_expert"


def test_fp8_weight_without_scale_loads_as_garbage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _fp8_variant(tmp_path / "c", drop={f"{SE}.up_proj.weight_scale_inv"})
    code, report = inspect(root, capsys)
    f = finding(report, "fp8-no-scale")
    assert code == 1 and f["level"] == "error"
    assert "garbage" in f["message"] and f"{SE}.up_proj" in f["message"]


def test_fp8_scale_shapes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _fp8_variant(tmp_path / "c", reshape={
        f"{SE}.up_proj.weight_scale_inv": (300, 2),   # more scale rows than weight rows
        f"{SE}.down_proj.weight_scale_inv": (4, 3),   # 64x64 blocks, config says 128x128
    })
    code, report = inspect(root, capsys)
    assert code == 1
    assert f"{SE}.up_proj" in finding(report, "fp8-bad-scale")["message"]
    mismatch = finding(report, "fp8-block-mismatch")
    assert "(128, 128)" in mismatch["message"] and f"{SE}.down_proj" in mismatch["message"]


def test_fp8_without_quantization_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = cf.model_config(S, {})
    config.pop("quantization_config")
    root = _fp8_variant(tmp_path / "c", config=config)
    code, report = inspect(root, capsys)
    assert code == 1 and codes(report)["fp8-no-config"] == "error"


def test_hybrid_checkpoint_needs_the_mod(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    specs = cf.main_specs(S, attn="int4", experts="int4", shared="fp8")
    root = cf.write_checkpoint(
        tmp_path / "hybrid", specs, config=cf.model_config(S, cf.autoround_config(S)),
        extra_files={"model_extra_tensors.safetensors": cf.mtp_specs(S)},
    )
    code, report = inspect(root, capsys)
    assert code == 0
    assert "hybrid-int4-fp8 mod" in finding(report, "hybrid")["hint"]
    assert report["summary"]["fp8"] == {"layers": 3 * S.num_layers, "block": [128, 128]}


def test_fp8_in_a_layer_autoround_quantizes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    specs = cf.main_specs(S, attn="fp8", experts="int4", shared="fp8")  # attention FP8, but INT4 per config
    root = cf.write_checkpoint(tmp_path / "bad", specs, config=cf.model_config(S, cf.autoround_config(S)))
    code, report = inspect(root, capsys)
    f = finding(report, "fp8-in-int4-layer")
    assert code == 1 and "qweight" in f["message"]
    assert "linear_attn" in f["message"] or "self_attn" in f["message"]


def test_text_output_names_findings_and_hints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = cf.write_int4_autoround(tmp_path / "int4", mtp="unindexed")
    assert main(["checkpoint", "inspect", str(root)]) == 1
    out = capsys.readouterr().out
    assert "warning MTP head present but not indexed" in out
    assert "-> run `sparkmods checkpoint add-mtp" in out


def test_no_index_single_and_multi_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "plain"
    root.mkdir()
    cf.write_safetensors(root / "model.safetensors", [cf.Spec("lm_head.weight", "BF16", (4, 4))])
    code, report = inspect(root, capsys)
    assert code == 0 and "no-index" not in codes(report)
    cf.write_safetensors(root / "more.safetensors", [cf.Spec("x.weight", "BF16", (4, 4))])
    code, report = inspect(root, capsys)
    assert code == 0 and codes(report)["no-index"] == "info"


def test_without_config_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = cf.write_int4_autoround(tmp_path / "int4")
    (root / "config.json").unlink()
    code, report = inspect(root, capsys)
    assert code == 0 and codes(report)["no-config"] == "info"
    assert report["summary"]["quantization"] is None


def test_bad_input_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["checkpoint", "inspect", str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["checkpoint", "inspect", str(tmp_path / "empty")]) == 2
    assert "no .safetensors files" in capsys.readouterr().err


def test_headers_only_on_a_sparse_120gb_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Three 40 GB shards (sparse files): inspect must not read the data."""
    root = tmp_path / "big"
    root.mkdir()
    weight_map = {}
    for n in range(3):
        name = f"model-0000{n + 1}-of-00003.safetensors"
        size = 40 << 30
        tensor = f"model.language_model.layers.{n}.mlp.experts.0.down_proj.qweight"
        raw = json.dumps({tensor: {"dtype": "I32", "shape": [size // 4], "data_offsets": [0, size]}}).encode()
        with open(root / name, "wb") as fh:
            fh.write(struct.pack("<Q", len(raw)) + raw)
            fh.truncate(8 + len(raw) + size)
        weight_map[tensor] = name
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 3 * (40 << 30)}, "weight_map": weight_map})
    )
    start = time.perf_counter()
    code, report = inspect(root, capsys)
    assert time.perf_counter() - start < 2
    assert report["summary"]["bytes"] > 120 << 30 and code == 0
