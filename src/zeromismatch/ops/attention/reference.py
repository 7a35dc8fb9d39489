"""Causal GQA attention over per-sequence padded batches, in two forms.

Both take queries q [B, Hq, Tq, D] at absolute positions q_pos [B, Tq] (-1 = padding) and each sequence's
whole context k, v [B, Hkv, Tk, D]; query p attends to keys 0..p.

- `blocked_attention` (bi modes): the arithmetic for a query at position p is fixed by p alone. Its scores
  are computed inside a 64-row query block (the query sits in row p % 64, as in the trainer's full pass)
  against exactly L = 64 * (p // 64 + 1) keys, keys > p masked, softmax over L, then P @ V. The trainer's
  full-sequence pass and the generator's one-token decode step therefore run the same batched matmuls of the
  same shapes with the same row contents, and agree bit for bit (tests/ops/test_attention.py).
- `sdpa_attention` (stock): torch SDPA with a causal mask over whatever shape the caller has; fast, but the
  trainer's and the generator's calls have different shapes and need not agree.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BLOCK = 64


def _expand_kv(x: torch.Tensor, hq: int) -> torch.Tensor:
    rep = hq // x.shape[1]
    return x.repeat_interleave(rep, dim=1) if rep > 1 else x


def blocked_attention(q, k, v, q_pos, scale, softmax=torch.softmax, matmul=torch.matmul):
    """matmul: torch.matmul on CPU; the GPU passes kernels.bmm.bmm (batch-count invariant)."""
    b, hq, tq, d = q.shape
    k, v = _expand_kv(k, hq), _expand_kv(v, hq)
    tk = k.shape[2]
    out = torch.zeros_like(q)
    valid = q_pos >= 0
    qblock = torch.where(valid, q_pos // BLOCK, torch.full_like(q_pos, -1))
    for qb in torch.unique(qblock[valid]).tolist():
        length = BLOCK * (qb + 1)
        sel = qblock == qb  # [B, Tq]
        seqs = sel.any(dim=1).nonzero().flatten()
        bi, ti = sel.nonzero(as_tuple=True)  # queries of this block
        slot = torch.searchsorted(seqs, bi)  # row of the group each query goes to
        rows = q_pos[bi, ti] % BLOCK
        qblk = q.new_zeros(len(seqs), hq, BLOCK, d)
        qblk[slot, :, rows] = q[bi, :, ti]
        kk, vv = k[seqs, :, : min(length, tk)], v[seqs, :, : min(length, tk)]
        if tk < length:
            kk, vv = F.pad(kk, (0, 0, 0, length - tk)), F.pad(vv, (0, 0, 0, length - tk))
        scores = matmul(qblk, kk.transpose(-1, -2)) * scale  # [n, Hq, 64, L]
        key_pos = torch.arange(length, device=q.device)
        row_pos = qb * BLOCK + torch.arange(BLOCK, device=q.device)
        scores = scores.masked_fill(key_pos[None, :] > row_pos[:, None], float("-inf"))
        o = matmul(softmax(scores, dim=-1), vv)
        out[bi, :, ti] = o[slot, :, rows]
    return out


def sdpa_attention(q, k, v, q_pos, scale):
    hq = q.shape[1]
    k, v = _expand_kv(k, hq), _expand_kv(v, hq)
    key_pos = torch.arange(k.shape[2], device=q.device)
    mask = key_pos[None, None, :] <= q_pos[:, :, None]  # [B, Tq, Tk]
    mask = mask | (q_pos[:, :, None] < 0)  # padded queries: attend anywhere, avoid NaN rows
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], scale=scale)
