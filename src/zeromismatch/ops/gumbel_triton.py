"""The CUDA form of ops.gumbel: one program per (row, block of BLOCK vocabulary entries) computes the tempered
logits, the hash noise and the block's argmax (first index on ties); torch picks the best block (first on
ties). BLOCK is a module constant and the row count is not specialized: a row's token depends on its own
inputs only. Division is IEEE (div_rn), as torch's, so thresholds computed in torch compare exactly."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096


@triton.jit
def _fmix32(h):
    """uint32 values held in int64, exactly as ops.gumbel._fmix32 (products wrap; their low 32 bits kept)."""
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


@triton.jit(do_not_specialize=["n_cols", "stride"])
def _gumbel_argmax_kernel(x_ptr, temp_ptr, thr_ptr, k1_ptr, k2_ptr, vmax_ptr, imax_ptr, n_cols, stride, n_blocks,
                          BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=inside, other=0.0).to(tl.float32)
    temp = tl.load(temp_ptr + row)
    thr = tl.load(thr_ptr + row)
    k1 = tl.load(k1_ptr + row)  # int64 holding uint32
    k2 = tl.load(k2_ptr + row)
    greedy = temp == 0.0
    denom = tl.zeros_like(x) + (temp + greedy.to(tl.float32))  # 1 for greedy rows (their x is not divided)
    xs = tl.where(greedy, x, tl.div_rn(x, denom))
    h = (cols.to(tl.int64) * 0x9E3779B1 + k1) & 0xFFFFFFFF
    h = _fmix32(_fmix32(h) ^ k2)
    u = ((h >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07
    score = tl.where(greedy, xs, xs - tl.log(-tl.log(u)))
    score = tl.where(inside & (xs >= thr), score, float("-inf"))
    best, idx = tl.max(score, axis=0, return_indices=True, return_indices_tie_break_left=True)
    tl.store(vmax_ptr + row * n_blocks + blk, best)
    tl.store(imax_ptr + row * n_blocks + blk, blk * BLOCK + idx)


def gumbel_argmax(logits, temperature, threshold, k1, k2) -> torch.Tensor:
    """As ops.gumbel.gumbel_argmax_reference: tokens [R] int64."""
    r, v = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    n_blocks = triton.cdiv(v, BLOCK)
    vmax = torch.empty(r, n_blocks, device=logits.device, dtype=torch.float32)
    imax = torch.empty(r, n_blocks, device=logits.device, dtype=torch.int32)
    if r:
        _gumbel_argmax_kernel[(r, n_blocks)](logits, temperature.float().contiguous(), threshold.float().contiguous(),
                                             k1.contiguous(), k2.contiguous(), vmax, imax, v, logits.stride(0),
                                             n_blocks, BLOCK=BLOCK, num_warps=8)
    return imax.gather(1, vmax.argmax(dim=1, keepdim=True)).squeeze(1).long()
