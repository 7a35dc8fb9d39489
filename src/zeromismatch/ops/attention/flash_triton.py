"""The bi modes' attention on CUDA: one Triton kernel for the trainer's full pass, the generator's prefill and its
decode step, in which a query's arithmetic is fixed by its position alone.

A program takes a tile of query rows (QT positions x the REP query heads that share one KV head, padded to a
power of two >= 16) and runs an online softmax over 64-key blocks 0, 1, ..., in order:
  s = (q . k) * scale, keys past the row's position -inf;  m' = max(m, max s);  p = exp(s - m') in V's dtype;
  l = l exp(m - m') + p . 1;  acc = acc exp(m - m') + p . V;  o = acc / l.

Why a row's bits do not depend on the tile it sits in (so decode == trainer):
- every sum is a tensor-core `tl.dot` (q.k over the head dim, p.V and the row sum p.1 over the 64 keys): on the
  H200 its per-row result is the same for every tile height (16 / 64 / 128, mma.sync or wgmma), width, K split
  and warp count, and equal whatever the other rows hold (tests/gpu/test_gpu_attention.py checks it each run);
- the row max is exact in any order; everything else is elementwise (fp fusion off: rounded as written);
- a tile processes blocks up to its last row's position; for an earlier row the extra blocks are all -inf:
  m' = m, exp(0) = 1, p = 0, so l and acc are unchanged bit for bit (0 . V adds exact zeros). The generator's
  one-query tile processes exactly its own blocks; a CUDA-graph bucket's wider key range is never read.
Keys past the tile's last position are loaded as zeros (the generator's cache may hold anything there); the
trainer's rows see real keys there, multiplied by p = 0: the same zero products.

fp32 inputs use input_precision="ieee" (fp32 FMA chains, config-independent by construction), as the fp32 GEMM.
Not differentiable by itself: `attention` trains through torch SDPA recomputed in the backward
(ops.autograd.backward_through; the backward needs no invariance).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from ..autograd import backward_through
from ..device import configure_cuda
from ..triton_math import EXACT  # no compiler-chosen multiply-add contraction: the same ops in every config
from .reference import BLOCK, sdpa_attention


# launch settings (rows per tile, warps, pipeline stages); tests/gpu checks every one gives the same bits
PREFILL = dict(rows=128, num_warps=8, num_stages=2)  # H100, 16 / 4 heads x 256: 0.51 ms vs 64 rows 0.74 (4 warps)
DECODE = dict(num_warps=4, num_stages=2)


@triton.jit(do_not_specialize=["Tq", "Tk"])
def _attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, pos_ptr, scale, Tq, Tk, HKV,
                      sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot, spb,
                      D: tl.constexpr, DP: tl.constexpr, REP: tl.constexpr, QT: tl.constexpr, BM: tl.constexpr,
                      BN: tl.constexpr, PREC: tl.constexpr):
    tile = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // HKV).to(tl.int64)
    hk = bh % HKV
    r = tl.arange(0, BM)
    qi = tile * QT + r // REP  # query index of each row
    hq = hk * REP + r % REP  # its query head
    row_ok = (r < QT * REP) & (qi < Tq)
    p = tl.load(pos_ptr + b * spb + qi, mask=row_ok, other=-1)
    live = row_ok & (p >= 0)
    p = tl.where(live, p, 0)  # padding rows attend key 0 (finite) and are stored as zeros
    p_last = tl.max(p, axis=0)
    d = tl.arange(0, DP)
    dm = d < D
    q = tl.load(q_ptr + b * sqb + hq[:, None] * sqh + qi[:, None] * sqt + d[None, :],
                mask=row_ok[:, None] & dm[None, :], other=0.0)
    ones = tl.full((BN, 16), 1.0, tl.float32).to(v_ptr.dtype.element_ty)
    c16 = tl.arange(0, 16)
    m = tl.full((BM,), float("-inf"), tl.float32)
    l = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, DP), tl.float32)
    for j in range(0, p_last // BN + 1):
        key = j * BN + tl.arange(0, BN)
        kmask = ((key <= p_last) & (key < Tk))[:, None] & dm[None, :]
        k = tl.load(k_ptr + b * skb + hk * skh + key[:, None] * skt + d[None, :], mask=kmask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
        s = tl.where(key[None, :] <= p[:, None], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        pr = tl.exp(s - m_new[:, None]).to(v_ptr.dtype.element_ty)
        v = tl.load(v_ptr + b * svb + hk * svh + key[:, None] * svt + d[None, :], mask=kmask, other=0.0)
        row_sum = tl.sum(tl.where(c16[None, :] == 0, tl.dot(pr, ones, input_precision=PREC), 0.0), axis=1)
        l = l * alpha + row_sum
        acc = tl.dot(pr, v, acc * alpha[:, None], input_precision=PREC)
        m = m_new
    o = tl.where(live[:, None], acc / l[:, None], 0.0)
    tl.store(o_ptr + b * sob + hq[:, None] * soh + qi[:, None] * sot + d[None, :], o.to(o_ptr.dtype.element_ty),
             mask=row_ok[:, None] & dm[None, :])


def _rows(qt: int, rep: int) -> int:
    return max(16, triton.next_power_of_2(qt * rep))


_FITS: dict[tuple, tuple[int, int]] = {}  # (dtype, head dim, rep, decode, rows, stages, warps) -> (rows, stages)


def _settings(rows: int, stages: int):
    """The asked setting first, then smaller tiles and fewer stages (fp32 at head dim 256 needs twice the shared
    memory of bf16): any setting gives the same bits, so falling back changes no value."""
    for r in sorted({rows, *(x for x in (64, 32, 16) if x < rows)}, reverse=True):
        for st in sorted({stages, 1}, reverse=True):
            yield r, st


def attention_fwd(q, k, v, q_pos, scale: float, rows: int | None = None, num_warps: int | None = None,
                  num_stages: int | None = None) -> torch.Tensor:
    """q [B, Hq, Tq, D] at positions q_pos [B, Tq] (-1 = padding, output 0), k, v [B, Hkv, Tk, D] (every key a
    query can see, at its position). Returns o [B, Hq, Tq, D] (a view of a [B, Tq, Hq, D] tensor). rows,
    num_warps, num_stages override the launch settings (any value gives the same bits); a setting whose tiles do
    not fit the shared memory falls back to smaller ones (_settings)."""
    configure_cuda()
    b, hq, tq, dh = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    rep = hq // hkv
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    q_pos = q_pos.contiguous()
    cfg = dict(DECODE if tq == 1 else PREFILL)
    want = (rows or cfg.get("rows", 16), num_stages or cfg["num_stages"])
    o = torch.empty(b, tq, hq, dh, device=q.device, dtype=q.dtype)
    if not b * hq * tq:
        return o.transpose(1, 2)
    warps = num_warps or cfg["num_warps"]
    key = (q.dtype, dh, rep, tq == 1, *want, warps)
    for n_rows, stages in [_FITS[key]] if key in _FITS else _settings(*want):
        qt = max(1, n_rows // rep) if tq > 1 else 1
        try:
            _attention_kernel[(triton.cdiv(tq, qt), b * hkv)](
                q, k, v, o, q_pos, float(scale), tq, tk, hkv, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
                o.stride(0), o.stride(2), o.stride(1), q_pos.stride(0),
                D=dh, DP=max(16, triton.next_power_of_2(dh)), REP=rep, QT=qt, BM=_rows(qt, rep), BN=BLOCK,
                PREC="ieee" if q.dtype == torch.float32 else "tf32",
                num_warps=warps, num_stages=stages, **EXACT)
        except OutOfResources:
            continue
        _FITS[key] = (n_rows, stages)
        return o.transpose(1, 2)
    raise OutOfResources(0, 0, f"shared memory: no attention tile fits head dim {dh} in {q.dtype}")


def attention(q, k, v, q_pos, scale: float, causal: bool = False) -> torch.Tensor:
    """attention_fwd, differentiable through torch SDPA (reference.sdpa_attention, with `causal`) recomputed in
    the backward. `causal` changes only the backward's SDPA call (the forward reads the positions)."""
    return backward_through(lambda q_, k_, v_, p_: attention_fwd(q_, k_, v_, p_, scale),
                            lambda q_, k_, v_, p_: sdpa_attention(q_, k_, v_, p_, scale, causal), q, k, v, q_pos)
