"""Causal GQA attention: `sdpa_attention` (stock) and `invariant_attention` (bi modes), whose bits for a query
depend on its position alone, so the trainer's pass and the generator's prefill and decode agree.

- reference.py      the torch forms: blocked_attention (the invariant form on the CPU), sdpa_attention
- flash_triton.py   the invariant form on CUDA: one kernel, any tile (imported lazily: CPU machines have no triton)
"""

from __future__ import annotations

import torch

from ..device import on_gpu
from ..linear import bmm
from .reference import BLOCK, TILE, blocked_attention, sdpa_attention


def invariant_attention(q, k, v, q_pos, scale, causal: bool = False) -> torch.Tensor:
    """The bi modes' attention (shapes and `causal` as reference.py): CUDA runs flash_triton.attention
    (differentiable through SDPA), the CPU blocked_attention over the invariant bmm."""
    if on_gpu(q):
        from .flash_triton import attention  # lazy: CPU machines have no triton

        return attention(q, k, v, q_pos, scale, causal)
    return blocked_attention(q, k, v, q_pos, scale, matmul=bmm)


__all__ = ["BLOCK", "TILE", "blocked_attention", "invariant_attention", "sdpa_attention"]
