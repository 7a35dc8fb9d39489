"""Causal GQA attention over per-sequence padded batches, in two forms.

Both take queries q [B, Hq, Tq, D] at absolute positions q_pos [B, Tq] (-1 = padding) and each sequence's
whole context k, v [B, Hkv, Tk, D]; query p attends to keys 0..p.

- `blocked_attention` (bi modes): the arithmetic for a query at position p is fixed by p alone. Its scores
  are computed in a 16-row query tile (the query sits in row p % 16, as in the trainer's full pass) against
  exactly L = 64 * (p // 64 + 1) keys, keys > p masked, softmax over L, then P @ V. The trainer's
  full-sequence pass and the generator's one-token decode step therefore run batched matmuls of the same
  shapes with the same row contents, and agree bit for bit (tests/ops/test_attention.py). The tile is 16
  rows, not 64, so a decode step wastes 16x, not 64x, of its attention work. On CUDA the softmax is
  `key_block_softmax` (softmax_triton.py: -inf key blocks add exact zeros), so a decode step may read any whole
  number of key blocks >= L (the generator's block-table width, a CUDA-graph bucket) with the same bits; the
  decode path (`single_query`) reads nothing back from the device.
- `sdpa_attention` (stock): torch SDPA with a causal mask over whatever shape the caller has; fast, but the
  trainer's and the generator's calls have different shapes and need not agree.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..device import on_gpu

BLOCK = 64  # key block: a query at p reads 64 * (p // 64 + 1) keys
TILE = 16  # query rows per matmul


def _expand_kv(x: torch.Tensor, hq: int) -> torch.Tensor:
    rep = hq // x.shape[1]
    return x.repeat_interleave(rep, dim=1) if rep > 1 else x


def key_block_softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim (a multiple of BLOCK) whose bits do not change when whole BLOCKs of -inf are
    appended: on CUDA a Triton kernel sums 64-key blocks in order (an all -inf block adds exact zeros), so a
    decode step may read more keys than its query's L (a CUDA-graph bucket) and still equal the trainer. On CPU
    torch.softmax, as before (the CPU decode reads exactly L keys)."""
    if on_gpu(x):
        from .softmax_triton import key_block_softmax as softmax_triton  # lazy: CPU machines have no triton

        return softmax_triton(x, BLOCK)
    return torch.softmax(x, dim=-1)


def _decode_attention(q, k, v, q_pos, scale, softmax, matmul):
    """One query per sequence: one 16-row tile per sequence, the query in row p % 16, against all Tk keys given
    (keys > p masked; Tk >= L for every row). Index arithmetic only: no device value is read on the host."""
    b, hq, _, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    rep = hq // hkv
    pos = q_pos[:, 0]
    rows = pos % TILE
    ar = torch.arange(b, device=q.device)
    qt = q.new_zeros(b, hkv, rep, TILE, d)
    qt[ar, :, :, rows] = q[:, :, 0].reshape(b, hkv, rep, d)
    scores = matmul(qt.view(b, hkv, rep * TILE, d), k.transpose(-1, -2)) * scale  # [B, Hkv, rep*16, Tk]
    row_pos = (pos // TILE * TILE)[:, None] + torch.arange(TILE, device=q.device)[None, :]
    key_pos = torch.arange(tk, device=q.device)
    mask = (key_pos[None, None, :] > row_pos[:, :, None]).repeat(1, rep, 1)
    scores = scores.masked_fill(mask[:, None], float("-inf"))
    o = matmul(softmax(scores), v).view(b, hkv, rep, TILE, d)
    return o[ar, :, :, rows].reshape(b, hq, 1, d)


def blocked_attention(q, k, v, q_pos, scale, softmax=None, matmul=torch.matmul, single_query: bool = False):
    """matmul: the batched matmul (the bi modes pass ops.linear.bmm: batch-count-invariant on CUDA too).
    softmax: over the last dim (default key_block_softmax). single_query: every sequence has one query (a
    decode step; host fact), taken by a path without host reads when the softmax ignores -inf key blocks."""
    b, hq, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    rep = hq // hkv
    if softmax is None:
        softmax = key_block_softmax
        if single_query and tq == 1 and tk % BLOCK == 0 and on_gpu(q):
            return _decode_attention(q, k, v, q_pos, scale, softmax, matmul)
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
        o = matmul(softmax(scores), vv).view(-1, hkv, rep, TILE, d)
        out[bi[sel], :, ti[sel]] = o[slot, :, :, rows].reshape(-1, hq, d)
    return out


def sdpa_attention(q, k, v, q_pos, scale, single_query: bool = False):
    hq = q.shape[1]
    k, v = _expand_kv(k, hq), _expand_kv(v, hq)
    key_pos = torch.arange(k.shape[2], device=q.device)
    mask = key_pos[None, None, :] <= q_pos[:, :, None]  # [B, Tq, Tk]
    mask = mask | (q_pos[:, :, None] < 0)  # padded queries: attend anywhere, avoid NaN rows
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], scale=scale)
