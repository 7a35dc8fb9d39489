"""bi_chunk's decode step kernels (launched by chunk_triton.chunk_decode_triton, whose module docstring says why
each equals the chunked forward's row bit for bit): one token for a batch of sequences, the fp32 state and the
open chunk's rows read and written in place in the generator's cache slots.

- `_decode_rows_kernel` + `_decode_values_kernel` ("split", the tensor-core default): the step in two launches.
  The first, one program per (sequence, head), computes the key side of row t (A's and q k^T's rows, T's row by
  forward substitution, w_t, q_t exp(G_t)) into a scratch row and appends the token's k, g, beta and T row to the
  open chunk; the second, one program per (sequence, head, value block), reads them and the state's value block
  for u_t, o_t and, when the chunk closes, the next boundary state. Each program is short and light, so many run
  at once: 0.67x the one-program kernel's time at 64 sequences (results/gpu/suite_25dbe47). What remains is the
  rows kernel's chain of small dots (~40% of the step) and the values kernel's reads (~1.5x their bytes' time at
  the copy bandwidth; results/gpu/decode_split_2b3b761).
- `_decode_kernel` ("dot"): the same products in one program per (sequence, head) (or VSPLIT programs, each
  recomputing the key side for its share of the value blocks).
- `_decode_chain_kernel` ("chain", "ieee" only and its default there): every chain written as a loop of tl.fma.
"""

import triton
import triton.language as tl

from .rows_triton import as_row16, at, cum_log_decay, row, tri_row


@triton.jit
def _token_head(slot_ptr, pos_ptr, HV):
    """This program's (sequence, head), grid axes 0 and 1: (sh: its row of the slot-indexed cache, ih: its row of
    the step's token tensors, t: the token's position in its open chunk)."""
    i = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    slot = tl.load(slot_ptr + i).to(tl.int64)
    return slot * HV + h, i * HV + h, tl.load(pos_ptr + i)


@triton.jit
def _key_side(q_ptr, k_ptr, g_ptr, b_ptr, ck_ptr, cg_ptr, cb_ptr, ct_ptr, sh, ih, t,
              K: tl.constexpr, C: tl.constexpr, KP: tl.constexpr, DOTS: tl.constexpr):
    """The key side of row t on the chunk so far (cached rows < t, this token at row t, zeros after), with the
    trainer's products: (k rows, beta, G, T's row t, the decayed q_t k^T row, w_t, q_t exp(G_t), and the token's
    k_t, g_t, beta_t for the caller to append)."""
    rows = tl.arange(0, C)
    kk = tl.arange(0, KP)
    km = kk < K
    prev = rows < t
    cur = rows == t
    q_t = tl.load(q_ptr + ih * K + kk, mask=km, other=0.0)
    k_t = tl.load(k_ptr + ih * K + kk, mask=km, other=0.0)
    g_t = tl.load(g_ptr + ih)
    b_t = tl.load(b_ptr + ih)
    g = tl.where(cur, g_t, tl.load(cg_ptr + sh * C + rows, mask=prev, other=0.0))
    beta = tl.where(cur, b_t, tl.load(cb_ptr + sh * C + rows, mask=prev, other=0.0))
    k = tl.load(ck_ptr + (sh * C + rows)[:, None] * K + kk[None, :], mask=prev[:, None] & km[None, :], other=0.0)
    k = tl.where(cur[:, None], k_t[None, :], k)

    G = cum_log_decay(g, C)
    eG = tl.exp(G)
    G_t = at(G, t, C)
    drow = tl.where(rows <= t, tl.exp(tl.where(rows <= t, G_t - G, 0.0)), 0.0)
    # rows t of A and of q k^T in one product (rows are independent chains)
    r16 = tl.arange(0, 16)
    lhs = tl.where(r16[:, None] == 0, (k_t * b_t)[None, :], tl.where(r16[:, None] == 1, q_t[None, :], 0.0))
    both = tl.dot(lhs, tl.trans(k), input_precision=DOTS)
    a = tl.where(rows < t, row(both, 0, 16) * drow, 0.0)
    qk_t = row(both, 1, 16) * drow
    tm = tl.load(ct_ptr + (sh * C + rows)[:, None] * C + rows[None, :], mask=prev[:, None], other=0.0)
    t_row = tl.where(cur, 1.0, tri_row(a, tm, DOTS))
    kbg = (k * beta[:, None]) * eG[:, None]
    w_t = row(tl.dot(as_row16(t_row), kbg, input_precision=DOTS), 0, 16)
    return k, beta, G, t_row, qk_t, w_t, q_t * at(eG, t, C), k_t, g_t, b_t


