"""The chunked form's scan over chunks on CUDA, with its own backward: what the trainer differentiates on the GPU
(stock's forward and backward, and the backward of bi and bi_chunk, whose forwards are their invariant kernels).

naive.chunk_fwd is a chunk-parallel part (`chunk_prep`: the triangular solves, w, u0, the decayed q and k, batched
torch ops over all chunks) and a sequential part (`chunk_scan`): per chunk c, from the state S entering it,

    u = u0 - w S,    o = qd S + qk u,    S' = gl S + kd^T u.

As a torch loop that part is ~7 small kernels per chunk (per layer and sequence, ~3x more under autograd): at
4096 tokens, launch overhead rather than arithmetic. Here one kernel runs all chunks forward with the state in
registers, and one runs them backward with the state's gradient in registers, reading the forward's states:

    du = qk^T dO + kd dS',    dqd = dO S^T,    dqk = dO u^T,    dkd = u dS'^T,    dgl = sum(S * dS'),
    du0 = du,                 dw = -du S^T,    dS = gl dS' + qd^T dO - w^T du     (dS' the gradient of S').

No invariance is needed here, so the dots run on tensor cores in tf32 (`PRECISION`), as FLA's chunk kernels run
theirs in bf16; "ieee" gives fp32 products (tests). The terms that sum over the value dimension (dqd, dqk, dkd,
dw, dgl) are written per value block and added by torch in a fixed order: gradients are deterministic.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .chunk_triton import padded_k

PRECISION = "tf32"
BV = {"fwd": 64, "bwd": 32}  # value block per program
NUM_WARPS = {"fwd": 4, "bwd": 4}
NUM_STAGES = 1  # no software pipelining of the chunk loop: at K = 128 three stages need 425 KB of shared memory


@triton.jit(do_not_specialize=["N"])
def _scan_fwd_kernel(u0_ptr, w_ptr, qk_ptr, qd_ptr, kd_ptr, gl_ptr, s0_ptr, o_ptr, st_ptr, N,
                     K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    vb = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    rows = tl.arange(0, C)
    kk = tl.arange(0, K)
    vv = vb * BV + tl.arange(0, BV)
    s = tl.load(s0_ptr + (bh * K + kk)[:, None] * V + vv[None, :])
    tl.store(st_ptr + (bh * (N + 1) * K + kk)[:, None] * V + vv[None, :], s)
    for c in range(0, N):
        crow = (bh * N + c) * C + rows
        w = tl.load(w_ptr + crow[:, None] * K + kk[None, :])
        u = tl.load(u0_ptr + crow[:, None] * V + vv[None, :]) - tl.dot(w, s, input_precision=PREC)
        qd = tl.load(qd_ptr + crow[:, None] * K + kk[None, :])
        qk = tl.load(qk_ptr + crow[:, None] * C + rows[None, :])
        o = tl.dot(qk, u, tl.dot(qd, s, input_precision=PREC), input_precision=PREC)
        tl.store(o_ptr + crow[:, None] * V + vv[None, :], o)
        kd = tl.load(kd_ptr + crow[:, None] * K + kk[None, :])
        s = tl.dot(tl.trans(kd), u, s * tl.load(gl_ptr + bh * N + c), input_precision=PREC)
        tl.store(st_ptr + ((bh * (N + 1) + c + 1) * K + kk)[:, None] * V + vv[None, :], s)


@triton.jit(do_not_specialize=["N", "BH"])
def _scan_bwd_kernel(u0_ptr, w_ptr, qk_ptr, qd_ptr, kd_ptr, gl_ptr, st_ptr, do_ptr, dst_ptr,
                     du0_ptr, dw_ptr, dqk_ptr, dqd_ptr, dkd_ptr, dgl_ptr, ds0_ptr, N, BH,
                     K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                     HAS_DO: tl.constexpr, HAS_DST: tl.constexpr):
    vb = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    rows = tl.arange(0, C)
    kk = tl.arange(0, K)
    vv = vb * BV + tl.arange(0, BV)
    kv = kk[:, None] * V + vv[None, :]
    if HAS_DST:
        ds = tl.load(dst_ptr + (bh * (N + 1) + N) * K * V + kv)
    else:
        ds = tl.zeros([K, BV], dtype=tl.float32)
    for i in range(0, N):
        c = N - 1 - i
        crow = (bh * N + c) * C + rows
        part = (vb * BH + bh) * N + c  # this value block's partial sums for chunk c
        prow = part * C + rows
        s = tl.load(st_ptr + (bh * (N + 1) + c) * K * V + kv)
        w = tl.load(w_ptr + crow[:, None] * K + kk[None, :])
        u = tl.load(u0_ptr + crow[:, None] * V + vv[None, :]) - tl.dot(w, s, input_precision=PREC)
        kd = tl.load(kd_ptr + crow[:, None] * K + kk[None, :])
        du = tl.dot(kd, ds, input_precision=PREC)  # [C, BV]
        if HAS_DO:
            do = tl.load(do_ptr + crow[:, None] * V + vv[None, :])
            qk = tl.load(qk_ptr + crow[:, None] * C + rows[None, :])
            du = tl.dot(tl.trans(qk), do, du, input_precision=PREC)
            tl.store(dqd_ptr + prow[:, None] * K + kk[None, :], tl.dot(do, tl.trans(s), input_precision=PREC))
            tl.store(dqk_ptr + prow[:, None] * C + rows[None, :], tl.dot(do, tl.trans(u), input_precision=PREC))
        tl.store(dkd_ptr + prow[:, None] * K + kk[None, :], tl.dot(u, tl.trans(ds), input_precision=PREC))
        tl.store(dgl_ptr + part, tl.sum(tl.sum(s * ds, axis=1), axis=0))
        tl.store(du0_ptr + crow[:, None] * V + vv[None, :], du)
        tl.store(dw_ptr + prow[:, None] * K + kk[None, :], -tl.dot(du, tl.trans(s), input_precision=PREC))
        # dS = gl dS' + qd^T dO - w^T du (+ the gradient reaching this boundary state directly)
        ds = ds * tl.load(gl_ptr + bh * N + c) - tl.dot(tl.trans(w), du, input_precision=PREC)
        if HAS_DO:
            qd = tl.load(qd_ptr + crow[:, None] * K + kk[None, :])
            ds = tl.dot(tl.trans(qd), do, ds, input_precision=PREC)
        if HAS_DST:
            ds += tl.load(dst_ptr + (bh * (N + 1) + c) * K * V + kv)
    tl.store(ds0_ptr + bh * K * V + kv, ds)


def _block(v: int, widest: int) -> int:
    return next(b for b in (64, 32, 16) if b <= widest and v % b == 0)


class _Scan(torch.autograd.Function):
    """Inputs as naive.chunk_scan, flattened to [BH, ...], K a power of two >= 16 and V a multiple of 16."""

    @staticmethod
    def forward(ctx, u0, w, qk, qd, kd, gl, s0):
        ctx.set_materialize_grads(False)
        bh, n, c, dv = u0.shape
        dk = w.shape[-1]
        o = torch.empty_like(u0)
        states = u0.new_empty(bh, n + 1, dk, dv)
        bv = _block(dv, BV["fwd"])
        _scan_fwd_kernel[(dv // bv, bh)](u0, w, qk, qd, kd, gl, s0, o, states, n, K=dk, V=dv, C=c, BV=bv,
                                         PREC=PRECISION, num_warps=NUM_WARPS["fwd"], num_stages=NUM_STAGES)
        ctx.save_for_backward(u0, w, qk, qd, kd, gl, states)
        return o, states

    @staticmethod
    def backward(ctx, do, dstates):
        u0, w, qk, qd, kd, gl, states = ctx.saved_tensors
        bh, n, c, dv = u0.shape
        dk = w.shape[-1]
        bv = _block(dv, BV["bwd"])
        nv = dv // bv
        du0 = torch.empty_like(u0)
        dw, dqd, dkd = (u0.new_zeros(nv, bh, n, c, dk) for _ in range(3))
        dqk = u0.new_zeros(nv, bh, n, c, c)
        dgl = u0.new_zeros(nv, bh, n)
        ds0 = u0.new_empty(bh, dk, dv)
        has_do, has_dst = do is not None, dstates is not None
        do = do.contiguous() if has_do else u0
        dstates = dstates.contiguous() if has_dst else states
        _scan_bwd_kernel[(nv, bh)](u0, w, qk, qd, kd, gl, states, do, dstates, du0, dw, dqk, dqd, dkd, dgl, ds0,
                                   n, bh, K=dk, V=dv, C=c, BV=bv, PREC=PRECISION, HAS_DO=has_do, HAS_DST=has_dst,
                                   num_warps=NUM_WARPS["bwd"], num_stages=NUM_STAGES)
        return du0, dw.sum(0), dqk.sum(0), dqd.sum(0), dkd.sum(0), dgl.sum(0), ds0


def chunk_scan_triton(u0, w, qk, qd, kd, gl, state):
    """naive.chunk_scan's contract (leading dims [B, HV, n]), differentiable: returns (o [B, HV, n * C, V],
    states [B, HV, n + 1, K, V]). Any K and V: zero-padded to the kernels' extents (padded keys and values add
    exact zeros; autograd cuts the gradients back)."""
    b, h, n, c, dk = w.shape
    dv = u0.shape[-1]
    kp = padded_k(dk)
    vp = dv + (-dv) % 16
    if kp != dk:
        w, qd, kd = (F.pad(x, (0, kp - dk)) for x in (w, qd, kd))
        state = F.pad(state, (0, 0, 0, kp - dk))
    if vp != dv:
        u0, state = F.pad(u0, (0, vp - dv)), F.pad(state, (0, vp - dv))
    flat = [x.float().contiguous().reshape(b * h, *x.shape[2:]) for x in (u0, w, qk, qd, kd, gl, state)]
    o, states = _Scan.apply(*flat)
    o = o.reshape(b, h, n * c, vp)[..., :dv]
    return o, states.reshape(b, h, n + 1, kp, vp)[..., :dk, :dv]


__all__ = ["PRECISION", "chunk_scan_triton"]
