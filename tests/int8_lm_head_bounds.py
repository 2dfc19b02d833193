"""How far the int8-lm-head's logits may be from the exact 16-bit head's: one bound, shared.

Used by the torch-path and tensor-parallel tests and by the vLLM probe (which runs under a vLLM
environment's python and imports this file from beside it). Needs only torch.
"""

from __future__ import annotations

from typing import Any, Optional

import torch


def logit_bound(x: torch.Tensor, weight: torch.Tensor, rotation: Optional[Any], step: float) -> torch.Tensor:
    """The largest |INT8 logit - exact x W^T| the head may give, per [row, vocab] (float64).

    The head multiplies xr, x R rounded to x's dtype (R the head's rotation, or the identity), by
    W R rounded per row to steps of max|row of W R| / 127. So the error is at most
    |xr - x R| |W R|^T (x's rounding, `step` relative at most) plus |xr|_1 max|row of W R| / 254
    (the weight's rounding, half a step each), plus the output's own rounding, `step` of the
    exact logit; R is applied by the module's FP32 transform, exact to ~1e-7, hence the slack.
    """
    if rotation is None:
        xr, wr = x.double(), weight.double()
    else:
        xr, wr = rotation.apply_fp32(x.float()).double(), rotation.apply_fp32(weight.float()).double()
    exact = x.double() @ weight.double().t()
    x_rounding = step * (xr.abs() @ wr.abs().t())
    w_rounding = xr.abs().sum(dim=1, keepdim=True) * (1 + step) * wr.abs().amax(dim=1)[None, :] / 254
    slack = 1e-6 * (xr.abs() @ wr.abs().t()) + 1e-6
    return x_rounding + w_rounding + step * exact.abs() + slack