@triton.jit
def _value_block(v_ptr, o_ptr, s_ptr, cv_ptr, cu_ptr, sh, ih, t, vv, t16, wq, qk16, beta,
                 K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, KP: tl.constexpr, DOTS: tl.constexpr):
    """Value columns vv of row t from its key side (t16: T's row t, wq: rows w_t and q_t exp(G_t), qk16: the
    decayed q_t k^T row, each in a 16-row tile): u_t = T_t (v beta) - w_t S, o_t = qk_t u + q_t exp(G_t) S, the
    trainer's products; o_t stored, the token's v and u appended to the open chunk. Returns the state block S and
    the chunk's u rows (for the state update when the chunk closes)."""
    rows = tl.arange(0, C)
    kk = tl.arange(0, KP)
    prev = rows < t
    cur = rows == t
    vm = vv < V
    v_t = tl.load(v_ptr + ih * V + vv, mask=vm, other=0.0)
    v = tl.load(cv_ptr + (sh * C + rows)[:, None] * V + vv[None, :], mask=prev[:, None] & vm[None, :], other=0.0)
    v = tl.where(cur[:, None], v_t[None, :], v)
    s = tl.load(s_ptr + (sh * K + kk)[:, None] * V + vv[None, :], mask=(kk < K)[:, None] & vm[None, :], other=0.0)
    u0_t = row(tl.dot(t16, v * beta[:, None], input_precision=DOTS), 0, 16)
    ws = tl.dot(wq, s, input_precision=DOTS)  # row 0: w_t S, row 1: (q_t exp(G_t)) S
    u_t = u0_t - row(ws, 0, 16)
    u = tl.load(cu_ptr + (sh * C + rows)[:, None] * V + vv[None, :], mask=prev[:, None] & vm[None, :], other=0.0)
    u = tl.where(cur[:, None], u_t[None, :], u)
    o_t = row(tl.dot(qk16, u, as_row16(row(ws, 1, 16)), input_precision=DOTS), 0, 16)
    tl.store(o_ptr + ih * V + vv, o_t, mask=vm)
    tl.store(cv_ptr + (sh * C + t) * V + vv, v_t, mask=vm)
    tl.store(cu_ptr + (sh * C + t) * V + vv, u_t, mask=vm)
    return s, u


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, o_ptr, slot_ptr, pos_ptr,
                   s_ptr, ck_ptr, cv_ptr, cg_ptr, cb_ptr, ct_ptr, cu_ptr, HV,
                   K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BV: tl.constexpr, KP: tl.constexpr,
                   DOTS: tl.constexpr, VSPLIT: tl.constexpr):
    """The whole step in one program per (sequence, head): its key side, then its value blocks (or VSPLIT
    programs, each recomputing the key side for its share of the value blocks)."""
    sh, ih, t = _token_head(slot_ptr, pos_ptr, HV)
    part = tl.program_id(2)  # which VSPLIT-th of the value blocks this program computes (the rest is shared)
    rows = tl.arange(0, C)
    kk = tl.arange(0, KP)
    km = kk < K
    k, beta, G, t_row, qk_t, w_t, qd_t, k_t, g_t, b_t = _key_side(q_ptr, k_ptr, g_ptr, b_ptr, ck_ptr, cg_ptr, cb_ptr,
                                                                  ct_ptr, sh, ih, t, K, C, KP, DOTS)
    G_t = at(G, t, C)
    r16 = tl.arange(0, 16)
    t16 = as_row16(t_row)
    wq = tl.where(r16[:, None] == 0, w_t[None, :], tl.where(r16[:, None] == 1, qd_t[None, :], 0.0))
    qk16 = as_row16(qk_t)
    closes = t == C - 1

    per_part: tl.constexpr = ((V + BV - 1) // BV + VSPLIT - 1) // VSPLIT
    for j in tl.static_range(per_part):
        vv = (part * per_part + j) * BV + tl.arange(0, BV)
        sm = km[:, None] & (vv < V)[None, :]
        s, u = _value_block(v_ptr, o_ptr, s_ptr, cv_ptr, cu_ptr, sh, ih, t, vv, t16, wq, qk16, beta, K, V, C, KP, DOTS)
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
    sh, ih, t = _token_head(slot_ptr, pos_ptr, HV)
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


@triton.jit
def _decode_rows_kernel(q_ptr, k_ptr, g_ptr, b_ptr, slot_ptr, pos_ptr, ck_ptr, cg_ptr, cb_ptr, ct_ptr, scr_ptr, HV,
                        K: tl.constexpr, C: tl.constexpr, KP: tl.constexpr, DOTS: tl.constexpr):
    """The key side of row t (`_key_side`, as `_decode_kernel` computes it) into a scratch row [T row t | qk_t | G |
    w_t | q_t exp(G_t)]; the token's k, g, beta and T row appended to the open chunk (the values kernel reads them
    back)."""
    sh, ih, t = _token_head(slot_ptr, pos_ptr, HV)
    rows = tl.arange(0, C)
    kk = tl.arange(0, KP)
    km = kk < K
    _, _, G, t_row, qk_t, w_t, qd_t, k_t, g_t, b_t = _key_side(q_ptr, k_ptr, g_ptr, b_ptr, ck_ptr, cg_ptr, cb_ptr,
                                                               ct_ptr, sh, ih, t, K, C, KP, DOTS)
    scr = scr_ptr + ih * (3 * C + 2 * KP)
    tl.store(scr + rows, t_row)
    tl.store(scr + C + rows, qk_t)
    tl.store(scr + 2 * C + rows, G)
    tl.store(scr + 3 * C + kk, w_t)
    tl.store(scr + 3 * C + KP + kk, qd_t)
    tl.store(ck_ptr + (sh * C + t) * K + kk, k_t, mask=km)
    tl.store(cg_ptr + sh * C + t, g_t)
    tl.store(cb_ptr + sh * C + t, b_t)
    tl.store(ct_ptr + (sh * C + t) * C + rows, t_row)


@triton.jit
def _decode_values_kernel(v_ptr, o_ptr, slot_ptr, pos_ptr, s_ptr, ck_ptr, cv_ptr, cb_ptr, cu_ptr, scr_ptr, HV,
                          K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BV: tl.constexpr, KP: tl.constexpr,
                          DOTS: tl.constexpr):
    """One value block of row t from the rows kernel's scratch row: u_t, o_t, and the block of the next boundary
    state when the chunk closes; the same tiles and products as `_decode_kernel`'s value loop."""
    sh, ih, t = _token_head(slot_ptr, pos_ptr, HV)
    vv = tl.program_id(2) * BV + tl.arange(0, BV)
    rows = tl.arange(0, C)
    kk = tl.arange(0, KP)
    km = kk < K
    sm = km[:, None] & (vv < V)[None, :]
    r16 = tl.arange(0, 16)

    scr = scr_ptr + ih * (3 * C + 2 * KP)
    t16 = as_row16(tl.load(scr + rows))
    qk16 = as_row16(tl.load(scr + C + rows))
    wq = tl.where(r16[:, None] == 0, tl.load(scr + 3 * C + kk)[None, :],
                  tl.where(r16[:, None] == 1, tl.load(scr + 3 * C + KP + kk)[None, :], 0.0))
    beta = tl.load(cb_ptr + sh * C + rows, mask=rows <= t, other=0.0)  # row t: this token's, stored by the rows kernel
    s, u = _value_block(v_ptr, o_ptr, s_ptr, cv_ptr, cu_ptr, sh, ih, t, vv, t16, wq, qk16, beta, K, V, C, KP, DOTS)
    if t == C - 1:  # the chunk is complete: this block of the next boundary state, as the trainer's scan computes it
        G = tl.load(scr + 2 * C + rows)
        G_t = at(G, t, C)
        k = tl.load(ck_ptr + (sh * C + rows)[:, None] * K + kk[None, :], mask=km[None, :], other=0.0)
        kd = k * tl.exp(G_t - G)[:, None]
        s = tl.dot(tl.trans(kd), u, s * tl.exp(G_t), input_precision=DOTS)
        tl.store(s_ptr + (sh * K + kk)[:, None] * V + vv[None, :], s, mask=sm)
