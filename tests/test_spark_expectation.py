"""The Spark byte model (ci/bench/spark_expectation.py) against the public model facts it rests on."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from extras import need

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "ci" / "bench"))

import spark_expectation as se  # noqa: E402
from benchlib.qwen35_shapes import MODELS  # noqa: E402
from ckptfactory import main_specs, mtp_specs  # noqa: E402

M35, M122 = MODELS["35b-a3b"], MODELS["122b-a10b"]


def _params(specs) -> int:
    return sum(math.prod(s.shape) for s in specs)


@pytest.mark.parametrize("model", [M35, M122], ids=lambda m: m.key)
def test_parameter_counts_match_the_model_names(model):
    """Language-model parameters (no vision tower, no MTP) within 2 % of the size in the name, and
    what one token uses (top-k experts, no embedding table) within 15 % of the active size (the
    names round)."""
    s = model.shape
    specs = main_specs(s, attn="bf16", experts="bf16", shared="bf16")
    total = _params(specs)
    assert abs(total / (model.total_b * 1e9) - 1) < 0.02
    experts = _params([x for x in specs if ".experts." in x.name])
    active = total - experts + experts * model.experts_per_token / s.num_experts - s.vocab * s.hidden
    assert abs(active / (model.active_b * 1e9) - 1) < 0.15


def test_122b_hybrid_checkpoint_has_the_published_size():
    """The hybrid 122B checkpoint is ~71 GB and Intel's MTP head 785 tensors of ~4.8 GB (public)."""
    s = M122.shape
    mtp = mtp_specs(s, "bf16")
    assert len(mtp) == 785
    assert abs(sum(x.nbytes for x in mtp) / 4.8e9 - 1) < 0.06
    hybrid = sum(x.nbytes for x in main_specs(s, attn="int4", experts="int4", shared="fp8"))
    assert abs((hybrid + sum(x.nbytes for x in mtp)) / 71e9 - 1) < 0.03


def test_kv_bytes_bf16_and_turboquant():
    """12 full-attention layers x 2 heads x 256: 2048 bytes a layer in BF16, the mod's 460 in k3v4_nc."""
    need("torch")  # the TurboQuant cache size comes from the mod's tq_format, which imports torch
    assert se.full_attention_layers(M122) == 12
    assert se.kv_bytes_per_token(M122, "bf16") == 12 * 2048
    assert se.kv_bytes_per_token(M122, se.TQ_DTYPE) == 12 * 460
    assert se.kv_bytes_per_token(M35, "bf16", layers=1) == 2048


def test_int8_head_is_codes_plus_a_scale_per_row():
    head = next(x for x in main_specs(replace(M122.shape, num_layers=0), attn="bf16", experts=None, shared="bf16")
                if x.name == "lm_head.weight")
    assert se.storage_bytes(head, "bf16") == 248320 * 3072 * 2
    assert se.storage_bytes(head, "int8") == 248320 * 3072 + 4 * 248320


def test_each_mod_changes_only_its_own_part():
    need("torch")  # the TurboQuant cache size comes from the mod's tq_format, which imports torch
    stock = se.step(M122, se.Setup("stock"), 1024)["parts"]
    hybrid = se.step(M122, se.Setup("h", shared="fp8"), 1024)["parts"]
    int8 = se.step(M122, se.Setup("i", head="int8"), 1024)["parts"]
    tq = se.step(M122, se.Setup("t", kv=se.TQ_DTYPE), 1024)["parts"]
    for changed, part in ((hybrid, "shared expert"), (int8, "LM head"), (tq, "KV cache")):
        assert changed[part] < stock[part]
        assert {k: v for k, v in changed.items() if k != part} == {k: v for k, v in stock.items() if k != part}
    # FP8 weights (1 byte) plus one fp32 scale per 128x128 block against 2 bytes per weight
    assert hybrid["shared expert"] / stock["shared expert"] == pytest.approx(0.5, abs=0.01)


def test_routed_experts_are_top_k_of_all_and_mtp_reads_more_per_step():
    s = M122.shape
    all_experts = sum(x.nbytes for x in main_specs(s, attn="int4", experts="int4", shared="bf16") if ".experts." in x.name)
    one = se.weight_bytes(M122, se.Setup("stock"))
    assert one["routed experts"] == pytest.approx(all_experts * 8 / 256)
    two = se.weight_bytes(M122, se.Setup("stock"), tokens=2)
    assert two["routed experts"] == pytest.approx(all_experts * (1 - (1 - 8 / 256) ** 2))
    mtp = se.step(M122, se.Setup("m", mtp=1), 1024)
    assert mtp["tokens"] == pytest.approx(1.95)
    assert mtp["parts"]["MTP layer + draft head"] > se.storage_bytes(
        next(x for x in main_specs(s, attn="bf16", experts=None, shared="bf16") if x.name == "lm_head.weight"), "bf16")


def test_turboquant_gains_grow_with_context():
    need("torch")  # the TurboQuant cache size comes from the mod's tq_format, which imports torch
    gains = [se.tok_s(M122, se.Setup("t", kv=se.TQ_DTYPE), c) / se.tok_s(M122, se.Setup("s"), c) for c in se.CONTEXTS]
    assert gains == sorted(gains) and gains[0] < 1.01 < gains[-1]


def test_published_rows_and_verdicts():
    need("torch")  # the TurboQuant cache size comes from the mod's tq_format, which imports torch
    rows = se.published()
    assert rows[0]["expected_tok_s"] == rows[0]["published_tok_s"] == 28.3
    lines = se.verdicts(rows)
    assert any("hybrid FP8" in line and "agrees with" in line for line in lines)
    assert any("INT8 LM head (with MTP)" in line and "faster than" in line for line in lines)


def test_committed_expectation_is_what_the_script_writes(tmp_path):
    need("torch")  # the TurboQuant cache size comes from the mod's tq_format, which imports torch
    assert se.main(["--out", str(tmp_path)]) == 0
    committed = REPO / "ci" / "bench" / "results" / "spark-expectation-any-cpu"
    assert json.loads((tmp_path / "expectation.json").read_text()) == json.loads((committed / "expectation.json").read_text())
    assert (tmp_path / "expectation.md").read_text() == (committed / "expectation.md").read_text()
    assert "estimate, not a measurement" in (committed / "expectation.md").read_text()


def test_out_naming_a_file_is_refused(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("")
    assert se.main(["--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a folder" in err
