"""Numerics modes: each is one coherent set of choices for trainer AND generator.

| mode     | GDN trainer fwd / bwd     | GDN generator prefill / decode           | linear, acts, attention   |
|----------|---------------------------|------------------------------------------|---------------------------|
| stock    | chunked / chunked         | chunked / recurrent step                 | plain torch, SDPA         |
| bi       | recurrent / chunked (op)  | recurrent / recurrent step               | batch-invariant, blocked  |
| bi_chunk | chunked / chunked         | chunked, aligned to 64-token boundaries  | batch-invariant, blocked  |
|          |                           | from the sequence start; decode = the    |                           |
|          |                           | chunked form's row t (see below)         |                           |

`bi` is the published method. `bi_chunk` is ours: the trainer keeps the chunked forward and the generator
decodes chunk-consistently. Decode on CPU recomputes the open chunk from the boundary state each token; on
CUDA one fused kernel appends a row to the open chunk (kernels/gdn_chunk.py: the trainer's chunked kernels
and the decode step share one arithmetic, so row t is the same bits). Measured cost (README, results/): on
the CPU the trainer pays the same as `bi`; on the H200 our fp32 chunked kernels are slower than `bi`'s
recurrent kernel, so there `bi` is the faster mode.

Device dispatch: the invariant modes' callables branch on `x.is_cuda`. On CPU they are the plain-torch
formulations of ops/invariant.py, unchanged; on CUDA they run kernels/ (Triton GEMM with a fixed K order,
batch-count-invariant bmm for the blocked attention). Row reductions, the chunked GDN and the recurrent GDN
dispatch by device inside the model / ops (kernels/__init__.py says why).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ..kernels import on_gpu
from ..ops import invariant
from ..ops.attention import blocked_attention, sdpa_attention

MODES = ("stock", "bi", "bi_chunk")


def _bi_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if on_gpu(x):
        from ..kernels.gemm import linear as cuda_linear

        return cuda_linear(x, weight)
    return invariant.linear(x, weight)


def _bi_attention(q, k, v, q_pos, scale):
    if on_gpu(q):
        from ..kernels.bmm import bmm

        return blocked_attention(q, k, v, q_pos, scale, matmul=bmm)
    return blocked_attention(q, k, v, q_pos, scale)


@dataclass(frozen=True)
class Numerics:
    name: str
    gdn_form: str  # "chunk" | "recurrent" | "aligned_chunk"
    linear: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    silu: Callable[[torch.Tensor], torch.Tensor]
    sigmoid: Callable[[torch.Tensor], torch.Tensor]
    softplus: Callable[[torch.Tensor], torch.Tensor]
    attention: Callable[..., torch.Tensor]

    @property
    def invariant(self) -> bool:
        return self.name != "stock"


def get_numerics(name: str | Numerics) -> Numerics:
    if isinstance(name, Numerics):
        return name
    if name == "stock":
        return Numerics("stock", "chunk", F.linear, F.silu, torch.sigmoid, F.softplus, sdpa_attention)
    if name in ("bi", "bi_chunk"):
        return Numerics(
            name,
            "recurrent" if name == "bi" else "aligned_chunk",
            _bi_linear,
            invariant.silu,
            invariant.sigmoid,
            invariant.softplus,
            _bi_attention,
        )
    raise ValueError(f"numerics must be one of {MODES}, got {name!r}")
