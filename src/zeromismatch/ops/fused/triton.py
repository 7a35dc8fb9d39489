"""The model's row-wise and elementwise ops as one CUDA kernel each (naive.py holds the same functions in torch).

Why: composed in torch each of these is 6 to 12 kernels (casts, the reduction, the elementwise steps), and a
decode step is mostly such small kernels once its GEMMs are near the weights' bandwidth. One kernel reads the
input once and writes the output once.

Invariance: a row's (or an element's) arithmetic depends only on its own values and on the row length D: the
launch shape (ROWS, BLOCK_D, warps) is a function of D alone and no row count or stride is specialized, so a
row gives the same bits in a call of 1 row or of 100k, at any position: trainer and generator agree wherever
they call these. The sum of squares is the layout of ops/reduce/triton.py (BLOCK_D-wide pieces accumulated
elementwise, summed once). Rounding follows naive.py step by step (products and sums of activation-dtype
tensors rounded to that dtype); exp, rsqrt and the division are the GPU's, so the values are the torch forms'
to a few ulps, not their bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..triton_math import EXACT, sigmoid, silu


def _layout(d: int) -> tuple[int, int]:
    """(rows a program, block width): from the row length alone (bits depend on it)."""
    block_d = min(triton.next_power_of_2(d), 1024)
    return max(1, 1024 // block_d), block_d


@triton.jit
def _sum_sq(x_ptr, base, rmask, D, cast_ptr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):
    """sum of x^2 per row in fp32, x first rounded to the element type of cast_ptr."""
    cols = tl.arange(0, BLOCK_D)
    acc = tl.zeros((ROWS, BLOCK_D), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        c = d0 + cols
        x = tl.load(x_ptr + base[:, None] + c[None, :], mask=rmask[:, None] & (c[None, :] < D), other=0.0)
        x = x.to(cast_ptr.dtype.element_ty).to(tl.float32)
        acc += x * x
    return tl.sum(acc, axis=1)


@triton.jit(do_not_specialize=["n_rows", "heads", "stride_a", "stride_b"])
def _rms_norm_kernel(x_ptr, w_ptr, o_ptr, n_rows, heads, stride_a, stride_b, D, eps,
                     ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    # row r of x sits at (r // heads) * stride_a + (r % heads) * stride_b: a [N, H, D] view (q, k heads) or [N, D]
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < n_rows
    r64 = rows.to(tl.int64)
    base = (r64 // heads) * stride_a + (r64 % heads) * stride_b
    ss = _sum_sq(x_ptr, base, rmask, D, x_ptr, BLOCK_D, ROWS)
    inv = tl.rsqrt(ss / D + eps)
    cols = tl.arange(0, BLOCK_D)
    for d0 in range(0, D, BLOCK_D):
        c = d0 + cols
        m = rmask[:, None] & (c[None, :] < D)
        x = tl.load(x_ptr + base[:, None] + c[None, :], mask=m, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + c, mask=c < D, other=0.0).to(tl.float32)
        y = (x * inv[:, None]) * (1.0 + w)[None, :]
        tl.store(o_ptr + r64[:, None] * D + c[None, :], y.to(o_ptr.dtype.element_ty), mask=m)


@triton.jit(do_not_specialize=["n_rows", "stride_x", "stride_z"])
def _gated_rms_norm_kernel(x_ptr, z_ptr, w_ptr, o_ptr, n_rows, stride_x, stride_z, D, eps,
                           ROWS: tl.constexpr, BLOCK_D: tl.constexpr, ROUND_WY: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < n_rows
    r64 = rows.to(tl.int64)
    ss = _sum_sq(x_ptr, r64 * stride_x, rmask, D, o_ptr, BLOCK_D, ROWS)
    inv = tl.rsqrt(ss / D + eps)
    cols = tl.arange(0, BLOCK_D)
    out_ty = o_ptr.dtype.element_ty
    for d0 in range(0, D, BLOCK_D):
        c = d0 + cols
        m = rmask[:, None] & (c[None, :] < D)
        x = tl.load(x_ptr + r64[:, None] * stride_x + c[None, :], mask=m, other=0.0).to(out_ty).to(tl.float32)
        z = tl.load(z_ptr + r64[:, None] * stride_z + c[None, :], mask=m, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + c, mask=c < D, other=0.0).to(tl.float32)
        y = (x * inv[:, None]).to(out_ty).to(tl.float32)
        wy = w[None, :] * y
        if ROUND_WY:  # weight * y in the activation dtype (both are), as torch computes it
            wy = wy.to(out_ty).to(tl.float32)
        o = wy * silu(z)
        tl.store(o_ptr + r64[:, None] * D + c[None, :], o.to(out_ty), mask=m)


@triton.jit(do_not_specialize=["n", "stride_a", "stride_b"])
def _gdn_gates_kernel(a_ptr, b_ptr, alog_ptr, dt_ptr, g_ptr, beta_ptr, n, HV, stride_a, stride_b,
                      BLOCK: tl.constexpr):
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = e < n
    tok, head = e // HV, e % HV
    a = tl.load(a_ptr + tok * stride_a + head, mask=m, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + tok * stride_b + head, mask=m, other=0.0).to(tl.float32)
    alog = tl.load(alog_ptr + head, mask=m, other=0.0).to(tl.float32)
    dt = tl.load(dt_ptr + head, mask=m, other=0.0).to(tl.float32)
    x = a + dt
    # softplus with torch's threshold (x > 20: x); log1p(u) as log(1 + u) * u / ((1 + u) - 1), exact to an ulp
    # where 1 + u rounds (Goldberg's form; triton has no log1p in its interpreter)
    u = tl.exp(tl.minimum(x, 20.0))
    w = 1.0 + u
    l1p = tl.where(w == 1.0, u, tl.log(w) * (u / (w - 1.0)))
    sp = tl.where(x > 20.0, x, l1p)
    tl.store(g_ptr + e, -tl.exp(alog) * sp, mask=m)
    tl.store(beta_ptr + e, sigmoid(b), mask=m)


@triton.jit(do_not_specialize=["n_rows", "heads", "stride_a", "stride_b"])
def _rope_kernel(x_ptr, pos_ptr, cos_ptr, sin_ptr, o_ptr, n_rows, heads, stride_a, stride_b, D, HALF,
                 ROWS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < n_rows
    r64 = rows.to(tl.int64)
    tok = r64 // heads
    base = tok * stride_a + (r64 % heads) * stride_b
    pos = tl.load(pos_ptr + tok, mask=rmask, other=0).to(tl.int64)
    ty = o_ptr.dtype.element_ty
    j = tl.arange(0, BLOCK_H)
    m = rmask[:, None] & (j[None, :] < HALF)
    c = tl.load(cos_ptr + pos[:, None] * HALF + j[None, :], mask=m, other=0.0).to(ty).to(tl.float32)
    s = tl.load(sin_ptr + pos[:, None] * HALF + j[None, :], mask=m, other=0.0).to(ty).to(tl.float32)
    x1 = tl.load(x_ptr + base[:, None] + j[None, :], mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + base[:, None] + HALF + j[None, :], mask=m, other=0.0).to(tl.float32)
    o1 = ((x1 * c).to(ty).to(tl.float32) - (x2 * s).to(ty).to(tl.float32)).to(ty)
    o2 = ((x2 * c).to(ty).to(tl.float32) + (x1 * s).to(ty).to(tl.float32)).to(ty)
    out = o_ptr + r64[:, None] * D
    tl.store(out + j[None, :], o1, mask=m)
    tl.store(out + HALF + j[None, :], o2, mask=m)
    cols = tl.arange(0, BLOCK_D)
    for d0 in range(2 * HALF, D, BLOCK_D):  # the dims past the rotary ones pass through
        cc = d0 + cols
        mm = rmask[:, None] & (cc[None, :] < D)
        tl.store(out + cc[None, :], tl.load(x_ptr + base[:, None] + cc[None, :], mask=mm, other=0.0), mask=mm)


@triton.jit(do_not_specialize=["n", "F", "D", "stride_x", "stride_gt", "stride_gh"])
def _gated_kernel(x_ptr, g_ptr, o_ptr, n, F, D, stride_x, stride_gt, stride_gh, SILU: tl.constexpr,
                  BLOCK: tl.constexpr):
    # element e = (token, head, col) of the output [N, F]: x's at token * stride_x + col (a row of a wider
    # projection, read in place), the gate's at token * stride_gt + head * stride_gh + col
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = e < n
    tok, r = e // F, e % F
    g = tl.load(g_ptr + tok * stride_gt + (r // D) * stride_gh + r % D, mask=m, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + tok * stride_x + r, mask=m, other=0.0).to(tl.float32)
    ty = o_ptr.dtype.element_ty
    if SILU:
        a = silu(g)
    else:
        a = sigmoid(g)
    tl.store(o_ptr + e, (a.to(ty).to(tl.float32) * x).to(ty), mask=m)


@triton.jit(do_not_specialize=["n_rows", "H", "T", "s_b", "s_t", "s_h"])
def _l2norm_heads_kernel(x_ptr, o_ptr, n_rows, H, T, s_b, s_t, s_h, K, scale, REP: tl.constexpr,
                         SCALE: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    # row r = (b, t, h) of x [B, T, H, K]; written to rows (b, h * REP + j, t) of o [B, H * REP, T, K] fp32
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < n_rows
    r64 = rows.to(tl.int64)
    h, bt = r64 % H, r64 // H
    t, b = bt % T, bt // T
    base = b * s_b + t * s_t + h * s_h
    inv = tl.rsqrt(_sum_sq(x_ptr, base, rmask, K, o_ptr, BLOCK_D, ROWS) + 1e-6)
    cols = tl.arange(0, BLOCK_D)
    for d0 in range(0, K, BLOCK_D):
        c = d0 + cols
        m = rmask[:, None] & (c[None, :] < K)
        y = tl.load(x_ptr + base[:, None] + c[None, :], mask=m, other=0.0).to(tl.float32) * inv[:, None]
        if SCALE:
            y = y * scale
        for j in tl.static_range(REP):
            dst = ((b * H + h) * REP + j) * T + t
            tl.store(o_ptr + dst[:, None] * K + c[None, :], y, mask=m)


def _rows(x: torch.Tensor) -> tuple[torch.Tensor, int, int, int]:
    """x [..., D] or a [N, H, D] view (q / k heads of a projection), last dim dense -> (x, heads, stride_a,
    stride_b): the kernels' row addressing, so a strided head view is read in place."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    if x.dim() == 3:
        return x, x.shape[1], x.stride(0), x.stride(1)
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return x2, 1, x2.stride(0), 0


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    d = x.shape[-1]
    xr, heads, sa, sb = _rows(x)
    out = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    n = out.numel() // d if d else 0
    if n:
        rows, block_d = _layout(d)
        _rms_norm_kernel[(triton.cdiv(n, rows),)](xr, weight, out, n, heads, sa, sb, d, eps,
                                                  ROWS=rows, BLOCK_D=block_d, num_warps=4, **EXACT)
    return out


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    d = x.shape[-1]
    x2, z2 = x.reshape(-1, d), z.reshape(-1, d)
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    z2 = z2 if z2.stride(-1) == 1 else z2.contiguous()
    out = torch.empty(z2.shape, device=z.device, dtype=z.dtype)
    n = x2.shape[0]
    if n:
        rows, block_d = _layout(d)
        round_wy = torch.promote_types(weight.dtype, z.dtype) == z.dtype and z.dtype != torch.float32
        _gated_rms_norm_kernel[(triton.cdiv(n, rows),)](x2, z2, weight, out, n, x2.stride(0), z2.stride(0), d, eps,
                                                        ROWS=rows, BLOCK_D=block_d, ROUND_WY=round_wy, num_warps=4,
                                                        **EXACT)
    return out.reshape(z.shape)


