"""The hybrid checkpoint's FP8 layers one at a time: bf16 against every block-FP8 kernel vLLM offers (GPU).

    PYTHONPATH=SITE python3 ci/bench/bench_hybrid_linear.py --out DIR [--models 35b-a3b,122b-a10b]
        [--rows 1,8,32] [--kernels bf16,cutlass,triton,marlin] [--warm]

hybrid-int4-fp8 gives a Qwen3.5 shared expert's gate_up and down projections vLLM's Fp8LinearMethod,
whose kernel vLLM picks for the GPU (CUTLASS on Hopper); stock serves the same layers in bf16. This
times, at each model's shared-expert shapes and decode row counts, one projection per kernel: a
random block-FP8 weight (128 x 128 scales) through vLLM's own `init_fp8_linear_kernel(force_kernel=)`
and `apply_weights` (activations quantised per 128 columns first, except Marlin's weight-only
kernel), and its dequantised bf16 copy through `torch.nn.functional.linear`. Median microseconds
per call under CUDA-graph replay, the L2 cache flushed before each call (a served step streams
every layer's weights once) unless --warm. A kernel vLLM will not run here is a row that names the
class it fell back to, never a timing under the wrong name. Writes DIR/hybrid_linear.json and
DIR/hybrid_linear.md: per layer, and per decode step (both projections x the model's layers)
against bf16.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_turboquant import InputError, Parser, int_list, markdown_table, median_us
from benchlib.qwen35_shapes import MODELS
from benchlib.report_main import report_main

BLOCK = 128  # the block of Qwen's FP8 checkpoints' weight_scale_inv, and of the activations' groups
KERNELS = ("bf16", "cutlass", "triton", "marlin")
# vLLM's class for each FP8 kernel name, under vllm.model_executor.kernels.linear.scaled_mm
KERNEL_CLASSES = {"cutlass": ("cutlass", "CutlassFp8BlockScaledMMKernel"),
                  "triton": ("triton", "TritonFp8BlockScaledMMKernel"),
                  "marlin": ("marlin", "MarlinFP8ScaledMMLinearKernel")}


def layer_shapes(model: str) -> Dict[str, Tuple[int, int]]:
    """The shared expert's two projections as (out, in) features: gate and up fused, then down."""
    shape = MODELS[model].shape
    return {"gate_up": (2 * shape.shared_intermediate, shape.hidden), "down": (shape.hidden, shape.shared_intermediate)}


