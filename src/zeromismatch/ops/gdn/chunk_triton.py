"""Chunked gated-delta-rule forward on CUDA (`bi_chunk`'s trainer and prefill), and `bi_chunk`'s
chunk-consistent decode step.

Same function as naive.chunk_fwd (chunk C = 64, fp32): per chunk, G = cumsum(g),
A = strict(exp(G_t - G_j) (beta_t k_t).k_j), T = (I + A)^-1, w = T (beta exp(G) k), u0 = T (beta v),
u = u0 - w S, o = exp(G) q S + (causal exp(G_t - G_j) q_t.k_j) u, S' = exp(G_C) S + (exp(G_C - G) k)^T u.

Why our own arithmetic, and why the decode step can equal it bit for bit. Every sum is a `tl.dot` whose result
for an output row does not depend on the tile it sits in, and the decode step computes the trainer's row t as row
0 of a 16-row tile (row t's operand in row 0, zeros elsewhere) with the same contraction over the same operands.
Two arithmetics (`dots`, conf/numerics `chunk_dots`), trainer and generator alike:
- "tf32" (default): tensor-core products (tf32 inputs, fp32 accumulation), as FLA's chunk kernels use them
  (they round k and T to bf16; we keep fp32 operands). Row- and tile-independence is a measured property of
  the H200's matrix units: the same bits for a row whatever the tile height (16 / 64 / 128: mma.sync or
  wgmma), width, K split and warp count, and whatever the other rows hold (tests/gpu checks decode == chunked
  rows and every launch setting on each run). The prefix sums G stay fp32 FMA chains ("ieee" below):
  a tf32-rounded log decay would be off by ~1e-3 of its value, which exp() turns into a relative error.
- "ieee": input_precision="ieee", which Triton lowers to one sequential FMA chain per output element over the
  contraction index (0, 1, ..., K-1), whatever the tile: equal rows by construction, at fp32 CUDA-core speed
  (~100x slower products).
Entries past row t are multiplied by exact zeros (strict / causal masks, T's upper triangle): a zero product
changes no sum. Everything else is elementwise (identical source in both kernels; fp fusion off, so no
compiler-chosen multiply-add contraction) or an exact extraction (a masked sum with one non-zero term). Prefix
sums use the dot too (a lower-triangular ones matrix), and (I + A)^-1 is forward substitution, one row at a
time, each row one dot: exactly the decode step's work (or, WHOLE_TILE_SUBSTITUTION, row i of the whole-tile
product A @ T at step i, whose row i is that dot's).

Kernels:
- `_prep_kernel`: one program per (chunk, sequence-head); no state dependency, so all chunks in parallel.
- `_scan_kernel`: one program per (value block, sequence-head), sequential over the chunks, state in registers.
- the decode step: one token for a batch of sequences, one program per (sequence, head) (the "dot" kernel:
  DECODE_VSPLIT programs, each its share of the value blocks), state and the open chunk's rows read and
  written in place in the generator's cache slots. It reads the fp32 state once and
  writes it only when the chunk closes (every 64 tokens); the open chunk's rows (k, v, g, beta, T, u) are
  cached so no earlier row is recomputed. Two kernels: `_decode_kernel` ("dot": the trainer's construct, its
  operand in row 0 of 16-row tiles, either arithmetic) and `_decode_chain_kernel` ("chain", "ieee" only and its
  default there: each chain a loop of tl.fma, no padding, 5x faster than "dot" in ieee; equal to it because
  tl.dot's fp32 lowering is a fused-multiply-add chain, which tests/gpu checks on every GPU run
  (test_gdn_chunk_decode_kernels_agree; results/gpu/README.md)).

Any head size: tl.arange and tl.dot need power-of-two extents (>= 16 for a dot). The chunked forward zero-pads
K to KP (the next power of two, >= 16) and V to a multiple of 16 before the kernels; the decode kernels read
the cache with key index 0..KP-1 and value blocks masked (loads give 0, stores skipped). A padded key column
adds a 0 * 0 product, an exact no-op, so decode == chunked rows holds at any K and V; at power-of-two sizes
no padding is made and every mask is all-true (the same values).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from ..device import configure_cuda, num_sms
from ..triton_math import EXACT  # no compiler-chosen multiply-add contraction: ops round as written
from .constants import CHUNK, CHUNK_DOTS, DEFAULT_CHUNK_DOTS


# ----------------------------------------------------------------------------------- shared row arithmetic


@triton.jit
def _as_row16(x):
    """[N] -> [16, N] with x in row 0 and zeros below (the smallest M tl.dot takes)."""
    r16 = tl.arange(0, 16)
    return tl.where(r16[:, None] == 0, x[None, :], 0.0)


@triton.jit
def _row(m, i, M: tl.constexpr):
    """Row i of an [M, N] register tile (exact: one non-zero term per sum)."""
    rows = tl.arange(0, M)
    return tl.sum(tl.where(rows[:, None] == i, m, 0.0), axis=0)


@triton.jit
def _at(x, i, N: tl.constexpr):
    """x[i] of an [N] register vector (exact)."""
    return tl.sum(tl.where(tl.arange(0, N) == i, x, 0.0), axis=0)


@triton.jit
def _cum_log_decay(g, C: tl.constexpr):
    """G[t] = g[0] + ... + g[t], as the FMA chain of lower-ones @ g (rows past the last token add exact zeros)."""
    rows = tl.arange(0, C)
    lower = (rows[None, :] <= rows[:, None]).to(tl.float32)
    gm = tl.dot(lower, tl.broadcast_to(g[:, None], (C, 16)), input_precision="ieee")
    c16 = tl.arange(0, 16)
    return tl.sum(tl.where(c16[None, :] == 0, gm, 0.0), axis=1)


@triton.jit
def _tri_row(a, tm, DOTS: tl.constexpr):
    """Row i of T = (I + A)^-1 from A's row i (zero at and past i) and T's rows < i (zero rows past them):
    -(a @ T), the diagonal set to 1 by the caller."""
    return -_row(tl.dot(_as_row16(a), tm, input_precision=DOTS), 0, 16)


# ------------------------------------------------------------------------------------------------ trainer


@triton.jit(do_not_specialize=["T"])
def _prep_kernel(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, w_ptr, u0_ptr, qk_ptr, qd_ptr, kd_ptr, gl_ptr, tm_ptr, T,
                 K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BV: tl.constexpr, STORE_T: tl.constexpr,
                 DOTS: tl.constexpr, WHOLE_TILE: tl.constexpr):
    c = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    n_chunks = T // C
    rows = tl.arange(0, C)
    kk = tl.arange(0, K)
    tok = bh * T + c * C + rows  # token rows of this chunk
    chunk = bh * n_chunks + c

    g = tl.load(g_ptr + tok)
    beta = tl.load(b_ptr + tok)
    G = _cum_log_decay(g, C)
    eG = tl.exp(G)
    g_last = _at(G, C - 1, C)
    causal = rows[None, :] <= rows[:, None]
    decay = tl.where(causal, tl.exp(tl.where(causal, G[:, None] - G[None, :], 0.0)), 0.0)

    k = tl.load(k_ptr + tok[:, None] * K + kk[None, :])
    q = tl.load(q_ptr + tok[:, None] * K + kk[None, :])
    qk = tl.dot(q, tl.trans(k), input_precision=DOTS) * decay
    tl.store(qk_ptr + (chunk * C + rows)[:, None] * C + rows[None, :], qk)
    tl.store(qd_ptr + (chunk * C + rows)[:, None] * K + kk[None, :], q * eG[:, None])
    tl.store(kd_ptr + (chunk * C + rows)[:, None] * K + kk[None, :], k * tl.exp(g_last - G)[:, None])
    tl.store(gl_ptr + chunk, tl.exp(g_last))

    kb = k * beta[:, None]
    a = tl.dot(kb, tl.trans(k), input_precision=DOTS) * decay
    a = tl.where(rows[None, :] < rows[:, None], a, 0.0)
    tm = tl.zeros((C, C), dtype=tl.float32)
    if not WHOLE_TILE:
        for i in range(0, C):  # forward substitution, row by row (the decode step's per-token work)
            new = tl.where(rows == i, 1.0, _tri_row(_row(a, i, C), tm, DOTS))
            tm = tl.where(rows[:, None] == i, new[None, :], tm)
    else:
        # the same rows: at step i, row i of the whole-tile product a @ T is row i's dot of the loop above (a row's
        # products do not depend on the tile's other rows), so no row is extracted or padded. "+ 0.0" is _row's
        # exact extraction (a sum with zeros) that the loop above applies before negating.
        for i in range(0, C):
            new = tl.where(rows[None, :] == i, 1.0, -(tl.dot(a, tm, input_precision=DOTS) + 0.0))
            tm = tl.where(rows[:, None] == i, new, tm)
    if STORE_T:
        tl.store(tm_ptr + (chunk * C + rows)[:, None] * C + rows[None, :], tm)

    kbg = kb * eG[:, None]
    tl.store(w_ptr + (chunk * C + rows)[:, None] * K + kk[None, :], tl.dot(tm, kbg, input_precision=DOTS))
    for vb in tl.static_range(V // BV):
        vv = vb * BV + tl.arange(0, BV)
        v = tl.load(v_ptr + tok[:, None] * V + vv[None, :])
        u0 = tl.dot(tm, v * beta[:, None], input_precision=DOTS)
        tl.store(u0_ptr + (chunk * C + rows)[:, None] * V + vv[None, :], u0)


@triton.jit(do_not_specialize=["T"])
def _scan_kernel(w_ptr, u0_ptr, qk_ptr, qd_ptr, kd_ptr, gl_ptr, s0_ptr, o_ptr, st_ptr, u_ptr, T,
                 K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BV: tl.constexpr,
                 STORE_STATES: tl.constexpr, STORE_U: tl.constexpr, DOTS: tl.constexpr):
    vb = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    n_chunks = T // C
    rows = tl.arange(0, C)
    kk = tl.arange(0, K)
    vv = vb * BV + tl.arange(0, BV)
    s = tl.load(s0_ptr + (bh * K + kk)[:, None] * V + vv[None, :])
    if STORE_STATES:
        tl.store(st_ptr + ((bh * (n_chunks + 1)) * K + kk)[:, None] * V + vv[None, :], s)
    for c in range(0, n_chunks):
        chunk = bh * n_chunks + c
        crow = chunk * C + rows
        w = tl.load(w_ptr + crow[:, None] * K + kk[None, :])
        u = tl.load(u0_ptr + crow[:, None] * V + vv[None, :]) - tl.dot(w, s, input_precision=DOTS)
        qd = tl.load(qd_ptr + crow[:, None] * K + kk[None, :])
        qk = tl.load(qk_ptr + crow[:, None] * C + rows[None, :])
        # the chain over the chunk starts from q S (an explicit accumulator: Triton would otherwise fold the sum
        # into the dot itself, and the decode step must know which)
        o = tl.dot(qk, u, tl.dot(qd, s, input_precision=DOTS), input_precision=DOTS)
        tok = bh * T + c * C + rows
        tl.store(o_ptr + tok[:, None] * V + vv[None, :], o)
        if STORE_U:
            tl.store(u_ptr + tok[:, None] * V + vv[None, :], u)
        kd = tl.load(kd_ptr + crow[:, None] * K + kk[None, :])
        s = tl.dot(tl.trans(kd), u, s * tl.load(gl_ptr + chunk), input_precision=DOTS)
        if STORE_STATES:
            tl.store(st_ptr + ((bh * (n_chunks + 1) + c + 1) * K + kk)[:, None] * V + vv[None, :], s)


# launch settings; no setting changes a value (each output row's products are tile-independent, module docstring;
# tests/gpu runs other settings against these; picked by the sweeps in results/gpu/README.md: the tf32 decode
# at 4 warps x 32 value columns is 2x faster than 8 x 16 at 64 sequences, the forward's prep kernel at 8 warps
# faster than at 16: results/gpu/decode_picks_377a3cc)
NUM_WARPS = {"prep": 8, "scan": 8, "decode": 4, "chain": 2}
BV_MAX = {"prep": 64, "scan": 16, "decode": 32, "chain": 32}
NUM_STAGES = {"prep": 1, "scan": 1, "decode": 1, "chain": 1}
# the prep kernel's forward substitution in the tensor-core arithmetic: row i from the whole-tile product A @ T
# (64-row dots, no row extraction) instead of the padded-row dot; the same bits (tests/gpu), the speed measured
# by benchmarks/gdn.py (settings) and benchmarks/trainer.py. ieee keeps the padded row: a 64-row FMA chain costs
# 4x a 16-row one.
WHOLE_TILE_SUBSTITUTION = True
# the dot decode step's value blocks split over this many programs per (sequence, head), each recomputing the
# shared part (the rows of A, T, w): the same bits (each value column's products are the same whatever program
# computes them). None: as many as fill the GPU's multiprocessors once (one sequence x 32 heads: 4; 64
# sequences: 1; benchmarks/gdn.py settings: a split of 4 halves one sequence's step and slows 64 sequences')
DECODE_VSPLIT: int | None = None
_BV: dict[tuple, int] = {}  # (kernel, K, V, widest allowed) -> value block that fits the shared memory


def padded_k(dk: int) -> int:
    """The key extent the kernels compute over: a power of two, at least tl.dot's 16."""
    return max(16, triton.next_power_of_2(dk))


