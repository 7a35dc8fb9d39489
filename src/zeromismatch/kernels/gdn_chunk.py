"""Chunked gated-delta-rule forward on CUDA, batch-invariant: the same function as
ops.gdn.reference.chunk_fwd (chunk 64, fp32), with every step that could depend on the batch made fixed:

- all matmuls through kernels.bmm (fixed tile config per matrix shape, FMA in fp32, sequential K order);
- the within-chunk cumsum of g as a matmul with a triangular ones matrix (sequential sum);
- (I + A)^-1 by forward substitution in one Triton program per chunk (torch.linalg.solve_triangular on CUDA
  switches between a cuBLAS loop and batched trsm by batch count).

Row t of a chunk still reads only rows <= t (masked entries are exact zeros), so a zero-padded partial chunk
gives the same row t as the full chunk: the chunk-aligned decoding of `bi_chunk` stays exact on the GPU.
Differentiable (backward in plain torch).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .bmm import bmm


@triton.jit
def _tri_inv_kernel(a_ptr, t_ptr, C: tl.constexpr):
    """T = (I + A)^-1 for A strictly lower triangular (entries on/above the diagonal are ignored)."""
    bid = tl.program_id(0).to(tl.int64)
    rows = tl.arange(0, C)
    cols = tl.arange(0, C)
    base = bid * C * C
    eye = (rows[:, None] == cols[None, :]).to(tl.float32)
    t = eye
    for i in range(1, C):
        a_i = tl.load(a_ptr + base + i * C + rows, mask=rows < i, other=0.0)  # A[i, j], j along axis 0
        new = -tl.sum(a_i[:, None] * t, axis=0)  # - sum_{j<i} A[i, j] T[j, :]
        new = tl.where(cols == i, 1.0, new)
        t = tl.where(rows[:, None] == i, new[None, :], t)
    tl.store(t_ptr + base + rows[:, None] * C + cols[None, :], t)


def tri_inv_raw(a: torch.Tensor) -> torch.Tensor:
    c = a.shape[-1]
    a3 = a.reshape(-1, c, c).contiguous().float()
    out = torch.empty_like(a3)
    if a3.shape[0]:
        _tri_inv_kernel[(a3.shape[0],)](a3, out, C=c, num_warps=4)
    return out.reshape(a.shape)


class _TriInv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        t = tri_inv_raw(a)
        ctx.save_for_backward(t)
        return t

    @staticmethod
    def backward(ctx, gt):
        (t,) = ctx.saved_tensors
        c = t.shape[-1]
        strict = torch.ones(c, c, dtype=torch.bool, device=t.device).tril(-1)
        ga = -(t.transpose(-1, -2) @ gt @ t.transpose(-1, -2))
        return ga.masked_fill(~strict, 0.0)


def tri_inv(a: torch.Tensor) -> torch.Tensor:
    if torch.is_grad_enabled() and a.requires_grad:
        return _TriInv.apply(a)
    return tri_inv_raw(a)


def chunk_fwd(q, k, v, g, beta, state, chunk: int = 64):
    """Same contract as ops.gdn.reference.chunk_fwd: q, k [B, HV, T, K]; v [B, HV, T, V]; g, beta [B, HV, T]
    (T a multiple of the chunk); state [B, HV, K, V] fp32. Returns (o [B, HV, T, V], states
    [B, HV, n_chunks + 1, K, V])."""
    b, h, t, dk = q.shape
    dv = v.shape[-1]
    assert t % chunk == 0, f"chunk_fwd needs T % {chunk} == 0, got {t}"
    n = t // chunk
    q, k = q.reshape(b, h, n, chunk, dk), k.reshape(b, h, n, chunk, dk)
    v = v.reshape(b, h, n, chunk, dv)
    g, beta = g.reshape(b, h, n, chunk), beta.reshape(b, h, n, chunk)

    ones = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device)
    strict = ones.tril(-1)
    causal = ones.tril(0)
    upper_ones = causal.t().to(torch.float32)  # U[i, t] = 1 for i <= t
    G = bmm(g.unsqueeze(-2), upper_ones).squeeze(-2)  # cumsum over the chunk, sequential
    diff = G[..., :, None] - G[..., None, :]
    decay_causal = torch.exp(diff.masked_fill(~causal, float("-inf")))

    kt = k.transpose(-1, -2)
    kb = k * beta[..., None]
    A = bmm(kb, kt) * decay_causal
    A = A.masked_fill(~strict, 0.0)
    T = tri_inv(A)
    u0 = bmm(T, v * beta[..., None])
    w = bmm(T, kb * torch.exp(G)[..., None])
    qk = bmm(q, kt) * decay_causal
    q_dec = q * torch.exp(G)[..., None]
    k_dec_t = (k * torch.exp(G[..., -1:] - G)[..., None]).transpose(-1, -2)
    g_last = torch.exp(G[..., -1])[..., None, None]

    outs, states = [], [state]
    for c in range(n):
        u = u0[:, :, c] - bmm(w[:, :, c], state)
        outs.append(bmm(q_dec[:, :, c], state) + bmm(qk[:, :, c], u))
        state = state * g_last[:, :, c] + bmm(k_dec_t[:, :, c], u)
        states.append(state)
    return torch.stack(outs, dim=2).reshape(b, h, t, dv), torch.stack(states, dim=2)
