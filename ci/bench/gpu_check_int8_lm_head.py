"""GPU correctness check of the int8-lm-head kernel against float64 and bf16 torch references.

Run on a CUDA machine with torch and Triton (no vLLM needed):
    python3 ci/bench/gpu_check_int8_lm_head.py --out DIR

Error bound (per logit, row m of x, vocab row n of W, hidden size K):
  quantization  s_n = a_n / 127 with a_n = max_k |W[n,k]|, q = round(W / s_n), so
                |W[n,k] - s_n q[n,k]| <= s_n / 2 and |x.W_n - s_n x.q_n| <= a_n ||x_m||_1 / 254;
  accumulation  products x*q are exact in FP32 (8 + 7 significant bits); K FP32 additions
                add at most K 2^-24 s_n sum_k |x q| (counted twice for slack);
  output        rounding to bf16 adds at most 2^-9 |logit| (2^-8 used, for slack).
The head rotates the hidden dimension first (x R and W R, R orthogonal; see the module): W above
is then W R, x the rotated x the kernel reads (x R rounded to bf16), and the total bound adds that
rounding, 2^-8 |x R| . |W R|. The kernel must stay within the sum against the float64 product
with the ORIGINAL weight and x, and within the accumulation and output terms against the float64
product of the rotated x with the dequantized weight.
Exit status 1 when any check fails.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

import torch

from benchlib.int8_lm_head_kernel import load_kernel_module

SHAPES = ((248320, 3072), (151936, 4096), (32001, 2048), (4001, 1000))
BATCHES = tuple(range(1, 17)) + (17, 33, 64, 100, 256, 600, 1024)  # > 32 rows: the split kernel
AGREEMENT_ROWS = 512
# The quantizer divides in FP32 (relative error 2^-24 on codes up to 127): a value within
# 127 * 2^-24 of a half step may round the other way, so a code is off by at most
# 0.5 + 8e-6 steps; 2e-5 of the half step leaves room for that.
HALF_STEP_SLACK = 2e-5


def make_weight(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """Gaussian rows with per-row spread (so per-row scales matter) and a few zero rows."""
    w = torch.randn(n, k, generator=gen, device="cuda") * 0.02
    w *= torch.exp(0.5 * torch.randn(n, 1, generator=gen, device="cuda"))
    w[n // 2] = 0.0  # a padding-like row: its logits must come out exactly 0
    return w.to(torch.bfloat16)


def rotated(qw, t: torch.Tensor) -> torch.Tensor:
    """t times the head's rotation (FP32, the transform the quantizer uses), or t as float."""
    return t.float() if qw.rotation is None else qw.rotation.apply_fp32(t)


def check_quantization(mod, w: torch.Tensor, qw) -> dict:
    """The codes against the rotated weight they quantize."""
    q, s = qw.qweight, qw.scale
    w = rotated(qw, w)
    amax = w.float().abs().amax(dim=1)
    nonzero = amax > 0
    dq_err = (w.double() - q.double() * s.double()[:, None]).abs().amax(dim=1)
    return {
        "codes_in_range": bool(q.abs().max().item() <= 127),
        "scale_is_absmax_over_127": bool(torch.equal(s, amax / 127)),
        "max_code_hits_127": bool((q.abs().amax(dim=1)[nonzero] == 127).all().item()),
        "dequant_err_over_half_step": float((dq_err[nonzero] / s[nonzero].double()).max().item() / 0.5),
        "zero_rows_zero": bool((q[~nonzero] == 0).all().item() and (s[~nonzero] == 0).all().item()),
    }