def _launch(name, kernel, grid_of_bv, *args, V: int, **kw):
    """Launch with the widest value block (<= BV_MAX[name], halving) whose shared memory fits; remembered."""
    key = (name, kw.get("K"), V, kw.get("DOTS"), BV_MAX[name], NUM_WARPS[name], NUM_STAGES[name])
    kw["num_warps"], kw["num_stages"] = NUM_WARPS[name], NUM_STAGES[name]
    cands = [_BV[key]] if key in _BV else ([b for b in (128, 64, 32, 16) if V % b == 0 and b <= BV_MAX[name]]
                                           or [b for b in (128, 64, 32, 16) if b <= BV_MAX[name]])
    for i, bv in enumerate(cands):
        try:
            kernel[grid_of_bv(bv)](*args, V=V, BV=bv, **kw)
            _BV[key] = bv
            return
        except OutOfResources:
            if i == len(cands) - 1:
                raise


def chunk_fwd_triton(q, k, v, g, beta, state, return_rows: bool = False, dots: str = DEFAULT_CHUNK_DOTS):
    """q, k [B, HV, T, K]; v [B, HV, T, V]; g, beta [B, HV, T] fp32 (T a multiple of 64, zero-padded);
    state [B, HV, K, V] fp32. Returns (o [B, HV, T, V], states [B, HV, n_chunks + 1, K, V]); with return_rows
    also (tm [B, HV, n_chunks, C, C] the per-chunk (I + A)^-1, u [B, HV, T, V]): what the generator caches for
    an open chunk. dots: the products' arithmetic, one of CHUNK_DOTS (module docstring). Not differentiable
    (ops.autograd.backward_through differentiates the chunked torch form)."""
    assert dots in CHUNK_DOTS, dots
    configure_cuda()
    dk, dv = q.shape[-1], v.shape[-1]
    kp, vp = padded_k(dk), dv + (-dv) % 16
    if (kp, vp) != (dk, dv):  # zero padding: exact no-ops in every chain (module docstring)
        pad_k, pad_v = (0, kp - dk), (0, vp - dv)
        rows = chunk_fwd_triton(F.pad(q, pad_k), F.pad(k, pad_k), F.pad(v, pad_v), g, beta,
                                F.pad(state, pad_v + pad_k), return_rows, dots)
        o, states = rows[0][..., :dv].contiguous(), rows[1][..., :dk, :dv].contiguous()
        return (o, states, rows[2], rows[3][..., :dv].contiguous()) if return_rows else (o, states)
    b, h, t, _ = q.shape
    assert t % CHUNK == 0, f"chunk_fwd_triton needs T % {CHUNK} == 0, got {t}"
    n = t // CHUNK
    q, k, v, g, beta = (x.float().contiguous() for x in (q, k, v, g, beta))
    s0 = state.float().contiguous()
    f32 = dict(device=q.device, dtype=torch.float32)
    w, qd, kd = (torch.empty(b, h, n, CHUNK, dk, **f32) for _ in range(3))
    u0 = torch.empty(b, h, n, CHUNK, dv, **f32)
    qk = torch.empty(b, h, n, CHUNK, CHUNK, **f32)
    gl = torch.empty(b, h, n, **f32)
    tm = torch.empty(b, h, n, CHUNK, CHUNK, **f32) if return_rows else qk
    o = torch.empty(b, h, t, dv, **f32)
    states = torch.empty(b, h, n + 1, dk, dv, **f32)
    u = torch.empty(b, h, t, dv, **f32) if return_rows else o
    if b * h and n:
        _launch("prep", _prep_kernel, lambda bv: (n, b * h), q, k, v, g, beta, w, u0, qk, qd, kd, gl, tm, t, K=dk, V=dv,
                C=CHUNK, STORE_T=return_rows, DOTS=dots, WHOLE_TILE=WHOLE_TILE_SUBSTITUTION and dots != "ieee",
                **EXACT)
        _launch("scan", _scan_kernel, lambda bv: (dv // bv, b * h), w, u0, qk, qd, kd, gl, s0, o, states, u, t, K=dk,
                V=dv, C=CHUNK, STORE_STATES=True, STORE_U=return_rows, DOTS=dots, **EXACT)
    else:
        states[:, :, 0] = s0
    if return_rows:
        return o, states, tm, u
    return o, states


# ------------------------------------------------------------------------------------------------ decode


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, o_ptr, slot_ptr, pos_ptr,
                   s_ptr, ck_ptr, cv_ptr, cg_ptr, cb_ptr, ct_ptr, cu_ptr, HV,
                   K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BV: tl.constexpr, KP: tl.constexpr,
                   DOTS: tl.constexpr, VSPLIT: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    part = tl.program_id(2)  # which VSPLIT-th of the value blocks this program computes (the rest is shared)
    slot = tl.load(slot_ptr + i).to(tl.int64)
    t = tl.load(pos_ptr + i)  # position of this token in its open chunk
    sh = slot * HV + h
    ih = i * HV + h
    rows = tl.arange(0, C)
    kk = tl.arange(0, KP)
    km = kk < K
    prev = rows < t
    cur = rows == t

    # the chunk so far: cached rows < t, this token at row t, zeros after
    q_t = tl.load(q_ptr + ih * K + kk, mask=km, other=0.0)
    k_t = tl.load(k_ptr + ih * K + kk, mask=km, other=0.0)
    g_t = tl.load(g_ptr + ih)
    b_t = tl.load(b_ptr + ih)
    g = tl.where(cur, g_t, tl.load(cg_ptr + sh * C + rows, mask=prev, other=0.0))
    beta = tl.where(cur, b_t, tl.load(cb_ptr + sh * C + rows, mask=prev, other=0.0))
    k = tl.load(ck_ptr + (sh * C + rows)[:, None] * K + kk[None, :], mask=prev[:, None] & km[None, :], other=0.0)
    k = tl.where(cur[:, None], k_t[None, :], k)

    G = _cum_log_decay(g, C)
    eG = tl.exp(G)
    G_t = _at(G, t, C)
    drow = tl.where(rows <= t, tl.exp(tl.where(rows <= t, G_t - G, 0.0)), 0.0)

    # rows t of A and of q k^T in one product (rows are independent chains)
    r16 = tl.arange(0, 16)
    kb_t = k_t * b_t
    lhs = tl.where(r16[:, None] == 0, kb_t[None, :], tl.where(r16[:, None] == 1, q_t[None, :], 0.0))
    both = tl.dot(lhs, tl.trans(k), input_precision=DOTS)
    a = _row(both, 0, 16) * drow
    a = tl.where(rows < t, a, 0.0)
    qk_t = _row(both, 1, 16) * drow

    tm = tl.load(ct_ptr + (sh * C + rows)[:, None] * C + rows[None, :], mask=prev[:, None], other=0.0)
    t_row = tl.where(cur, 1.0, _tri_row(a, tm, DOTS))
    t16 = _as_row16(t_row)
    kbg = (k * beta[:, None]) * eG[:, None]
    w_t = _row(tl.dot(t16, kbg, input_precision=DOTS), 0, 16)
    qd_t = q_t * _at(eG, t, C)
    wq = tl.where(r16[:, None] == 0, w_t[None, :], tl.where(r16[:, None] == 1, qd_t[None, :], 0.0))
    qk16 = _as_row16(qk_t)
    closes = t == C - 1

    per_part: tl.constexpr = ((V + BV - 1) // BV + VSPLIT - 1) // VSPLIT
    for j in tl.static_range(per_part):
        vv = (part * per_part + j) * BV + tl.arange(0, BV)
        vm = vv < V
        sm = km[:, None] & vm[None, :]
        v_t = tl.load(v_ptr + ih * V + vv, mask=vm, other=0.0)
        v = tl.load(cv_ptr + (sh * C + rows)[:, None] * V + vv[None, :], mask=prev[:, None] & vm[None, :], other=0.0)
        v = tl.where(cur[:, None], v_t[None, :], v)
        s = tl.load(s_ptr + (sh * K + kk)[:, None] * V + vv[None, :], mask=sm, other=0.0)
        u0_t = _row(tl.dot(t16, v * beta[:, None], input_precision=DOTS), 0, 16)
        ws = tl.dot(wq, s, input_precision=DOTS)  # row 0: w_t S, row 1: (q_t exp(G_t)) S
        u_t = u0_t - _row(ws, 0, 16)
        u = tl.load(cu_ptr + (sh * C + rows)[:, None] * V + vv[None, :], mask=prev[:, None] & vm[None, :], other=0.0)
        u = tl.where(cur[:, None], u_t[None, :], u)
        o_t = _row(tl.dot(qk16, u, _as_row16(_row(ws, 1, 16)), input_precision=DOTS), 0, 16)
        tl.store(o_ptr + ih * V + vv, o_t, mask=vm)
        tl.store(cv_ptr + (sh * C + t) * V + vv, v_t, mask=vm)
        tl.store(cu_ptr + (sh * C + t) * V + vv, u_t, mask=vm)
        if closes:  # the chunk is complete: the next boundary state, as the trainer's scan computes it
            kd = k * tl.exp(G_t - G)[:, None]
            s = tl.dot(tl.trans(kd), u, s * tl.exp(G_t), input_precision=DOTS)
            tl.store(s_ptr + (sh * K + kk)[:, None] * V + vv[None, :], s, mask=sm)
    if part == 0:  # row t of the open chunk (the other parts read only rows < t)
        tl.store(ck_ptr + (sh * C + t) * K + kk, k_t, mask=km)
        tl.store(cg_ptr + sh * C + t, g_t)
        tl.store(cb_ptr + sh * C + t, b_t)
        tl.store(ct_ptr + (sh * C + t) * C + rows, t_row)


@triton.jit
def _decode_chain_kernel(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, o_ptr, slot_ptr, pos_ptr,
                         s_ptr, ck_ptr, cv_ptr, cg_ptr, cb_ptr, ct_ptr, cu_ptr, scr_ptr, HV,
                         K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BV: tl.constexpr, KP: tl.constexpr):
    """The decode step with every chain written out as a loop of tl.fma over its index (no 16-row padding): the
    same chains as `_decode_kernel` in the ieee arithmetic, whose tl.dot lowers to fused multiply-adds
    (tests/gpu checks its bits every GPU run)."""
    i = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    slot = tl.load(slot_ptr + i).to(tl.int64)
    t = tl.load(pos_ptr + i)
    sh = slot * HV + h
    ih = i * HV + h
    rows = tl.arange(0, C)
    kk = tl.arange(0, KP)
    km = kk < K
    scr = scr_ptr + ih * (3 * C + 2 * KP)  # a, qk, G (C each), w_t, q_t exp(G_t) (KP each)
    g_t = tl.load(g_ptr + ih)
    b_t = tl.load(b_ptr + ih)
    q_t = tl.load(q_ptr + ih * K + kk, mask=km, other=0.0)
    # append this token's inputs to the open chunk first: the loops below read row t back (barrier)
    tl.store(ck_ptr + (sh * C + t) * K + kk, tl.load(k_ptr + ih * K + kk, mask=km), mask=km)
    for vb in tl.static_range((V + BV - 1) // BV):
        cols = vb * BV + tl.arange(0, BV)
        tl.store(cv_ptr + (sh * C + t) * V + cols, tl.load(v_ptr + ih * V + cols, mask=cols < V), mask=cols < V)
    tl.store(cg_ptr + sh * C + t, g_t)
    tl.store(cb_ptr + sh * C + t, b_t)
    tl.debug_barrier()

    G = tl.zeros((C,), tl.float32)
    run = tl.sum(tl.zeros((C,), tl.float32), axis=0)
    for j in range(0, t + 1):
        run = run + tl.load(cg_ptr + sh * C + j)
        G = tl.where(rows == j, run, G)
    G_t = run
    drow = tl.where(rows <= t, tl.exp(tl.where(rows <= t, G_t - G, 0.0)), 0.0)
    acc_a = tl.zeros((C,), tl.float32)
    acc_q = tl.zeros((C,), tl.float32)
    for d in range(0, K):
        col = tl.load(ck_ptr + (sh * C + rows) * K + d, mask=rows <= t, other=0.0)
        acc_a = tl.fma(tl.load(k_ptr + ih * K + d) * b_t, col, acc_a)
        acc_q = tl.fma(tl.load(q_ptr + ih * K + d), col, acc_q)
    tl.store(scr + rows, tl.where(rows < t, acc_a * drow, 0.0))
    tl.store(scr + C + rows, acc_q * drow)
    tl.store(scr + 2 * C + rows, G)
    tl.debug_barrier()

    acc_t = tl.zeros((C,), tl.float32)
    for j in range(0, t):
        acc_t = tl.fma(tl.load(scr + j), tl.load(ct_ptr + (sh * C + j) * C + rows), acc_t)
    tl.store(ct_ptr + (sh * C + t) * C + rows, tl.where(rows == t, 1.0, -acc_t))
    tl.debug_barrier()

    acc_w = tl.zeros((KP,), tl.float32)
    for j in range(0, t + 1):
        kbg = (tl.load(ck_ptr + (sh * C + j) * K + kk, mask=km, other=0.0) * tl.load(cb_ptr + sh * C + j)) * \
            tl.exp(tl.load(scr + 2 * C + j))
        acc_w = tl.fma(tl.load(ct_ptr + (sh * C + t) * C + j), kbg, acc_w)
    tl.store(scr + 3 * C + kk, acc_w)
    tl.store(scr + 3 * C + KP + kk, q_t * tl.exp(G_t))
    tl.debug_barrier()

    for vb in tl.static_range((V + BV - 1) // BV):
        cols = vb * BV + tl.arange(0, BV)
        cm = cols < V
        acc_u = tl.zeros((BV,), tl.float32)
        for j in range(0, t + 1):
            vbj = tl.load(cv_ptr + (sh * C + j) * V + cols, mask=cm, other=0.0) * tl.load(cb_ptr + sh * C + j)
            acc_u = tl.fma(tl.load(ct_ptr + (sh * C + t) * C + j), vbj, acc_u)
        acc_ws = tl.zeros((BV,), tl.float32)
        acc_o = tl.zeros((BV,), tl.float32)
        for d in range(0, K):  # the dot's chain over KP less its trailing 0 * 0 terms (exact no-ops)
            srow = tl.load(s_ptr + (sh * K + d) * V + cols, mask=cm, other=0.0)
            acc_ws = tl.fma(tl.load(scr + 3 * C + d), srow, acc_ws)
            acc_o = tl.fma(tl.load(scr + 3 * C + KP + d), srow, acc_o)
        u_t = acc_u - acc_ws
        for j in range(0, t):
            acc_o = tl.fma(tl.load(scr + C + j), tl.load(cu_ptr + (sh * C + j) * V + cols, mask=cm, other=0.0), acc_o)
        acc_o = tl.fma(tl.load(scr + C + t), u_t, acc_o)
        tl.store(o_ptr + ih * V + cols, acc_o, mask=cm)
        tl.store(cu_ptr + (sh * C + t) * V + cols, u_t, mask=cm)
    if t == C - 1:  # the chunk is complete: S' = S exp(G_t) + sum_j (k_j exp(G_t - G_j)) u_j^T, chain over j
        tl.debug_barrier()
        for vb in tl.static_range((V + BV - 1) // BV):
            cols = vb * BV + tl.arange(0, BV)
            cm = cols < V
            sm = km[:, None] & cm[None, :]
            sp = s_ptr + (sh * K + kk)[:, None] * V + cols[None, :]
            acc = tl.load(sp, mask=sm, other=0.0) * tl.exp(G_t)
            for j in range(0, C):
                kd = tl.load(ck_ptr + (sh * C + j) * K + kk, mask=km, other=0.0) * \
                    tl.exp(G_t - tl.load(scr + 2 * C + j))
                u_j = tl.load(cu_ptr + (sh * C + j) * V + cols, mask=cm, other=0.0)
                acc = tl.fma(kd[:, None], u_j[None, :], acc)
            tl.store(sp, acc, mask=sm)


def chunk_decode_triton(q, k, v, g, beta, slots, pos, cache: dict, dots: str = DEFAULT_CHUNK_DOTS,
                        kernel: str | None = None):
    """One token per sequence, chunk-consistent: o equals row `pos` of `chunk_fwd_triton(..., dots=dots)` over
    the sequence's open chunk bit for bit. q, k [N, HV, K], v [N, HV, V], g, beta [N, HV] fp32 (prepared); slots
    [N] cache slots; pos [N] the token's position in its open chunk (start_pos % 64). cache: the layer's tensors
    ssm [S, HV, K, V], ck [S, HV, C, K], cv [S, HV, C, V], cg, cb [S, HV, C], ct [S, HV, C, C], cu [S, HV, C, V]
    (all fp32), updated in place (the state only when the chunk closes). kernel: "dot" (the trainer's construct,
    any `dots`) or "chain" ("ieee" only; its default there); by default the fastest for `dots`. Returns
    o [N, HV, V] fp32."""
    assert dots in CHUNK_DOTS, dots
    kernel = kernel or ("chain" if dots == "ieee" else "dot")
    assert kernel == "dot" or (kernel == "chain" and dots == "ieee"), (kernel, dots)
    configure_cuda()
    n, hv, dk = q.shape
    dv = v.shape[-1]
    q, k, v, g, beta = (x.float().contiguous() for x in (q, k, v, g, beta))
    kp = padded_k(dk)
    o = torch.empty(n, hv, dv, device=q.device, dtype=torch.float32)
    if n and kernel == "chain":
        scr = torch.empty(n, hv, 3 * CHUNK + 2 * kp, device=q.device, dtype=torch.float32)
        _launch("chain", _decode_chain_kernel, lambda bv: (n, hv), q, k, v, g, beta, o, slots.contiguous(),
                pos.to(torch.int32).contiguous(), cache["ssm"], cache["ck"], cache["cv"], cache["cg"], cache["cb"],
                cache["ct"], cache["cu"], scr, hv, K=dk, V=dv, C=CHUNK, KP=kp, **EXACT)
    elif n:
        split = DECODE_VSPLIT or min(max(1, num_sms(q.device) // (n * hv)), triton.cdiv(dv, BV_MAX["decode"]))
        _launch("decode", _decode_kernel, lambda bv: (n, hv, min(split, triton.cdiv(dv, bv))), q, k, v, g,
                beta, o, slots.contiguous(), pos.to(torch.int32).contiguous(), cache["ssm"], cache["ck"], cache["cv"],
                cache["cg"], cache["cb"], cache["ct"], cache["cu"], hv, K=dk, V=dv, C=CHUNK, KP=kp, DOTS=dots,
                VSPLIT=split, **EXACT)
    return o
