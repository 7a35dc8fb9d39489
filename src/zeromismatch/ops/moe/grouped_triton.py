"""Routed experts on CUDA: Triton grouped GEMMs over a device-built tile table, batch-invariant.

Forward, three launches (plus the device-side routing, routing.py):
1. gate_up: for every tile (expert e, BM grouped rows) x BN columns, gate and up accumulated over H in fp32
   (gathering the tokens' rows by index), each rounded to x's dtype, then silu(gate) * up -> h [R, I];
2. down: h @ down[e]^T, rounded, times the pair's routing weight, rounded, stored at the pair's row -> [N k, H];
3. combine: each token's k rows added in fp32 from 0 in ascending expert order (no atomics).
Why a row's bits cannot depend on the batch: as in ops/linear/triton.py, every output element is one dot
product over K in BK pieces, in order, into an fp32 accumulator; rows of a tile never interact, there is no
split-K, and the tile config comes from (H, I, dtype) only, never from the token count or the routing. Which
tile (and tile row) a pair lands in does depend on the batch, so the same argument as the adaptive GEMM policy
applies: the bits must not depend on a row's position in the MMA tile (one wgmma chain per row, measured for
the linear kernels; tests/gpu/test_gpu_moe.py checks it for these).

Backward (an autograd Function): dh = dY @ down[e] and dX = d(gate|up) @ gate_up[e] by the same kernel with
transposed weight strides; dW per expert in one launch (a loop over the expert's rows; deterministic, need not
be invariant); the routing weights' gradient is <dY_t, h @ down[e]^T> = <dY_t @ down[e], h>, from the dh GEMM.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..triton_math import silu
from . import routing

# (BM, BN, BK, warps, stages) by dtype: shapes-only configs (untuned first picks; tests/gpu and benchmarks/moe.py)
CFG = {torch.bfloat16: (64, 128, 64, 4, 3), torch.float16: (64, 128, 64, 4, 3), torch.float32: (32, 32, 32, 4, 2)}
WGRAD_CFG = {torch.bfloat16: (64, 64, 64, 4, 3), torch.float16: (64, 64, 64, 4, 3), torch.float32: (32, 32, 32, 4, 2)}
EPI_STORE, EPI_SWIGLU, EPI_SCALE = 0, 1, 2


@triton.jit
def _dot(a, b, acc, IEEE: tl.constexpr):
    if IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _grouped_kernel(a_ptr, a_rows_ptr, w_ptr, out_ptr, out_rows_ptr, scale_ptr, gu_ptr,
                    tile_e_ptr, tile_start_ptr, offsets_ptr,
                    N, K, stride_am, stride_we, stride_wn, stride_wk, stride_om, stride_gum,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GATHER_A: tl.constexpr,
                    SCATTER_OUT: tl.constexpr, EPI: tl.constexpr, STORE_GU: tl.constexpr, IEEE: tl.constexpr):
    """out[rows] = epilogue(A[rows] @ W[e]^T) for tile (e, rows); W[e] element (n, k) at
    w_ptr + e stride_we + n stride_wn + k stride_wk (any layout: the backward passes transposed strides).
    EPI_SWIGLU: columns n and N + n of W[e] are gate and up, out = silu(gate) * up (N = I)."""
    tile = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(tile_e_ptr + tile)
    if e < 0:
        return
    start = tl.load(tile_start_ptr + tile)
    end = tl.load(offsets_ptr + e + 1)
    offs_m = start + tl.arange(0, BM)
    mmask = offs_m < end
    offs_n = pid_n * BN + tl.arange(0, BN)
    nmask = offs_n < N
    offs_k = tl.arange(0, BK)
    if GATHER_A:
        a_rows = tl.load(a_rows_ptr + offs_m, mask=mmask, other=0)
    else:
        a_rows = offs_m
    a_ptrs = a_ptr + a_rows.to(tl.int64)[:, None] * stride_am + offs_k[None, :]
    w_base = w_ptr + e.to(tl.int64) * stride_we
    w_ptrs = w_base + offs_n.to(tl.int64)[None, :] * stride_wn + offs_k.to(tl.int64)[:, None] * stride_wk
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    acc2 = tl.zeros((BM, BN), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BK)):
        kmask = offs_k < K - kt * BK
        a = tl.load(a_ptrs, mask=mmask[:, None] & kmask[None, :], other=0.0)
        b = tl.load(w_ptrs, mask=kmask[:, None] & nmask[None, :], other=0.0)
        acc = _dot(a, b, acc, IEEE)
        if EPI == 1:
            b2 = tl.load(w_ptrs + N * stride_wn, mask=kmask[:, None] & nmask[None, :], other=0.0)
            acc2 = _dot(a, b2, acc2, IEEE)
        a_ptrs += BK
        w_ptrs += BK * stride_wk
    dt = out_ptr.dtype.element_ty
    omask = mmask[:, None] & nmask[None, :]
    if EPI == 1:
        g = acc.to(dt)
        u = acc2.to(dt)
        if STORE_GU:
            gu_ptrs = gu_ptr + offs_m.to(tl.int64)[:, None] * stride_gum + offs_n[None, :]
            tl.store(gu_ptrs, g, mask=omask)
            tl.store(gu_ptrs + N, u, mask=omask)
        gf = g.to(tl.float32)
        y = silu(gf) * u.to(tl.float32)
    elif EPI == 2:
        s = tl.load(scale_ptr + offs_m, mask=mmask, other=0.0).to(tl.float32)
        y = acc.to(dt).to(tl.float32) * s[:, None]
    else:
        y = acc
    if SCATTER_OUT:
        o_rows = tl.load(out_rows_ptr + offs_m, mask=mmask, other=0)
    else:
        o_rows = offs_m
    tl.store(out_ptr + o_rows.to(tl.int64)[:, None] * stride_om + offs_n[None, :], y.to(dt), mask=omask)


@triton.jit
def _wgrad_kernel(a_ptr, a_rows_ptr, a_scale_ptr, b_ptr, b_rows_ptr, out_ptr, offsets_ptr,
                  P, Q, stride_a, stride_b, stride_oe,
                  BP: tl.constexpr, BQ: tl.constexpr, BR: tl.constexpr, GATHER_A: tl.constexpr,
                  GATHER_B: tl.constexpr, SCALE_A: tl.constexpr, IEEE: tl.constexpr):
    """out[e] [P, Q] = sum over expert e's grouped rows r of A[ra]^T B[rb] (A row scaled by a_scale[r] and
    rounded when SCALE_A), in row order, fp32 accumulation."""
    e = tl.program_id(0)
    pid = tl.program_id(1)
    num_q = tl.cdiv(Q, BQ)
    offs_p = (pid // num_q) * BP + tl.arange(0, BP)
    offs_q = (pid % num_q) * BQ + tl.arange(0, BQ)
    pmask = offs_p < P
    qmask = offs_q < Q
    start = tl.load(offsets_ptr + e)
    end = tl.load(offsets_ptr + e + 1)
    acc = tl.zeros((BP, BQ), dtype=tl.float32)
    for r0 in range(start, end, BR):
        offs_r = r0 + tl.arange(0, BR)
        rmask = offs_r < end
        if GATHER_A:
            ra = tl.load(a_rows_ptr + offs_r, mask=rmask, other=0)
        else:
            ra = offs_r
        if GATHER_B:
            rb = tl.load(b_rows_ptr + offs_r, mask=rmask, other=0)
        else:
            rb = offs_r
        a = tl.load(a_ptr + ra.to(tl.int64)[:, None] * stride_a + offs_p[None, :],
                    mask=rmask[:, None] & pmask[None, :], other=0.0)
        if SCALE_A:
            s = tl.load(a_scale_ptr + offs_r, mask=rmask, other=0.0).to(tl.float32)
            a = (a.to(tl.float32) * s[:, None]).to(a_ptr.dtype.element_ty)
        b = tl.load(b_ptr + rb.to(tl.int64)[:, None] * stride_b + offs_q[None, :],
                    mask=rmask[:, None] & qmask[None, :], other=0.0)
        acc = _dot(tl.trans(a), b, acc, IEEE)
    out = out_ptr + e.to(tl.int64) * stride_oe + offs_p.to(tl.int64)[:, None] * Q + offs_q[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=pmask[:, None] & qmask[None, :])


@triton.jit
def _combine_kernel(y_ptr, out_ptr, H, KSLOTS: tl.constexpr, BH: tl.constexpr):
    """out[t] = sum_j y[t k + j] in fp32 from 0, j ascending (= ascending expert id), rounded once."""
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BH + tl.arange(0, BH)
    mask = offs < H
    acc = tl.zeros((BH,), dtype=tl.float32)
    for j in tl.static_range(KSLOTS):
        acc += tl.load(y_ptr + (t * KSLOTS + j) * H + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * H + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _grouped(a, a_rows, w, w_strides, n, k, out, tiles, offsets, epi, out_rows=None, scale=None, gu=None):
    bm, bn, bk, warps, stages = CFG[a.dtype]
    tile_e, tile_start = tiles
    grid = (tile_e.numel(), triton.cdiv(n, bn))
    if grid[0] == 0:
        return out
    _grouped_kernel[grid](
        a, a if a_rows is None else a_rows, w, out, out if out_rows is None else out_rows,
        out if scale is None else scale, out if gu is None else gu, tile_e, tile_start, offsets,
        n, k, a.stride(0), *w_strides, out.stride(0), 0 if gu is None else gu.stride(0),
        BM=bm, BN=bn, BK=bk, GATHER_A=a_rows is not None, SCATTER_OUT=out_rows is not None, EPI=epi,
        STORE_GU=gu is not None, IEEE=a.dtype == torch.float32, num_warps=warps, num_stages=stages)
    return out


def _wgrad(a, a_rows, a_scale, b, b_rows, offsets, shape, dtype):
    """[E, P, Q]: per expert, sum over its grouped rows of A[ra]^T B[rb]."""
    e, p, q = shape
    bp, bq, br, warps, stages = WGRAD_CFG[a.dtype]
    out = torch.empty(shape, device=a.device, dtype=dtype)
    _wgrad_kernel[(e, triton.cdiv(p, bp) * triton.cdiv(q, bq))](
        a, a if a_rows is None else a_rows, a if a_scale is None else a_scale, b, b if b_rows is None else b_rows,
        out, offsets, p, q, a.stride(0), b.stride(0), out.stride(0),
        BP=bp, BQ=bq, BR=br, GATHER_A=a_rows is not None, GATHER_B=b_rows is not None,
        SCALE_A=a_scale is not None, IEEE=a.dtype == torch.float32, num_warps=warps, num_stages=stages)
    return out


def combine(y_pairs: torch.Tensor, n: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    h = y_pairs.shape[1]
    out = torch.empty(n, h, device=y_pairs.device, dtype=dtype)
    if n:
        _combine_kernel[(n, triton.cdiv(h, 512))](y_pairs, out, h, KSLOTS=k, BH=512)
    return out


class _Experts(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, gate_up, down, token, pair, offsets, tiles, k, save):
        n, hid = x.shape
        inter, rows = down.shape[2], token.shape[0]
        h = torch.empty(rows, inter, device=x.device, dtype=x.dtype)
        gu = torch.empty(rows, 2 * inter, device=x.device, dtype=x.dtype) if save else None
        _grouped(x, token, gate_up, gate_up.stride(), inter, hid, h, tiles, offsets, EPI_SWIGLU, gu=gu)
        y = torch.empty(rows, hid, device=x.device, dtype=x.dtype)
        _grouped(h, None, down, down.stride(), hid, inter, y, tiles, offsets, EPI_SCALE, out_rows=pair, scale=w)
        if save:
            ctx.save_for_backward(x, w, gate_up, down, token, pair, offsets, *tiles, h, gu)
            ctx.k = k
        return combine(y, n, k, x.dtype)

    @staticmethod
    def backward(ctx, dout):
        x, w, gate_up, down, token, pair, offsets, tile_e, tile_start, h, gu = ctx.saved_tensors
        tiles, dout = (tile_e, tile_start), dout.contiguous().to(x.dtype)
        (n, hid), (e_count, _, inter), rows = x.shape, down.shape, token.shape[0]
        # g = dY_t @ down[e] (down read transposed: element (i, h) at stride (1, I))
        g = torch.empty(rows, inter, device=x.device, dtype=torch.float32)
        _grouped(dout, token, down, (down.stride(0), down.stride(2), down.stride(1)), inter, hid, g, tiles, offsets,
                 EPI_STORE)
        dw = (g * h.float()).sum(-1).to(w.dtype)
        dh = g * w.float()[:, None]
        gate, up = gu[:, :inter].float(), gu[:, inter:].float()
        sig = torch.sigmoid(gate)
        dgu = torch.cat([dh * up * sig * (1 + gate * (1 - sig)), dh * gate * sig], 1).to(x.dtype)
        dx = None
        if ctx.needs_input_grad[0]:
            dx_pairs = torch.empty(rows, hid, device=x.device, dtype=x.dtype)
            _grouped(dgu, None, gate_up, (gate_up.stride(0), gate_up.stride(2), gate_up.stride(1)), hid, 2 * inter,
                     dx_pairs, tiles, offsets, EPI_STORE, out_rows=pair)
            dx = combine(dx_pairs, n, ctx.k, x.dtype)
        dgate_up = ddown = None
        if ctx.needs_input_grad[2]:
            dgate_up = _wgrad(dgu, None, None, x, token, offsets, (e_count, 2 * inter, hid), gate_up.dtype)
        if ctx.needs_input_grad[3]:
            ddown = _wgrad(dout, token, w, h, None, offsets, (e_count, hid, inter), down.dtype)
        return dx, dw, dgate_up, ddown, None, None, None, None, None, None


def experts(x, top_w, top_i, gate_up, down):
    """x [N, H], top_w / top_i [N, k], gate_up [E, 2I, H], down [E, H, I] (x's dtype) -> [N, H], batch-invariant."""
    assert x.dtype == gate_up.dtype == down.dtype, (x.dtype, gate_up.dtype, down.dtype)
    x = x.contiguous()
    r = routing.route(top_w, top_i, gate_up.shape[0])
    w = r.top_w.reshape(-1)[r.pair].contiguous()
    tiles = routing.tiles(r, CFG[x.dtype][0])
    save = torch.is_grad_enabled() and any(t.requires_grad for t in (x, w, gate_up, down))
    return _Experts.apply(x, w, gate_up, down, r.token, r.pair, r.offsets, tiles, r.k, save)