def check_batches(mod, w: torch.Tensor, qw, gen: torch.Generator) -> dict:
    n, k = w.shape
    w64 = w.double()
    wr64 = rotated(qw, w).double()
    wq64 = qw.qweight.double() * qw.scale.double()[:, None]
    absq64 = qw.qweight.double().abs() * qw.scale.double()[:, None]
    amax = wr64.abs().amax(dim=1)
    worst_total = worst_kernel = worst_quant_ratio = 0.0
    unwritten = 0
    for m in BATCHES:
        x = torch.randn(m, k, generator=gen, device="cuda").to(torch.bfloat16)
        poison = torch.full((m * n + 4096,), float("nan"), dtype=torch.bfloat16, device="cuda")
        del poison  # the kernel's output block reuses this NaN-filled memory: unwritten shows
        out = mod.int8_matmul(x, qw)
        assert out.dtype == x.dtype and out.shape == (m, n)
        unwritten += int((~torch.isfinite(out)).sum().item())
        y = out.double()
        xr = x if qw.rotation is None else mod.rotate_rows(x, qw.rotation, True)
        x64 = xr.double()  # what the kernel multiplies
        ref = x.double() @ w64.t()
        ref_q = x64 @ wq64.t()
        rotation_term = 0.0 if qw.rotation is None else 2.0**-8 * (rotated(qw, x).double().abs() @ wr64.abs().t())
        acc_term = 2 * k * 2.0**-24 * (x64.abs() @ absq64.t())
        kernel = mod.table_config(m).kernel
        if kernel in (mod.SPLIT, mod.W8A8):  # x coded in int8: xscale / (2 LO_STEPS) an entry, xscale / 2 for W8A8
            steps = mod.LO_STEPS if kernel == mod.SPLIT else 1
            x_err = x64.abs().amax(dim=1, keepdim=True) / 127 / (2 * steps) * (1 + 1e-5)
            acc_term = acc_term + x_err * absq64.sum(dim=1)
        round_term = 2.0**-8 * torch.maximum(y.abs(), ref.abs())
        quant_term = x64.abs().sum(dim=1, keepdim=True) * amax[None, :] / 254
        worst_kernel = max(worst_kernel, ((y - ref_q).abs() - acc_term - 2.0**-8 * y.abs()).max().item())
        bound = quant_term + acc_term + round_term + rotation_term
        worst_total = max(worst_total, ((y - ref).abs() - bound).max().item())
        ratio = ((y - ref).abs() / (bound + 1e-30)).max().item()
        worst_quant_ratio = max(worst_quant_ratio, ratio)
    return {
        "batches": list(BATCHES),
        "within_total_bound": worst_total <= 0.0,
        "max_err_over_bound": round(worst_quant_ratio, 4),
        "within_kernel_bound": worst_kernel <= 0.0,
        "unwritten_or_nonfinite": unwritten,
        "zero_row_exact": bool((mod.int8_matmul(x, qw)[:, n // 2] == 0).all().item()),
    }


def check_agreement(mod, w: torch.Tensor, qw, gen: torch.Generator) -> dict:
    """top-1 / top-5 of the INT8 head and of bf16 torch.matmul against float64 logits."""
    k = w.shape[1]
    w64 = w.double()
    hits = {"int8": [0, 0], "bf16": [0, 0]}
    rel = {"int8": 0.0, "bf16": 0.0}
    for _ in range(AGREEMENT_ROWS // 16):
        x = torch.randn(16, k, generator=gen, device="cuda").to(torch.bfloat16)
        ref = x.double() @ w64.t()
        top1, top5 = ref.argmax(dim=1), ref.topk(5, dim=1).indices
        for name, got in (("int8", mod.int8_matmul(x, qw)), ("bf16", torch.matmul(x, w.t()))):
            hits[name][0] += int((got.argmax(dim=1) == top1).sum().item())
            got5 = got.topk(5, dim=1).indices
            hits[name][1] += int((got5[:, :, None] == top5[:, None, :]).any(dim=2).sum().item())
            rel[name] = max(rel[name], ((got.double() - ref).norm() / ref.norm()).item())
    return {
        name: {
            "top1_agreement": round(h[0] / AGREEMENT_ROWS, 4),
            "top5_overlap": round(h[1] / (5 * AGREEMENT_ROWS), 4),
            "max_rel_fro_err": round(rel[name], 6),
        }
        for name, h in hits.items()
    }


def check_fp16_and_3d(mod, qw, k: int, gen: torch.Generator) -> dict:
    """fp16 hidden states and a [B, T, K] input keep their dtype and leading shape."""
    x = torch.randn(2, 3, k, generator=gen, device="cuda").to(torch.float16)
    out = mod.int8_matmul(x, qw)
    xr = rotated(qw, x.reshape(6, k)).double()
    ref = (xr @ (qw.qweight.double() * qw.scale.double()[:, None]).t()).reshape(2, 3, -1)
    return {
        "dtype_kept": out.dtype == torch.float16,
        "shape_kept": tuple(out.shape) == (2, 3, qw.qweight.shape[0]),
        "max_rel_err_vs_dequant": float(((out.double() - ref).abs().max() / ref.abs().max()).item()),
    }


class UnquantizedEmbeddingMethod:
    """Stand-in for vLLM's method of the same name (vLLM is not on the GPU machine)."""

    def apply(self, layer, x, bias=None):
        return torch.nn.functional.linear(x, layer.weight, bias)


class ParallelLMHead(torch.nn.Module):
    """Stand-in head: a weight whose weight_loader is bound to its module, as in vLLM."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.quant_method = UnquantizedEmbeddingMethod()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param, loaded):  # pragma: no cover - never called here
        param.data.copy_(loaded)


def check_head_memory(mod, n: int, k: int, gen: torch.Generator) -> dict:
    """maybe_apply on a head: the 16-bit weight is freed and the log line states the saving."""
    records: list = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    mod.logger.addHandler(handler)
    mod.logger.setLevel(logging.INFO)
    head = ParallelLMHead(make_weight(n, k, gen))
    reference = mod.quantize_head(head.weight.data)
    x = torch.randn(4, k, generator=gen, device="cuda").to(torch.bfloat16)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with torch.inference_mode():
        out = mod.maybe_apply(head, x, None)
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated()
    mod.logger.removeHandler(handler)
    expected = n * k * 2 - reference.nbytes
    return {
        "log": records,
        "weight_freed": head.weight.numel() == 0,
        "same_as_kernel": bool(torch.equal(out, mod.int8_matmul(x, reference))),
        "allocated_drop_mib": round((before - after) / 2**20, 1),
        "expected_saving_mib": round(expected / 2**20, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for gpu_check.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check_int8_lm_head: no CUDA device", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    with tempfile.TemporaryDirectory() as tmp:
        mod = load_kernel_module(Path(tmp))
    if mod.triton is None:
        print("gpu_check_int8_lm_head: Triton is not importable", file=sys.stderr)
        return 2
    gen = torch.Generator(device="cuda").manual_seed(1234)
    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "triton": mod.triton.__version__, "shapes": {}}
    ok = True
    for n, k in SHAPES:
        w = make_weight(n, k, gen)
        qw = mod.quantize_head(w)
        entry = {
            "quantization": check_quantization(mod, w, qw),
            "batches": check_batches(mod, w, qw, gen),
            "agreement": check_agreement(mod, w, qw, gen),
            "fp16_3d": check_fp16_and_3d(mod, qw, k, gen),
        }
        report["shapes"][f"{n}x{k}"] = entry
        quant, bat, agr = entry["quantization"], entry["batches"], entry["agreement"]["int8"]
        shape_ok = (
            all(v for key, v in quant.items() if isinstance(v, bool))
            and quant["dequant_err_over_half_step"] <= 1.0 + HALF_STEP_SLACK
            and bat["within_total_bound"] and bat["within_kernel_bound"]
            and bat["unwritten_or_nonfinite"] == 0 and bat["zero_row_exact"]
            and agr["top1_agreement"] >= 0.9 and agr["top5_overlap"] >= 0.9
            and entry["fp16_3d"]["dtype_kept"] and entry["fp16_3d"]["shape_kept"]
            and entry["fp16_3d"]["max_rel_err_vs_dequant"] < 1e-2
        )
        entry["ok"] = bool(shape_ok)
        ok &= shape_ok
        print(json.dumps({f"{n}x{k}": entry}), flush=True)
        del w, qw
        torch.cuda.empty_cache()
    head = check_head_memory(mod, *SHAPES[0], gen)
    head_ok = (head["weight_freed"] and head["same_as_kernel"] and len(head["log"]) == 1
               and abs(head["allocated_drop_mib"] - head["expected_saving_mib"]) < 64)
    head["ok"] = bool(head_ok)
    report["head"] = head
    print(json.dumps({"head": head}), flush=True)
    ok &= head_ok
    report["ok"] = bool(ok)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print("gpu_check_int8_lm_head:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
