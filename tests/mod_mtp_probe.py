"""Probe for test_mod_mtp_runtime.py, run by the python of a venv where vLLM is installed.

`python tests/mod_mtp_probe.py JOB.json` reads {"cases": [{"name", "checkpoint"}]} and
prints one line `PROBE-REPORT {json}`: per checkpoint, what the release's DefaultModelLoader
does for an MTP drafter. It holds no tests (pytest does not collect it). Top-level imports
are stdlib only.

Per case:
- files: the weight files `_prepare_weights` selects (the index filter the mod extends);
- mtp_tensors: how many `mtp.*` tensors `get_all_weights` then yields;
- draft_model_type: the model type of the draft ModelConfig, made as vLLM's
  SpeculativeConfig makes it (hf_overrides=SpeculativeConfig.hf_config_override);
- load: "ok", or the error `DefaultModelLoader.load_weights` raises for the drafter.

The drafter: vLLM cannot build its Qwen3.5 MTP model without a GPU (its attention and MoE
layers pick GPU kernels at construction), so `Drafter` is a small torch module with the
real drafter's parameter names (model.fc, model.norm, model.pre_fc_norm_*,
model.embed_tokens, lm_head) whose load_weights renames `mtp.*` to `model.*` as
Qwen3_5MTP.load_weights does and loads through vLLM's AutoWeightsLoader. Everything else,
the loader, file selection, weight iteration and the draft config, is the release's own.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, List

from probekit import emit


def _drafter(hidden: int, vocab: int) -> Any:
    import torch
    from torch import nn
    from vllm.model_executor.models.utils import AutoWeightsLoader

    class Norm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.empty(hidden, dtype=torch.bfloat16), requires_grad=False)

    class Predictor(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed_tokens = nn.Embedding(vocab, hidden, dtype=torch.bfloat16)
            self.fc = nn.Linear(2 * hidden, hidden, bias=False, dtype=torch.bfloat16)
            self.norm, self.pre_fc_norm_hidden, self.pre_fc_norm_embedding = Norm(), Norm(), Norm()

    class Drafter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = Predictor()
            self.lm_head = nn.Linear(hidden, vocab, bias=False, dtype=torch.bfloat16)

        def load_weights(self, weights: Any) -> set:
            own = {name for name, _ in self.named_parameters()}

            def renamed() -> Any:
                for name, tensor in weights:
                    if name.startswith("mtp."):
                        name = "model." + name[len("mtp."):]
                    elif "embed_tokens" in name:
                        name = "model.embed_tokens.weight"
                    if name in own:
                        yield name, tensor

            return AutoWeightsLoader(self).load_weights(renamed())

    return Drafter()


def _case(checkpoint: str) -> Dict[str, Any]:
    from vllm.config import (
        DeviceConfig,
        LoadConfig,
        ModelConfig,
        SpeculativeConfig,
        VllmConfig,
        set_current_vllm_config,
    )
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    out: Dict[str, Any] = {}
    loader = DefaultModelLoader(LoadConfig())
    prepared = loader._prepare_weights(checkpoint, None, None, True, None)
    out["files"] = sorted(os.path.basename(path) for path in prepared[1])
    draft_config = ModelConfig(model=checkpoint, dtype="bfloat16", enforce_eager=True,
                               hf_overrides=SpeculativeConfig.hf_config_override)
    out["draft_model_type"] = draft_config.hf_config.model_type
    out["quantization"] = draft_config.quantization
    text = draft_config.hf_text_config
    drafter = _drafter(text.hidden_size, text.vocab_size)
    out["mtp_tensors"] = sum(1 for name, _ in loader.get_all_weights(draft_config, drafter)
                             if name.startswith("mtp."))
    vllm_config = VllmConfig(model_config=draft_config, load_config=LoadConfig(),
                             device_config=DeviceConfig(device="cpu"))
    try:
        with set_current_vllm_config(vllm_config):
            DefaultModelLoader(LoadConfig()).load_weights(drafter, draft_config)
        out["load"] = "ok"
    except Exception as exc:  # noqa: BLE001 - the probe reports any error of vLLM's to the test
        out["load"] = f"{type(exc).__name__}: {exc}"
    return out


def main(argv: List[str]) -> int:
    job = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    report = {case["name"]: _case(case["checkpoint"]) for case in job["cases"]}
    emit(report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
