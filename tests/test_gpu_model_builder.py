"""ci/gpu/tiny_qwen35.py: the tiny Qwen3.5-MoE checkpoints the GPU end-to-end run serves.

The strong check loads the bf16 and the dequantised-hybrid builds with transformers' own
Qwen3.5-MoE code on CPU and runs one teacher-forced forward pass: argmax at every position must
be f(token), the permutation the peaked model is built to follow. The rest checks names, dtypes,
packing and the tokenizer, and the next-token and MTP maps in plain PyTorch (including an INT8
head), and, over the network, that vLLM 0.21.0's Qwen3.5 code names every module we write.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from extras import need

torch = need("torch")
transformers = need("transformers")

from safetensors import safe_open  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "ci" / "gpu"))

import tiny_qwen35 as builder  # noqa: E402
from tiny_quant import gptq_unpack  # noqa: E402
from tiny_tokenizer import SCRIPT, SPECIAL  # noqa: E402
from tiny_weights import TOP_LOGIT  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    out = {}
    for key, variant, mtp in (("bf16", "bf16", "extra"), ("hybrid", "hybrid", "none"), ("dequant", "dequant", "none")):
        out[key] = root / key
        builder.build(out[key], variant, mtp, peaked=True)
    return out


def _tensors(root: Path) -> dict[str, torch.Tensor]:
    found = {}
    for path in sorted(root.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            found.update({name: f.get_tensor(name) for name in f.keys()})  # noqa: SIM118 - safe_open lists names only by keys()
    return found


def _manifest(root: Path) -> dict:
    return json.loads((root / builder.MANIFEST).read_text())


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def test_config_is_the_real_architecture_for_transformers(models):
    config = transformers.AutoConfig.from_pretrained(models["hybrid"])
    assert type(config).__name__ == "Qwen3_5MoeConfig"
    text = config.text_config
    assert text.layer_types == ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(12)]
    assert (text.head_dim, text.num_key_value_heads, text.num_experts, text.num_experts_per_tok) == (256, 2, 8, 2)
    assert text.mtp_num_hidden_layers == 1 and text.shared_expert_intermediate_size == 512
    raw = json.loads((models["hybrid"] / "config.json").read_text())
    assert raw["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
    assert raw["quantization_config"]["packing_format"] == "auto_round:auto_gptq"
    assert "quantization_config" not in json.loads((models["bf16"] / "config.json").read_text())


def test_mtp_head_lives_only_in_the_unindexed_extra_file(models):
    index = json.loads((models["bf16"] / "model.safetensors.index.json").read_text())["weight_map"]
    assert not any(name.startswith("mtp.") for name in index)
    with safe_open(str(models["bf16"] / builder.MTP_FILE), "pt") as f:
        names = list(f.keys())
    assert names and all(name.startswith("mtp.") for name in names)
    assert "mtp.layers.0.mlp.experts.7.down_proj.weight" in names
    assert not (models["hybrid"] / builder.MTP_FILE).exists()


def test_hybrid_storage_and_the_dequantised_twin(models):
    hybrid, twin = _tensors(models["hybrid"]), _tensors(models["dequant"])
    p = "model.language_model.layers.3"
    assert hybrid[f"{p}.mlp.shared_expert.up_proj.weight"].dtype == torch.float8_e4m3fn
    assert hybrid[f"{p}.mlp.shared_expert.up_proj.weight_scale_inv"].shape == (4, 4)
    assert hybrid[f"{p}.mlp.experts.0.gate_proj.qweight"].shape == (512 // 8, 256)
    assert hybrid[f"{p}.mlp.experts.0.gate_proj.scales"].dtype == torch.float16
    assert hybrid["model.language_model.layers.0.linear_attn.in_proj_a.weight"].dtype == torch.bfloat16
    assert int(hybrid[f"{p}.mlp.experts.0.gate_proj.qzeros"][0, 0]) & 0xFFFFFFFF == 0x77777777
    for module in (f"{p}.mlp.experts.5.down_proj", f"{p}.self_attn.q_proj", "model.language_model.layers.0.linear_attn.out_proj"):
        unpacked = gptq_unpack(hybrid[module + ".qweight"], hybrid[module + ".scales"])
        assert torch.equal(unpacked.to(torch.bfloat16), twin[module + ".weight"])
    fp8 = f"{p}.mlp.shared_expert.down_proj"
    scale = hybrid[fp8 + ".weight_scale_inv"].repeat_interleave(128, 0).repeat_interleave(128, 1)
    assert torch.equal((hybrid[fp8 + ".weight"].float() * scale).to(torch.bfloat16), twin[fp8 + ".weight"])


def test_tokenizer_round_trip_and_special_tokens(models):
    tok = transformers.AutoTokenizer.from_pretrained(models["bf16"])
    text = "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n<think>\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    for name in SPECIAL + ("<think>", "</think>", "<tool_call>", "</tool_call>"):
        assert len(tok(name, add_special_tokens=False)["input_ids"]) == 1, name
    assert tok.eos_token == "<|im_end|>"
    script = [tok.convert_tokens_to_ids(piece) for piece in SCRIPT]
    assert "<tool_call>" in tok.decode(script, skip_special_tokens=True)
    assert "<|im_end|>" not in tok.decode(script, skip_special_tokens=True)
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def _next_token_logits(t: dict[str, torch.Tensor], ids: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """Embedding -> final RMSNorm -> LM head, the path the peaked design relies on."""
    embed = t["model.language_model.embed_tokens.weight"].float()[ids]
    return _rms(embed) @ head.T


def _int8(head: torch.Tensor) -> torch.Tensor:
    scale = head.abs().amax(dim=1, keepdim=True) / 127
    return torch.clamp(torch.round(head / scale), -127, 127) * scale


def test_next_token_and_mtp_maps_have_large_margins(models):
    t, m = _tensors(models["bf16"]), _manifest(models["bf16"])
    f = torch.tensor(m["f"])
    ids = torch.arange(m["tokenizer_size"])
    head = t["lm_head.weight"].float()
    for name, weights in (("bf16", head), ("int8", _int8(head))):
        logits = _next_token_logits(t, ids, weights)
        top2 = logits.topk(2, dim=1).values
        assert torch.equal(logits.argmax(1), f[ids]), name
        assert (top2[:, 0] - top2[:, 1]).min() > 10, name
        assert abs(float(top2[:, 0].mean()) - TOP_LOGIT) < 1
    # MTP at the position of token t: embedding of t' = f(t) and the target's hidden state.
    nxt = f[ids]
    hidden = _rms(t["model.language_model.embed_tokens.weight"].float()[ids])
    embed = _rms(t["model.language_model.embed_tokens.weight"].float()[nxt])
    fc = t["mtp.fc.weight"].float()
    drafted = (_rms(torch.cat([embed, hidden], dim=1) @ fc.T) @ head.T).argmax(1)
    assert torch.equal(drafted, f[nxt])
    untrained = torch.randn(fc.shape, generator=torch.Generator().manual_seed(1)) / math.sqrt(fc.shape[1])
    random_drafts = (_rms(torch.cat([embed, hidden], dim=1) @ untrained.T) @ head.T).argmax(1)
    assert (random_drafts == f[nxt]).float().mean() < 0.05


@pytest.mark.parametrize("key", ["bf16", "dequant"])
def test_transformers_greedy_follows_the_permutation(models, key):
    """transformers' own Qwen3.5-MoE code reads our config and weights; argmax follows f."""
    m = _manifest(models[key])
    model = transformers.Qwen3_5MoeForConditionalGeneration.from_pretrained(models[key], dtype=torch.bfloat16)
    model.eval()
    f = m["f"]
    seq = m["ordinary"][40:46]
    for _ in range(10):
        seq.append(f[seq[-1]])
    with torch.no_grad():
        logits = model(torch.tensor([seq])).logits[0].float()
    assert logits.argmax(-1).tolist() == [f[x] for x in seq]
    top2 = logits.topk(2, dim=-1).values
    assert float((top2[:, 0] - top2[:, 1]).min()) > 8


