"""Softmax over the last dim in key blocks (the blocked attention's, on CUDA): one program per row; the max over
the row (exact in any order), then the sum of exp(x - max) block by block, in order, each block one tl.sum of a
fixed layout, then exp(x - max) / sum. A block of -inf adds exactly 0 to the sum and writes zeros, so a row
padded with whole -inf blocks has the same bits in its first blocks: a decode step may read more keys than its
query needs (a CUDA-graph bucket) and equal the trainer's pass over exactly L keys. Rows never interact and the
row count is not specialized: batch-invariant. Computed in fp32, stored in the input dtype (as torch.softmax).
Differentiable: the backward is plain torch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["n_cols"])
def _key_block_softmax_kernel(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = row * n_cols
    cols = tl.arange(0, BLOCK)
    m = tl.full((BLOCK,), float("-inf"), tl.float32)
    for c0 in range(0, n_cols, BLOCK):
        m = tl.maximum(m, tl.load(x_ptr + base + c0 + cols).to(tl.float32))
    mx = tl.max(m, axis=0)
    total = tl.sum(tl.zeros((BLOCK,), tl.float32), axis=0)
    for c0 in range(0, n_cols, BLOCK):
        e = tl.exp(tl.load(x_ptr + base + c0 + cols).to(tl.float32) - mx)
        total = total + tl.sum(e, axis=0)
    for c0 in range(0, n_cols, BLOCK):
        e = tl.exp(tl.load(x_ptr + base + c0 + cols).to(tl.float32) - mx)
        tl.store(y_ptr + base + c0 + cols, (e / total).to(y_ptr.dtype.element_ty))


def _forward(x: torch.Tensor, block: int) -> torch.Tensor:
    n_cols = x.shape[-1]
    assert n_cols % block == 0, (x.shape, block)
    x2 = x.reshape(-1, n_cols).contiguous()
    y = torch.empty_like(x2)
    if x2.shape[0]:
        _key_block_softmax_kernel[(x2.shape[0],)](x2, y, n_cols, BLOCK=block, num_warps=2)
    return y.view(x.shape)


class _KeyBlockSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, block):
        y = _forward(x, block)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, gy):  # plain torch: the backward need not be invariant
        (y,) = ctx.saved_tensors
        yf, gf = y.float(), gy.float()
        return (yf * (gf - (gf * yf).sum(-1, keepdim=True))).to(y.dtype), None


def key_block_softmax(x: torch.Tensor, block: int) -> torch.Tensor:
    """x [..., L] with L a multiple of `block`; every row has at least one finite entry. Differentiable."""
    if torch.is_grad_enabled() and x.requires_grad:
        return _KeyBlockSoftmax.apply(x, block)
    return _forward(x, block)
