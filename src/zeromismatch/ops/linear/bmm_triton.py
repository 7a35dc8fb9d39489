"""The CUDA batch-invariant batched matmul (the blocked attention's): Triton, one program per
(batch item, output tile), fixed tile config per (M, N, K, dtype) and a fixed K order, batch count not
specialized. cuBLAS batched GEMMs may pick kernels (and split-K) by batch count; this never does.

bf16 -> tensor cores (fp32 accumulate, result rounded to bf16 as torch does); fp32 -> input_precision="ieee"
(FMA, sequential over K). Broadcasting over leading dims as torch.matmul (stride-0 batch items are not copied).
Differentiable: the backward is plain torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..device import configure_cuda


@triton.jit(do_not_specialize=["M", "N", "K", "sab", "sam", "sak", "sbb", "sbk", "sbn", "scb", "scm"])
def _bmm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sab, sam, sak, sbb, sbk, sbn, scb, scm,
                BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr):
    pid = tl.program_id(0)
    bid = tl.program_id(1).to(tl.int64)
    num_n = tl.cdiv(N, BN)
    pid_m = pid // num_n
    pid_n = pid % num_n
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    a_ptrs = a_ptr + bid * sab + offs_m[:, None] * sam + offs_k[None, :] * sak
    b_ptrs = b_ptr + bid * sbb + offs_k[:, None] * sbk + offs_n[None, :] * sbn
    mmask = offs_m[:, None] < M
    nmask = offs_n[None, :] < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BK)):
        krem = K - kt * BK
        a = tl.load(a_ptrs, mask=mmask & (offs_k[None, :] < krem), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < krem) & nmask, other=0.0)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BK * sak
        b_ptrs += BK * sbk
    c_ptrs = c_ptr + bid * scb + offs_m[:, None] * scm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mmask & nmask)


def _cfg(m: int, n: int, k: int, dtype: torch.dtype) -> tuple[int, int, int, int, int]:
    """(BM, BN, BK, warps, stages) from the matrix shape and dtype only (never the batch count)."""
    if dtype == torch.float32:
        bm = 64 if m > 32 else (32 if m > 16 else 16)
        return bm, 64, 16, 4, 2
    return 64, 64 if n >= 64 else (32 if n > 16 else 16), 64, 4, 3


def _as3d(x: torch.Tensor, lead: torch.Size) -> torch.Tensor:
    x = x.expand(*lead, *x.shape[-2:])
    return x.reshape(-1, *x.shape[-2:])


def bmm_raw(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    configure_cuda()
    assert a.dtype == b.dtype and a.dtype in (torch.bfloat16, torch.float16, torch.float32), (a.dtype, b.dtype)
    m, k = a.shape[-2:]
    k2, n = b.shape[-2:]
    assert k == k2, (a.shape, b.shape)
    lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a3, b3 = _as3d(a, lead), _as3d(b, lead)
    nb = a3.shape[0]
    c = torch.empty(nb, m, n, device=a.device, dtype=a.dtype)
    if nb and m and n:
        bm, bn, bk, warps, stages = _cfg(m, n, k, a.dtype)
        grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn), nb)
        _bmm_kernel[grid](a3, b3, c, m, n, k, a3.stride(0), a3.stride(1), a3.stride(2),
                          b3.stride(0), b3.stride(1), b3.stride(2), c.stride(0), c.stride(1),
                          BM=bm, BN=bn, BK=bk, IEEE=a.dtype == torch.float32, num_warps=warps, num_stages=stages)
    return c.reshape(*lead, m, n)


def _reduce_to(g: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Sum a broadcast gradient back to `shape`."""
    while g.dim() > len(shape):
        g = g.sum(0)
    for i, s in enumerate(shape):
        if s == 1 and g.shape[i] != 1:
            g = g.sum(i, keepdim=True)
    return g


class _BMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return bmm_raw(a, b)

    @staticmethod
    def backward(ctx, gc):
        a, b = ctx.saved_tensors
        ga = _reduce_to(gc @ b.transpose(-1, -2), a.shape) if ctx.needs_input_grad[0] else None
        gb = _reduce_to(a.transpose(-1, -2) @ gc, b.shape) if ctx.needs_input_grad[1] else None
        return ga, gb


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.matmul for [..., M, K] @ [..., K, N] (leading dims broadcast), batch-invariant on CUDA."""
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return _BMM.apply(a, b)
    return bmm_raw(a, b)
