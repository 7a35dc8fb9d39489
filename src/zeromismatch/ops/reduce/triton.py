"""CUDA row reductions over the last dim whose per-row arithmetic depends only on the row length.

One program reduces ROWS rows, each in BLOCK_D-wide pieces accumulated elementwise and summed once at the end
(tl.sum over a fixed layout). ROWS, BLOCK_D and num_warps are functions of the row length D alone, and the
row count is not specialized, so a row gives the same bits in a call of 1 row or of 100k rows.
Differentiable (the backward is plain torch: it need not be invariant).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..triton_math import EXACT


@triton.jit(do_not_specialize=["n_rows", "stride_row"])
def _row_reduce_kernel(x_ptr, out_ptr, n_rows, D, stride_row, SQUARE: tl.constexpr, MEAN: tl.constexpr,
                       ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    rmask = rows < n_rows
    cols = tl.arange(0, BLOCK_D)
    acc = tl.zeros((ROWS, BLOCK_D), dtype=tl.float32)
    base = x_ptr + rows.to(tl.int64)[:, None] * stride_row
    for d0 in range(0, D, BLOCK_D):
        c = d0 + cols
        m = rmask[:, None] & (c[None, :] < D)
        x = tl.load(base + c[None, :], mask=m, other=0.0).to(tl.float32)
        if SQUARE:
            x = x * x
        acc += x
    s = tl.sum(acc, axis=1)
    if MEAN:
        s = s / D
    tl.store(out_ptr + rows, s, mask=rmask)


def _layout(d: int) -> tuple[int, int, int]:
    block_d = min(triton.next_power_of_2(d), 1024)
    rows = max(1, 1024 // block_d)
    return rows, block_d, 4


def _row_reduce_raw(x: torch.Tensor, square: bool, mean: bool) -> torch.Tensor:
    d = x.shape[-1]
    x2 = x.reshape(-1, d)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    n = x2.shape[0]
    out = torch.empty(n, device=x.device, dtype=torch.float32)
    if n:
        rows, block_d, warps = _layout(d)
        _row_reduce_kernel[(triton.cdiv(n, rows),)](
            x2, out, n, d, x2.stride(0), SQUARE=square, MEAN=mean, ROWS=rows, BLOCK_D=block_d, num_warps=warps, **EXACT
        )
    return out.to(x.dtype).reshape(*x.shape[:-1], 1)


class _RowReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, square, mean):
        ctx.save_for_backward(x)
        ctx.square, ctx.mean = square, mean
        return _row_reduce_raw(x, square, mean)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        g = grad.expand_as(x)
        if ctx.square:
            g = g * 2 * x
        if ctx.mean:
            g = g / x.shape[-1]
        return g, None, None


def row_reduce(x: torch.Tensor, square: bool, mean: bool) -> torch.Tensor:
    """[..., D] -> [..., 1]: sum (or mean) of x (or x^2) in fp32, returned in x.dtype."""
    if torch.is_grad_enabled() and x.requires_grad:
        return _RowReduce.apply(x, square, mean)
    return _row_reduce_raw(x, square, mean)