def test_cli_refuses_an_existing_folder(tmp_path, capsys):
    (tmp_path / "x").mkdir()
    assert builder.main(["--out", str(tmp_path / "x")]) == 2
    assert "exists; pass --force" in capsys.readouterr().err


@pytest.mark.network
def test_vllm_021_names_every_module_we_write(models):
    """Every module name of our checkpoint appears in vLLM 0.21.0's Qwen3.5 / Qwen3-Next code."""
    from sparkmods.sources import open_targets

    src = open_targets("0.21.0")[0]
    code = "".join((src.read(f"vllm/model_executor/models/{name}.py") or b"").decode()
                   for name in ("qwen3_5", "qwen3_5_mtp", "qwen3_next", "qwen3_vl"))
    code += (src.read("vllm/model_executor/layers/mamba/gdn_linear_attn.py") or b"").decode()
    parts = set()
    for name in list(_tensors(models["bf16"])) + list(_tensors(models["hybrid"])):
        parts.update(p for p in name.split(".")[:-1] if not p.isdigit())
    parts -= {"model", "language_model", "mtp", "layers"}
    missing = sorted(p for p in parts if f'"{p}"' not in code and f".{p}" not in code and f"{p}=" not in code
                     and f"'{p}'" not in code)
    assert not missing, missing
