"""`bi_chunk`'s GDN (ours): the trainer keeps the fast chunked forward, and the generator computes every token
as the chunked form computes it, in chunks aligned to 64-token boundaries from the sequence start.

| call      | CPU                                              | CUDA                                              |
|-----------|--------------------------------------------------|---------------------------------------------------|
| train     | naive.chunk_fwd (torch autograd)                 | chunk_triton fwd, autograd.chunk_reference bwd    |
| prefill   | naive.chunk_fwd over [open chunk, new tokens]    | chunk_triton over [open chunk's rows, new tokens] |
|           | from the boundary state                          | from the boundary state                           |
| decode    | the same (the open chunk recomputed per token)   | chunk_triton's fused decode step (appends a row)  |

Why a decode token equals the trainer's bits: row t of a chunk only reads rows <= t, and every product has the
chunk's fixed shape, so the chunk computed with the rows after t missing (zero) gives the same row t
(naive.py; on CUDA every sum is a product whose rows do not depend on the tile, tensor-core tf32 by default,
chunk_triton.py). Cache (fp32 state at the last boundary
plus the open chunk): on CPU the open chunk's per-token inputs (conv outputs, g, beta), recomputed from the
boundary state each call; on CUDA the rows the chunked kernels compute for it (prepared k, v, g, beta, rows of
(I + A)^-1, u), so the decode kernel appends one row without recomputing the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..autograd import backward_through
from ..device import on_gpu
from ..varlen import SeqLayout
from .autograd import chunk_reference
from .base import GDNBackend, GDNHeads, GDNStateView, StateSpec, ssm_spec
from .constants import CHUNK, CHUNK_DOTS, DEFAULT_CHUNK_DOTS
from .naive import chunk_fwd, chunk_output, to_chunks


def _open_chunk_index(r: torch.Tensor, n: torch.Tensor, width: int, zero_row: int) -> torch.Tensor:
    """[B, width] index into [open chunk's rows (CHUNK), the call's new tokens, ..., a zero row] that lays each
    sequence out from its last chunk boundary: its r cached rows, its n new tokens, then zero_row."""
    j = torch.arange(width, device=r.device)[None, :]
    idx = torch.where(j < r[:, None], j, CHUNK + j - r[:, None])
    return torch.where(j < (r + n)[:, None], idx, zero_row)


def _new_rows_index(r: torch.Tensor, num_new: int, width: int) -> torch.Tensor:
    """[B, num_new] rows r .. r + num_new - 1 of that layout (the new tokens' outputs; clamped past the end)."""
    return (r[:, None] + torch.arange(num_new, device=r.device)[None, :]).clamp(max=width - 1)


def chunk_train_triton(q, k, v, g, beta, state, dots: str = DEFAULT_CHUNK_DOTS):
    """chunk_triton's output over whole chunks, differentiable (chunked torch backward)."""
    from .chunk_triton import chunk_fwd_triton  # lazy: CPU machines have no triton

    return backward_through(lambda *a: chunk_fwd_triton(*a, dots=dots)[0], chunk_reference, q, k, v, g, beta, state)


def _cached_torch(mixed, g, beta, heads: GDNHeads, layout: SeqLayout, view: GDNStateView, layer_idx: int):
    """CPU: the new tokens appended to the open chunk's inputs, the chunked form run from the boundary state
    exactly as the trainer's pass over those chunks; the new boundary state and open chunk stored."""
    cache = view.gdn_state(layer_idx)
    b = layout.num_seqs
    r = layout.start_pos % CHUNK  # tokens already in the open chunk
    n = layout.lengths
    width = int((r + n).max())
    width += (-width) % CHUNK
    new = torch.cat([mixed, g, beta], dim=-1)  # one gather for all per-token inputs
    buf = torch.cat([cache["buf_qkv"], cache["buf_g"], cache["buf_beta"]], dim=-1).to(new.dtype)
    src = torch.cat([buf, layout.to_padded(new), new.new_zeros(b, 1, new.shape[-1])], dim=1)
    idx = _open_chunk_index(r, n, width, zero_row=src.shape[1] - 1)
    seq = src.gather(1, idx.unsqueeze(-1).expand(b, width, src.shape[-1]))  # [B, width, C+2HV]
    c, hv = heads.conv_dim, heads.num_v_heads
    q, k, v, gg, bb = heads.prepare(seq[..., :c], seq[..., c : c + hv], seq[..., c + hv :])
    o, states = chunk_fwd(q, k, v, gg, bb, cache["ssm"].float())
    out_idx = _new_rows_index(r, layout.valid.shape[1], width)
    o = o.transpose(1, 2).gather(1, out_idx[..., None, None].expand(-1, -1, hv, heads.v_dim))
    # new boundary state and open chunk
    full = (r + n) // CHUNK
    ssm = states[torch.arange(b, device=full.device), :, full]
    left = (r + n) % CHUNK
    jb = torch.arange(CHUNK, device=new.device)[None, :]
    bidx = torch.where(jb < left[:, None], full[:, None] * CHUNK + jb, width)
    seq_ext = torch.cat([seq, seq.new_zeros(b, 1, seq.shape[-1])], dim=1)
    open_chunk = seq_ext.gather(1, bidx.unsqueeze(-1).expand(b, CHUNK, seq.shape[-1]))
    view.set_gdn_state(layer_idx, {
        "ssm": ssm,
        "buf_qkv": open_chunk[..., :c],
        "buf_g": open_chunk[..., c : c + hv],
        "buf_beta": open_chunk[..., c + hv :],
    })
    return layout.to_packed(o)


def _cached_triton(mixed, g, beta, heads: GDNHeads, layout: SeqLayout, view: GDNStateView, layer_idx: int,
                   dots: str):
    """CUDA: decode-only calls append one row per sequence with the fused kernel (equal to the chunked forward's
    row bit for bit), in place in the cache; other calls run the chunked forward over [cached rows, new tokens]
    from the boundary state and store the new open chunk's rows."""
    from .chunk_triton import chunk_decode_triton, chunk_fwd_triton  # lazy: CPU machines have no triton

    store, slots = view.gdn_slots(layer_idx)
    q, k, v, gg, bb = heads.prepare_packed(mixed, g, beta, layout)
    if layout.decode_only:  # the rows already in each open chunk, as the kernel reads them (once per call)
        r32 = layout.once("open_chunk_rows_i32", lambda: (layout.start_pos % CHUNK).to(torch.int32))
        return chunk_decode_triton(q[:, :, 0], k[:, :, 0], v[:, :, 0], gg[:, :, 0], bb[:, :, 0], slots, r32, store,
                                   dots=dots)
    r = layout.start_pos % CHUNK  # rows already in the open chunk
    b, hv, width_new = q.shape[0], q.shape[1], q.shape[2]
    n = layout.lengths
    # one chunk past the last token (the new open chunk); from the host's start positions and lengths
    width = (max(st % CHUNK + m for st, m in zip(layout.start_host, layout.lengths_host)) // CHUNK + 1) * CHUNK
    idx = _open_chunk_index(r, n, width, zero_row=CHUNK + width_new)

    def place(cached, new):  # [B, HV, C, ...] rows of the open chunk + [B, HV, L, ...] new -> [B, HV, width, ...]
        zero = new.new_zeros(new.shape[:2] + (1,) + new.shape[3:])
        src = torch.cat([cached, new, zero], dim=2)
        ix = idx[:, None, :].expand(b, hv, width)
        if src.dim() == 4:
            ix = ix[..., None].expand(b, hv, width, src.shape[-1])
        return src.gather(2, ix)

    cached = {name: store[name][slots] for name in ("ck", "cv", "cg", "cb")}
    ks, vs = place(cached["ck"], k), place(cached["cv"], v)
    gs, bs = place(cached["cg"], gg), place(cached["cb"], bb)
    qs = place(torch.zeros_like(cached["ck"]), q)  # earlier rows' outputs are not recomputed: q = 0 there
    o, states, tm, u = chunk_fwd_triton(qs, ks, vs, gs, bs, store["ssm"][slots], return_rows=True, dots=dots)
    out_idx = _new_rows_index(r, width_new, width)
    o = o.gather(2, out_idx[:, None, :, None].expand(b, hv, width_new, o.shape[-1]))
    full = (r + n) // CHUNK  # index of the new open chunk
    ar = torch.arange(b, device=q.device)

    def chunk_rows(x):  # [B, HV, width, ...] -> rows of chunk `full` [B, HV, C, ...]
        return x.unflatten(2, (width // CHUNK, CHUNK))[ar, :, full]

    view.set_gdn_state(layer_idx, {
        "ssm": states[ar, :, full],
        "ck": chunk_rows(ks), "cv": chunk_rows(vs), "cg": chunk_rows(gs), "cb": chunk_rows(bs),
        "ct": tm[ar, :, full], "cu": chunk_rows(u),
    })
    return layout.to_packed(o.transpose(1, 2))


@dataclass(frozen=True)
class AlignedChunkGDN(GDNBackend):
    name = "aligned_chunk"
    dots: str = DEFAULT_CHUNK_DOTS  # the CUDA kernels' products, one of CHUNK_DOTS (trainer and generator alike)

    def __post_init__(self):
        if self.dots not in CHUNK_DOTS:
            raise ValueError(f"chunk_dots must be one of {CHUNK_DOTS}, got {self.dots!r}")

    def cache_spec(self, heads: GDNHeads, device, dtype: torch.dtype) -> StateSpec:
        hv, dk, dv = heads.num_v_heads, heads.k_dim, heads.v_dim
        if on_gpu(device):  # the open chunk's rows as the chunked kernels compute them (fp32)
            f32 = torch.float32
            rows = {"ck": (hv, CHUNK, dk), "cv": (hv, CHUNK, dv), "cg": (hv, CHUNK), "cb": (hv, CHUNK),
                    "ct": (hv, CHUNK, CHUNK), "cu": (hv, CHUNK, dv)}
            return {**ssm_spec(heads), **{name: (shape, f32) for name, shape in rows.items()}}
        # the open chunk's per-token inputs: conv outputs (activation dtype), g and beta (fp32)
        return {**ssm_spec(heads), "buf_qkv": ((CHUNK, heads.conv_dim), dtype),
                "buf_g": ((CHUNK, hv), torch.float32), "buf_beta": ((CHUNK, hv), torch.float32)}

    def train(self, mixed, g, beta, heads: GDNHeads, layout: SeqLayout) -> torch.Tensor:
        q, k, v, gg, bb = heads.prepare_packed(mixed, g, beta, layout)
        state = q.new_zeros(layout.num_seqs, heads.num_v_heads, heads.k_dim, heads.v_dim)
        if on_gpu(mixed):
            o = chunk_train_triton(*to_chunks(q, k, v, gg, bb), state, dots=self.dots)[:, :, : q.shape[2]]
        else:
            o = chunk_output(q, k, v, gg, bb, state)
        return layout.to_packed(o.transpose(1, 2))

    def cached(self, mixed, g, beta, heads: GDNHeads, layout: SeqLayout, view: GDNStateView, layer_idx: int) -> torch.Tensor:
        if on_gpu(mixed):
            return _cached_triton(mixed, g, beta, heads, layout, view, layer_idx, self.dots)
        return _cached_torch(mixed, g, beta, heads, layout, view, layer_idx)
