"""A linear layer y = x @ W^T whose forward is a given kernel and whose backward is plain torch matmuls (the
backward needs no invariance): the invariant GEMM (triton.py) and the fp32 lm_head (head.py) train through it."""

from __future__ import annotations

from typing import Callable

import torch

Forward = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x2 [M, K], w [N, K]) -> [M, N]


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, w, fwd: Forward):
        ctx.save_for_backward(x2, w)
        return fwd(x2, w)

    @staticmethod
    def backward(ctx, gy):
        x2, w = ctx.saved_tensors
        # in the weight's dtype: a no-op where the output has it, the bf16 rounding of the fp32 logits' gradient
        # for the lm_head (as autograd of a bf16 linear computes it)
        g = gy.to(w.dtype)
        gx = g @ w if ctx.needs_input_grad[0] else None
        gw = g.t() @ x2 if ctx.needs_input_grad[1] else None
        return gx, gw, None


def linear_with(fwd: Forward, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ weight [N, K]^T by `fwd` on the rows flattened to [M, K]; differentiable when autograd needs it."""
    *lead, k = x.shape
    x2 = x.reshape(-1, k)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        y = _Linear.apply(x2, weight, fwd)
    else:
        y = fwd(x2, weight)
    return y.reshape(*lead, weight.shape[0])
