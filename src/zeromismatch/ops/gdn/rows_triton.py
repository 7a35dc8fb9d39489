"""Row arithmetic shared by the chunked GDN forward (chunk_triton.py) and the decode step (decode_triton.py):
the decode step reproduces a trainer row bit for bit by running the same helpers on the same operands."""

import triton
import triton.language as tl


@triton.jit
def as_row16(x):
    """[N] -> [16, N] with x in row 0 and zeros below (the smallest M tl.dot takes)."""
    r16 = tl.arange(0, 16)
    return tl.where(r16[:, None] == 0, x[None, :], 0.0)


@triton.jit
def row(m, i, M: tl.constexpr):
    """Row i of an [M, N] register tile (exact: one non-zero term per sum)."""
    rows = tl.arange(0, M)
    return tl.sum(tl.where(rows[:, None] == i, m, 0.0), axis=0)


@triton.jit
def at(x, i, N: tl.constexpr):
    """x[i] of an [N] register vector (exact)."""
    return tl.sum(tl.where(tl.arange(0, N) == i, x, 0.0), axis=0)


@triton.jit
def cum_log_decay(g, C: tl.constexpr):
    """G[t] = g[0] + ... + g[t], as the FMA chain of lower-ones @ g (rows past the last token add exact zeros)."""
    rows = tl.arange(0, C)
    lower = (rows[None, :] <= rows[:, None]).to(tl.float32)
    gm = tl.dot(lower, tl.broadcast_to(g[:, None], (C, 16)), input_precision="ieee")
    c16 = tl.arange(0, 16)
    return tl.sum(tl.where(c16[None, :] == 0, gm, 0.0), axis=1)


@triton.jit
def tri_row(a, tm, DOTS: tl.constexpr):
    """Row i of T = (I + A)^-1 from A's row i (zero at and past i) and T's rows < i (zero rows past them):
    -(a @ T), the diagonal set to 1 by the caller."""
    return -row(tl.dot(as_row16(a), tm, input_precision=DOTS), 0, 16)
