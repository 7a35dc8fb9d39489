"""`bi`'s GDN (the published method): the recurrent form on every forward, the chunked form only in backward.

| call                      | CPU                                        | CUDA                                        |
|---------------------------|--------------------------------------------|---------------------------------------------|
| train                     | naive.recurrent_fwd, chunked backward      | recurrent_triton, chunked backward          |
| cached (prefill, decode)  | naive.recurrent_fwd from the gathered ssm  | recurrent_triton on the cache's ssm slots,  |
|                           |                                            | in place                                    |

Trainer and generator run the same step arithmetic on each device (one function on CPU, one compiled kernel
variant on CUDA), so a token's output is the same bits whichever call computes it. Cache: the fp32 ssm state.
`recurrent_cached` also serves `stock`'s decode-only calls (chunk.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..autograd import backward_through
from ..device import on_gpu
from ..varlen import SeqLayout, padded_index, to_padded
from .autograd import chunk_reference
from .base import GDNBackend, GDNHeads, GDNStateView
from .constants import CHUNK
from .naive import prepare_qk, recurrent_fwd


def _recurrent_output(q, k, v, g, beta, state):
    return recurrent_fwd(q, k, v, g, beta, state)[0]


def recurrent_train(q, k, v, g, beta, state):
    """Inputs as naive.recurrent_fwd (kernel layout). Differentiable: recurrent forward, chunked backward."""
    return backward_through(_recurrent_output, chunk_reference, q, k, v, g, beta, state)


def chunk_reference_packed(q, k, v, g, beta, cu_seqlens: list[int]):
    """The chunked torch form over packed raw inputs (q, k [N, H, K], v [N, HV, V], g, beta [N, HV]), every
    sequence from a zero state -> o [N, HV, V] fp32. Differentiable: the Triton trainer forward's backward."""
    index, valid = padded_index(cu_seqlens, q.device, CHUNK)
    hv = v.shape[1]
    qp, kp = prepare_qk(to_padded(q, index), to_padded(k, index), hv)
    vp, gp, bp = (to_padded(x, index).float().transpose(1, 2).contiguous() for x in (v, g, beta))
    state = qp.new_zeros(len(cu_seqlens) - 1, hv, qp.shape[-1], vp.shape[-1])
    return chunk_reference(qp, kp, vp, gp, bp, state).transpose(1, 2)[valid]


def recurrent_train_triton(q, k, v, g, beta, cu_seqlens: list[int]):
    """The trainer's CUDA forward: packed raw q, k [N, H, K], v [N, HV, V], g, beta [N, HV]; every sequence starts
    from a zero state. Returns o [N, HV, V] fp32. Differentiable (chunked backward)."""
    from .recurrent_triton import recurrent_fwd_triton  # lazy: CPU machines have no triton

    cu = torch.tensor(cu_seqlens, device=q.device, dtype=torch.int32)
    b = len(cu_seqlens) - 1

    def forward(q, k, v, g, beta):
        state = torch.zeros(b, v.shape[1], q.shape[2], v.shape[2], device=q.device, dtype=torch.float32)
        return recurrent_fwd_triton(q, k, v, g, beta, cu, state)

    def reference(q, k, v, g, beta):
        return chunk_reference_packed(q, k, v, g, beta, cu_seqlens)

    return backward_through(forward, reference, q, k, v, g, beta)


def recurrent_cached(mixed, g, beta, heads: GDNHeads, layout: SeqLayout, view: GDNStateView, layer_idx: int):
    """The recurrent form from each sequence's cached ssm state, the state updated (prefill or decode alike)."""
    if on_gpu(mixed):
        from .recurrent_triton import recurrent_fwd_triton  # lazy: CPU machines have no triton

        # the trainer's kernel, reading and writing the state in place in the cache's [slots, HV, K, V] tensor
        storage, slots = view.gdn_slots(layer_idx)
        return recurrent_fwd_triton(*heads.split(mixed), g, beta, layout.cu_device, storage["ssm"], slots)
    ssm = view.gdn_state(layer_idx)["ssm"]
    q, k, v, gg, bb = heads.prepare_packed(mixed, g, beta, layout)
    o, state = recurrent_fwd(q, k, v, gg, bb, ssm.float(), layout.lengths)
    view.set_gdn_state(layer_idx, {"ssm": state})
    return layout.to_packed(o.transpose(1, 2))


@dataclass(frozen=True)
class RecurrentGDN(GDNBackend):
    name = "recurrent"

    def train(self, mixed, g, beta, heads: GDNHeads, layout: SeqLayout) -> torch.Tensor:
        if on_gpu(mixed):
            return recurrent_train_triton(*heads.split(mixed), g, beta, layout.cu_seqlens)
        q, k, v, gg, bb = heads.prepare_packed(mixed, g, beta, layout)
        state = q.new_zeros(layout.num_seqs, heads.num_v_heads, heads.k_dim, heads.v_dim)
        if torch.is_grad_enabled():
            o = recurrent_train(q, k, v, gg, bb, state)
        else:
            o = recurrent_fwd(q, k, v, gg, bb, state)[0]
        return layout.to_packed(o.transpose(1, 2))

    def cached(self, mixed, g, beta, heads: GDNHeads, layout: SeqLayout, view: GDNStateView, layer_idx: int) -> torch.Tensor:
        return recurrent_cached(mixed, g, beta, heads, layout, view, layer_idx)