def parse_args(argv: Sequence[str]) -> Any:
    p = Parser(prog="bench_hybrid_linear.py", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for hybrid_linear.json/.md")
    p.add_argument("--models", default="35b-a3b,122b-a10b", help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--rows", type=int_list, default=[1, 8, 32], help="tokens a call (a decode step's requests)")
    p.add_argument("--kernels", default=",".join(KERNELS), help=f"comma-separated, of {', '.join(KERNELS)}")
    p.add_argument("--warm", action="store_true", help="calls back to back (the weight stays in L2)")
    args = p.parse_args(list(argv))
    for name, known in (("models", list(MODELS)), ("kernels", list(KERNELS))):
        picked = [v.strip() for v in getattr(args, name).split(",") if v.strip()]
        unknown = [v for v in picked if v not in known]
        if unknown or not picked:
            raise InputError(f"--{name} {','.join(unknown) or '(none)'}: not one of {', '.join(known)}")
        setattr(args, name, picked)
    if "bf16" not in args.kernels:
        raise InputError("--kernels must include bf16: every FP8 kernel is reported against it")
    return args


def dequantised(weight: Any, scale: Any) -> Any:
    """bf16 weight of a block-FP8 one: each 128 x 128 block times its scale (the last may be partial)."""
    import torch

    out, inp = weight.shape
    full = scale.repeat_interleave(BLOCK, 0)[:out].repeat_interleave(BLOCK, 1)[:, :inp]
    return (weight.to(torch.float32) * full).to(torch.bfloat16)


def fp8_layer(weight: Any, scale: Any) -> Any:
    """A module holding what Fp8LinearMethod.create_weights registers for a block-FP8 layer."""
    import torch

    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(weight.clone(), requires_grad=False)
    layer.weight_scale_inv = torch.nn.Parameter(scale.clone(), requires_grad=False)
    layer.output_size_per_partition, layer.input_size_per_partition = weight.shape
    layer.logical_widths = [weight.shape[0]]
    layer.orig_dtype = torch.bfloat16
    layer.weight_block_size = [BLOCK, BLOCK]
    return layer


def fp8_call(name: str, weight: Any, scale: Any, x: Any) -> Tuple[str, Optional[Callable[[], Any]]]:
    """(the class vLLM chose, a call of it on x) for the FP8 kernel `name`; no call when vLLM fell
    back to another class (the kernel does not run on this GPU or this vLLM)."""
    import importlib

    import torch
    from vllm.model_executor.kernels.linear import init_fp8_linear_kernel
    from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape, create_fp8_quant_key

    module, cls = KERNEL_CLASSES[name]
    wanted = getattr(importlib.import_module(f"vllm.model_executor.kernels.linear.scaled_mm.{module}"), cls)
    kernel = init_fp8_linear_kernel(
        activation_quant_key=create_fp8_quant_key(static=False, group_shape=GroupShape(1, BLOCK)),
        weight_quant_key=create_fp8_quant_key(static=True, group_shape=GroupShape(BLOCK, BLOCK)),
        input_dtype=torch.bfloat16, out_dtype=torch.bfloat16, weight_shape=tuple(weight.shape), force_kernel=wanted)
    chosen = type(kernel).__name__
    if not isinstance(kernel, wanted):
        return chosen, None
    layer = fp8_layer(weight, scale)
    kernel.process_weights_after_loading(layer)
    return chosen, lambda: kernel.apply_weights(layer, x)


def rel_err(out: Any, ref: Any) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def run(args: Any) -> Dict[str, Any]:
    # Marlin's FP8 kernel refuses a GPU with native FP8 unless this is set; forcing each kernel by
    # name makes it harmless to the others
    os.environ.setdefault("VLLM_TEST_FORCE_FP8_MARLIN", "1")
    import torch
    import vllm
    from vllm.config import VllmConfig, set_current_vllm_config

    gen = torch.Generator(device="cuda").manual_seed(0)
    rows: List[Dict[str, Any]] = []
    with set_current_vllm_config(VllmConfig()):
        for model in args.models:
            for layer, (out, inp) in layer_shapes(model).items():
                weight = (torch.randn(out, inp, device="cuda", generator=gen) * 0.05).to(torch.float8_e4m3fn)
                scale = torch.rand(-(-out // BLOCK), -(-inp // BLOCK), device="cuda", generator=gen) * 0.01 + 0.001
                bf16 = dequantised(weight, scale)
                for m in args.rows:
                    x = torch.randn(m, inp, device="cuda", dtype=torch.bfloat16, generator=gen)
                    ref = torch.nn.functional.linear(x, bf16)
                    for name in args.kernels:
                        row: Dict[str, Any] = {"model": model, "layer": layer, "rows": m, "kernel": name}
                        try:
                            chosen, call = ("bf16", lambda: torch.nn.functional.linear(x, bf16)) if name == "bf16" else fp8_call(name, weight, scale, x)
                            row["class"] = chosen
                            if call is not None:
                                row["rel_err"] = round(rel_err(call(), ref), 4)
                                us, how = median_us(call, False, cold=not args.warm)
                                row.update(us=None if us is None else round(us, 2), timing=how)
                        except Exception as exc:  # noqa: BLE001 - one kernel that fails is a row saying so
                            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    return {"gpu": torch.cuda.get_device_name(), "vllm": vllm.__version__, "torch": torch.__version__,
            "l2": "warm" if args.warm else "flushed before each call", "rows": rows}


def step_extra_ms(rows: Sequence[Dict[str, Any]], model: str, kernel: str, m: int) -> Optional[float]:
    """What the kernel adds to a decode step over bf16: both projections, every layer of the model."""
    def us(name: str) -> Optional[float]:
        times = [r.get("us") for r in rows if (r["model"], r["rows"], r["kernel"]) == (model, m, name)]
        return None if len(times) != len(layer_shapes(model)) or None in times else sum(times)
    ours, base = us(kernel), us("bf16")
    return None if ours is None or base is None else (ours - base) * MODELS[model].shape.num_layers / 1000


def render(results: Dict[str, Any]) -> str:
    rows = results["rows"]
    kernels = [k for k in KERNELS if any(r["kernel"] == k for r in rows)]

    def cell(r: Dict[str, Any]) -> str:
        if r.get("us") is not None:
            return f"{r['us']:.2f}"
        return f"- ({r.get('error') or 'vLLM chose ' + r.get('class', '?')})"

    per_layer: List[Dict[str, Any]] = []
    for model, layer, m in dict.fromkeys((r["model"], r["layer"], r["rows"]) for r in rows):
        by_kernel = {r["kernel"]: r for r in rows if (r["model"], r["layer"], r["rows"]) == (model, layer, m)}
        per_layer.append({"model": model, "layer": layer, "rows": str(m), **{k: cell(r) for k, r in by_kernel.items()}})
    fp8 = [k for k in kernels if k != "bf16"]
    per_step: List[Dict[str, Any]] = []
    for model, m in dict.fromkeys((r["model"], r["rows"]) for r in rows):
        extras = {k: step_extra_ms(rows, model, k, m) for k in fp8}
        per_step.append({"model": model, "rows": str(m), **{k: "-" if e is None else f"{e:+.3f}" for k, e in extras.items()}})
    return (f"# Shared-expert projections: bf16 against vLLM's block-FP8 kernels ({results['gpu']}, vLLM {results['vllm']})\n\n"
            f"Median microseconds per call under CUDA-graph replay, L2 {results['l2']}; torch {results['torch']}. "
            "Made by `ci/bench/bench_hybrid_linear.py`.\n\n"
            + markdown_table(per_layer, ["model", "layer", "rows", *kernels])
            + "\n\nWhat each FP8 kernel adds to a decode step over bf16 (ms; both projections x the model's layers):\n\n"
            + markdown_table(per_step, ["model", "rows", *fp8]) + "\n")


def main(argv: Optional[Sequence[str]] = None) -> int:
    return report_main("bench_hybrid_linear.py", "hybrid_linear", argv, parse_args, run, render,
                       lambda results: any("error" in r for r in results["rows"]))


if __name__ == "__main__":
    sys.exit(main())