def gdn_gates(a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor):
    n_tok, hv = a.shape
    a = a if a.stride(-1) == 1 else a.contiguous()
    b = b if b.stride(-1) == 1 else b.contiguous()
    g = torch.empty(n_tok, hv, device=a.device, dtype=torch.float32)
    beta = torch.empty_like(g)
    n = g.numel()
    if n:
        block = 1024
        _gdn_gates_kernel[(triton.cdiv(n, block),)](a, b, a_log, dt_bias, g, beta, n, hv, a.stride(0), b.stride(0),
                                                    BLOCK=block, num_warps=4, **EXACT)
    return g, beta


def rope(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    n_tok, h, d = x.shape
    half = cos.shape[-1]
    xr, heads, sa, sb = _rows(x)
    out = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    n = n_tok * h
    if n:
        block_h = triton.next_power_of_2(half)
        rows = max(1, 512 // block_h)
        _rope_kernel[(triton.cdiv(n, rows),)](xr, positions, cos, sin, out, n, heads, sa, sb, d, half,
                                              ROWS=rows, BLOCK_H=block_h, BLOCK_D=64, num_warps=4, **EXACT)
    return out


def gated(x: torch.Tensor, gate: torch.Tensor, act: str) -> torch.Tensor:
    if act not in ("silu", "sigmoid"):
        raise ValueError(f"fused.gated: act={act!r}; the kernel has 'silu' and 'sigmoid'")
    f = x.shape[-1]
    x2 = x.reshape(-1, f)  # a view for [N, F] row slices of a wider projection (MLP's up half) and dense x
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    if gate.dim() == 3 and gate.stride(-1) == 1:
        d, sgt, sgh = gate.shape[-1], gate.stride(0), gate.stride(1)
    elif gate.shape == x2.shape and gate.stride(-1) == 1:  # rows of f elements, read in place (MLP's gate half)
        d, sgt, sgh = f, gate.stride(0), 0
    else:
        gate = gate.reshape(x2.shape).contiguous()
        d, sgt, sgh = f, f, 0
    out = torch.empty(x2.shape, device=x.device, dtype=x.dtype)
    n = out.numel()
    if n:
        block = 1024
        _gated_kernel[(triton.cdiv(n, block),)](x2, gate, out, n, f, d, x2.stride(0), sgt, sgh, SILU=act == "silu",
                                                 BLOCK=block, num_warps=4, **EXACT)
    return out.reshape(x.shape)


def qk_l2norm(q: torch.Tensor, k: torch.Tensor, num_v_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    outs = []
    for x, scaled in ((q, True), (k, False)):
        if x.stride(-1) != 1:
            x = x.contiguous()
        b, t, h, d = x.shape
        rep = num_v_heads // h
        out = torch.empty(b, h * rep, t, d, device=x.device, dtype=torch.float32)
        n = b * t * h
        if n:
            rows, block_d = _layout(d)
            _l2norm_heads_kernel[(triton.cdiv(n, rows),)](x, out, n, h, t, x.stride(0), x.stride(1), x.stride(2), d,
                                                          d ** -0.5, REP=rep, SCALE=scaled, ROWS=rows,
                                                          BLOCK_D=block_d, num_warps=4, **EXACT)
        outs.append(out)
    return outs[0], outs[1]
