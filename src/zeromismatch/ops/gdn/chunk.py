"""`stock`'s GDN: the chunked form in plain torch wherever a call's tokens arrive together, the recurrent step
for decode rows, as the usual trainer / generator split runs it.

| call                          | CPU and CUDA                                                           |
|-------------------------------|------------------------------------------------------------------------|
| train                         | autograd.chunk_reference (torch autograd; its scan in Triton if on)    |
| cached, decode rows only      | recurrent.recurrent_cached (torch on CPU, recurrent_triton on CUDA)    |
| cached, with prefill pieces   | naive.chunk_fwd from the carried ssm; its decode rows naive.recurrent_fwd |

The two forms agree to fp32 rounding, not bit for bit, and torch picks CUDA kernels by shape: this is the
baseline whose trainer / generator mismatch the invariant modes remove. Cache: the fp32 ssm state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..varlen import SeqLayout
from .autograd import chunk_reference
from .base import GDNBackend, GDNHeads, GDNStateView
from .naive import chunk_final_states, chunk_fwd, recurrent_fwd, to_chunks
from .recurrent import recurrent_cached


@dataclass(frozen=True)
class ChunkGDN(GDNBackend):
    name = "chunk"

    def train(self, mixed, g, beta, heads: GDNHeads, layout: SeqLayout) -> torch.Tensor:
        q, k, v, gg, bb = heads.prepare_packed(mixed, g, beta, layout)
        state = q.new_zeros(layout.num_seqs, heads.num_v_heads, heads.k_dim, heads.v_dim)
        return layout.to_packed(chunk_reference(q, k, v, gg, bb, state).transpose(1, 2))

    def cached(self, mixed, g, beta, heads: GDNHeads, layout: SeqLayout, view: GDNStateView, layer_idx: int) -> torch.Tensor:
        if layout.decode_only:
            return recurrent_cached(mixed, g, beta, heads, layout, view, layer_idx)
        ssm0 = view.gdn_state(layer_idx)["ssm"]
        q, k, v, gg, bb = heads.prepare_packed(mixed, g, beta, layout)
        t = q.shape[2]
        padded = to_chunks(q, k, v, gg, bb)
        o, states = chunk_fwd(*padded, ssm0.float())
        o, ssm = o[:, :, :t], chunk_final_states(*padded, states, layout.lengths)
        decode_rows = [i for i, n in enumerate(layout.lengths_host) if n == 1]  # host fact: no device read
        if decode_rows:
            # a decode row's one token is its first: the recurrent step runs over that token alone (the padded
            # positions after it are inert zeros: the same values as a run over all T, T times faster)
            decode = torch.tensor(decode_rows).to(q.device, non_blocking=True)
            o_r, s_r = recurrent_fwd(*(x[decode][:, :, :1] for x in (q, k, v, gg, bb)), ssm0[decode].float())
            o[decode, :, :1], ssm[decode] = o_r, s_r
        view.set_gdn_state(layer_idx, {"ssm": ssm})
        return layout.to_packed(o.transpose(1, 2))
