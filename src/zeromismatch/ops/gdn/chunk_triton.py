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
- the decode step (decode_triton.py): one token for a batch of sequences, the state and the open chunk's rows
  read and written in place in the generator's cache slots. It reads the fp32 state once and writes it only when
  the chunk closes (every 64 tokens); the open chunk's rows (k, v, g, beta, T, u) are cached so no earlier row is
  recomputed. Three kernels, one construct (the operand in row 0 of 16-row tiles): "split" (DECODE_KERNEL's
  pick for tf32: a rows kernel per (sequence, head) for the key side, then a values kernel per (sequence, head,
  value block)); "dot" (both sides in one program per (sequence, head), or DECODE_VSPLIT programs each
  recomputing the key side); "chain" ("ieee" only and its default there: each chain a loop of tl.fma, no
  padding, 5x faster than "dot" in ieee; equal to it because tl.dot's fp32 lowering is a fused-multiply-add
  chain, which tests/gpu checks on every GPU run (test_gdn_chunk_decode_kernels_agree; results/gpu/README.md)).

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
from .decode_triton import _decode_chain_kernel, _decode_kernel, _decode_rows_kernel, _decode_values_kernel
from .rows_triton import at, cum_log_decay, row, tri_row


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
    G = cum_log_decay(g, C)
    eG = tl.exp(G)
    g_last = at(G, C - 1, C)
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
            new = tl.where(rows == i, 1.0, tri_row(row(a, i, C), tm, DOTS))
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
# tests/gpu runs other settings against these; picked by the sweeps in results/gpu/README.md: the one-program tf32
# decode at 4 warps x 32 value columns is 2x faster than 8 x 16 at 64 sequences, the forward's prep kernel at 8
# warps faster than at 16: results/gpu/decode_picks_377a3cc; the split decode's rows kernel at 2 warps, its values
# kernel at 4 x 32 columns, 1.77x the state floor over a chunk at 64 sequences: results/gpu/decode_split_2b3b761)
NUM_WARPS = {"prep": 8, "scan": 8, "decode": 4, "chain": 2, "rows": 2, "values": 4}
BV_MAX = {"prep": 64, "scan": 16, "decode": 32, "chain": 32, "values": 32}
NUM_STAGES = {"prep": 1, "scan": 1, "decode": 1, "chain": 1, "rows": 1, "values": 1}
# the decode kernel each arithmetic runs by default (chunk_decode_triton; benchmarks/gdn.py times all three), and
# below how many (sequence, head) pairs the tf32 step runs the one-program kernel instead, with the value split:
# one launch, not two, where a step is too small to fill the GPU (None: the GPU's multiprocessor count; one
# sequence x 32 heads: 0.0102 ms a step against the split pair's 0.0126, results/gpu/decode_split_2b3b761)
DECODE_KERNEL = {"tf32": "split", "ieee": "chain"}
DECODE_DOT_BELOW: int | None = None
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


def chunk_decode_triton(q, k, v, g, beta, slots, pos, cache: dict, dots: str = DEFAULT_CHUNK_DOTS,
                        kernel: str | None = None):
    """One token per sequence, chunk-consistent: o equals row `pos` of `chunk_fwd_triton(..., dots=dots)` over
    the sequence's open chunk bit for bit. q, k [N, HV, K], v [N, HV, V], g, beta [N, HV] fp32 (prepared); slots
    [N] cache slots; pos [N] the token's position in its open chunk (start_pos % 64). cache: the layer's tensors
    ssm [S, HV, K, V], ck [S, HV, C, K], cv [S, HV, C, V], cg, cb [S, HV, C], ct [S, HV, C, C], cu [S, HV, C, V]
    (all fp32), updated in place (the state only when the chunk closes). kernel: "split" or "dot" (the trainer's
    construct, any `dots`) or "chain" ("ieee" only); by default DECODE_KERNEL[dots] ("dot" for tf32 below
    DECODE_DOT_BELOW sequence-heads). Returns o [N, HV, V] fp32."""
    assert dots in CHUNK_DOTS, dots
    if kernel is None:
        below = num_sms(q.device) if DECODE_DOT_BELOW is None else DECODE_DOT_BELOW
        kernel = "dot" if dots == "tf32" and q.shape[0] * q.shape[1] < below else DECODE_KERNEL[dots]
    assert kernel in ("split", "dot") or (kernel == "chain" and dots == "ieee"), (kernel, dots)
    configure_cuda()
    n, hv, dk = q.shape
    dv = v.shape[-1]
    q, k, v, g, beta = (x.float().contiguous() for x in (q, k, v, g, beta))
    kp = padded_k(dk)
    o = torch.empty(n, hv, dv, device=q.device, dtype=torch.float32)
    if not n:
        return o
    slots, pos = slots.contiguous(), pos.to(torch.int32).contiguous()
    c = [cache[name] for name in ("ssm", "ck", "cv", "cg", "cb", "ct", "cu")]
    # chain and split pass row t's key side through a scratch row: three C-rows (A or T's row, qk, G), two K-rows
    scr = torch.empty(n, hv, 3 * CHUNK + 2 * kp, device=q.device, dtype=torch.float32) if kernel != "dot" else None
    if kernel == "chain":
        _launch("chain", _decode_chain_kernel, lambda bv: (n, hv), q, k, v, g, beta, o, slots, pos, *c, scr, hv, K=dk,
                V=dv, C=CHUNK, KP=kp, **EXACT)
    elif kernel == "split":  # the key side's row into scr, then the value blocks from it
        ssm, ck, cv, cg, cb, ct, cu = c
        _decode_rows_kernel[(n, hv)](q, k, g, beta, slots, pos, ck, cg, cb, ct, scr, hv, K=dk, C=CHUNK, KP=kp,
                                     DOTS=dots, num_warps=NUM_WARPS["rows"], num_stages=NUM_STAGES["rows"], **EXACT)
        _launch("values", _decode_values_kernel, lambda bv: (n, hv, triton.cdiv(dv, bv)), v, o, slots, pos, ssm, ck,
                cv, cb, cu, scr, hv, K=dk, V=dv, C=CHUNK, KP=kp, DOTS=dots, **EXACT)
    else:
        split = DECODE_VSPLIT or min(max(1, num_sms(q.device) // (n * hv)), triton.cdiv(dv, BV_MAX["decode"]))
        _launch("decode", _decode_kernel, lambda bv: (n, hv, min(split, triton.cdiv(dv, bv))), q, k, v, g, beta, o,
                slots, pos, *c, hv, K=dk, V=dv, C=CHUNK, KP=kp, DOTS=dots, VSPLIT=split, **EXACT)
    return o
