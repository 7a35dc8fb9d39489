"""Causal GQA attention over per-sequence padded batches: the torch forms.

Both take queries q [B, Hq, Tq, D] at absolute positions q_pos [B, Tq] (-1 = padding) and each sequence's
whole context k, v [B, Hkv, Tk, D]; query p attends to keys 0..p. `causal` is a host fact a caller may give:
q_pos[b] is 0, 1, ... then padding and Tq == Tk (the trainer's pass), so the mask follows from indices alone.

- `blocked_attention` (bi modes on the CPU): the arithmetic for a query at position p is fixed by p alone. Its
  scores are computed in a 16-row query tile (the query sits in row p % 16, as in the trainer's full pass)
  against exactly L = 64 * (p // 64 + 1) keys, keys > p masked, softmax over L, then P @ V. The trainer's
  full-sequence pass and the generator's one-token decode step therefore run batched matmuls of the same
  shapes with the same row contents, and agree bit for bit (tests/ops/test_attention.py). On CUDA the bi modes
  run flash_triton.py instead (one kernel, a row's arithmetic fixed by its position; ops.attention picks).
- `sdpa_attention` (stock, and the backward of the CUDA kernel): torch SDPA with a causal mask over whatever
  shape the caller has; fast, but the trainer's and the generator's calls have different shapes and need not
  agree.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BLOCK = 64  # key block: a query at p reads 64 * (p // 64 + 1) keys
TILE = 16  # query rows per matmul


def blocked_attention(q, k, v, q_pos, scale, matmul=torch.matmul):
    """matmul: the batched matmul (the bi modes pass ops.linear.bmm)."""
    b, hq, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    rep = hq // hkv
    out = torch.zeros_like(q)
    valid = q_pos >= 0
    bi, ti = valid.nonzero(as_tuple=True)
    pos = q_pos[bi, ti]
    tile_id = bi * (1 << 40) + pos // TILE  # one tile per (sequence, 16-row group)
    for qb in torch.unique(pos // BLOCK).tolist():
        length = BLOCK * (qb + 1)
        sel = (pos // BLOCK) == qb
        tiles, slot = torch.unique(tile_id[sel], return_inverse=True)
        seq_of_tile = tiles // (1 << 40)
        rows = pos[sel] % TILE
        # queries of the `rep` heads sharing a KV head stacked as rows: [n, Hkv, rep * 16, D] @ [n, Hkv, D, L]
        qt = q.new_zeros(len(tiles), hkv, rep, TILE, d)
        qt[slot, :, :, rows] = q[bi[sel], :, ti[sel]].view(-1, hkv, rep, d)
        if len(tiles) == b and bool((seq_of_tile == torch.arange(b, device=q.device)).all()):
            kk, vv = k[:, :, : min(length, tk)], v[:, :, : min(length, tk)]  # decode: one tile per sequence
        else:
            kk, vv = k[seq_of_tile, :, : min(length, tk)], v[seq_of_tile, :, : min(length, tk)]
        if tk < length:
            kk, vv = F.pad(kk, (0, 0, 0, length - tk)), F.pad(vv, (0, 0, 0, length - tk))
        scores = matmul(qt.view(-1, hkv, rep * TILE, d), kk.transpose(-1, -2)) * scale  # [n, Hkv, rep*16, L]
        row_pos = (tiles % (1 << 40))[:, None] * TILE + torch.arange(TILE, device=q.device)[None, :]
        key_pos = torch.arange(length, device=q.device)
        mask = (key_pos[None, None, :] > row_pos[:, :, None]).repeat(1, rep, 1)  # [n, rep*16, L]
        scores = scores.masked_fill(mask[:, None], float("-inf"))
        o = matmul(torch.softmax(scores, dim=-1), vv).view(-1, hkv, rep, TILE, d)
        out[bi[sel], :, ti[sel]] = o[slot, :, :, rows].reshape(-1, hq, d)
    return out


def sdpa_attention(q, k, v, q_pos, scale, causal: bool = False):
    """causal: SDPA's own causal mask (its flash backend; queries past a sequence's end see padding keys, their
    outputs unused); else a mask from the positions, the `rep` query heads that share a KV head stacked as rows of
    one [rep * Tq, D] query so K and V are read as they are (expanding them to every query head would copy the
    whole context once per step: at 64 decode sequences, most of a step's attention time)."""
    if causal:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    b, hq, tq, d = q.shape
    hkv = k.shape[1]
    rep = hq // hkv
    key_pos = torch.arange(k.shape[2], device=q.device)
    mask = key_pos[None, None, :] <= q_pos[:, :, None]  # [B, Tq, Tk]
    mask = mask | (q_pos[:, :, None] < 0)  # padded queries: attend anywhere, avoid NaN rows
    qf = q.reshape(b, hkv, rep * tq, d)  # query head h reads KV head h // rep (repeat_interleave's order)
    o = F.scaled_dot_product_attention(qf, k, v, attn_mask=mask.repeat(1, rep, 1)[:, None], scale=scale)
    return o.reshape(b, hq, tq, d)  # SDPA's fp32 backends may return a transposed layout: a copy then
