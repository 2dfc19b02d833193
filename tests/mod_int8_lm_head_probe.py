"""Probe run under a vLLM environment's python with the int8-lm-head mod applied (no GPU).

    python mod_int8_lm_head_probe.py

Builds vLLM's own ParallelLMHead and LogitsProcessor in a one-process CPU group, runs them
with the mod switched off, switched on, on tied embeddings and through the top-token paths,
and prints one line `MARK {json}` that test_mod_int8_lm_head_vllm.py asserts on. Everything
torch and vLLM is imported inside main(), so that test imports the shape from here without them.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict

from probekit import LogLines, emit, free_port

ORG_VOCAB, HIDDEN, ROWS = 1000, 64, 3  # 1000 pads to 1024 rows: the trim must remove 24
MODULE_LOGGER = "vllm.model_executor.layers.int8_lm_head"


def main() -> None:
    import inspect

    import torch
    import vllm
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.layers import int8_lm_head, logits_processor
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    from int8_lm_head_bounds import logit_bound

    capture = LogLines(logging.DEBUG)
    module_logger = logging.getLogger(MODULE_LOGGER)
    module_logger.addHandler(capture)
    # Newer vLLM configures its loggers only when an engine starts; INFO must pass here too.
    module_logger.setLevel(logging.INFO)
    torch.manual_seed(0)
    report: Dict[str, Any] = {
        "vllm": vllm.__version__,
        "module_file": int8_lm_head.__file__,
        "hooked": "int8_lm_head.maybe_apply" in inspect.getsource(logits_processor.LogitsProcessor),
        "cuda": torch.cuda.is_available(),
    }
    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    with set_current_vllm_config(config):
        init_distributed_environment(
            world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
            local_rank=0, backend="gloo",
        )
        initialize_model_parallel(1, 1)

        def new_head() -> "ParallelLMHead":
            head = ParallelLMHead(ORG_VOCAB, HIDDEN, params_dtype=torch.bfloat16)
            weight = (torch.randn(ORG_VOCAB, HIDDEN) * 0.05).to(torch.bfloat16)
            head.weight.weight_loader(head.weight, weight)  # vLLM's loader zero-fills the padding
            return head

        processor = logits_processor.LogitsProcessor(ORG_VOCAB)
        x = torch.randn(ROWS, HIDDEN).to(torch.bfloat16)

        def run(head: torch.nn.Module) -> Dict[str, Any]:
            weight = head.weight.detach().clone()
            start = len(capture.lines)
            with torch.inference_mode():
                logits = processor(head, x)
                top = processor.get_top_tokens(head, x)
                topk = processor.get_top_k_tokens(head, x, 5) if hasattr(processor, "get_top_k_tokens") else None
            stock = torch.nn.functional.linear(x, weight)[:, :ORG_VOCAB]
            dequant = None
            state = getattr(head, "_sparkmods_int8_lm_head", None)
            if state is not None:  # what the kernels multiply: x rotated as the head does, the codes
                xr = x if state.rotation is None else int8_lm_head.rotate_rows(x, state.rotation, False)
                dequant = (xr.double() @ (state.qweight.double() * state.scale.double()[:, None]).t())[:, :ORG_VOCAB]
            exact = (x.double() @ weight.double().t())[:, :ORG_VOCAB]
            rotation = None if state is None else state.rotation
            quant_bound = logit_bound(x, weight, rotation, 2.0**-8)[:, :ORG_VOCAB]
            out: Dict[str, Any] = {
                "shape": list(logits.shape),
                "dtype": str(logits.dtype),
                "equal_to_stock": bool(torch.equal(logits, stock)),
                "weight_numel_after": head.weight.numel(),
                "log": capture.lines[start:],
                "top_tokens_are_argmax": bool(torch.equal(logits.gather(1, top.view(-1, 1)).view(-1), logits.max(dim=1).values)),
                "within_quant_bound": bool(((logits.double() - exact).abs() <= quant_bound).all()),
            }
            if dequant is not None:
                out["max_err_vs_dequant_over_bf16_ulp"] = float(((logits.double() - dequant).abs() / (2.0**-8 * dequant.abs() + 1e-12)).max())
            if topk is not None:
                _ids, values = topk
                out["topk_matches_logits"] = bool(torch.equal(values.float(), logits.float().topk(5, dim=1).values))
            return out

        os.environ["SPARKMODS_INT8_LM_HEAD"] = "0"
        report["off"] = run(new_head())
        os.environ["SPARKMODS_INT8_LM_HEAD"] = "1"
        report["on"] = run(new_head())
        embed = VocabParallelEmbedding(ORG_VOCAB, HIDDEN, params_dtype=torch.bfloat16)
        embed.weight.data.normal_(0, 0.05)
        tied = new_head().tie_weights(embed)
        report["tied"] = run(tied)
        report["tied"]["embedding_intact"] = embed.weight.numel() > 0
        report["embedding_as_head"] = run(embed)
        report["torch_fallback_used"] = not report["cuda"]
    emit(report)


if __name__ == "__main__":
    main()
