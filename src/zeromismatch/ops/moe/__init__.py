"""Routed experts (the MoE layer's expert MLPs): x, the router's top-k weights and ids, the stacked weights
gate_up [E, 2I, H] and down [E, H, I] -> the tokens' weighted expert sums. naive.py says what every form
computes; each token's expert outputs are added in fp32 in ascending expert id.

- naive.py           plain torch, one expert at a time (the reference; a host sync per expert)
- routing.py         pairs grouped by expert on the device (sort, offsets, the kernels' tile table), combine
- cpu.py             the CPU form: one invariant GEMM per expert group (bi, bi_chunk; stock with torch ops)
- grouped_triton.py  the CUDA invariant form: Triton grouped GEMMs, fused epilogues, its own backward
- grouped_mm.py      stock's CUDA form: torch._grouped_mm (bf16), else naive

`invariant` and `stock` are what numerics sets as Numerics.experts; `.name` says which forms they take.
"""

from __future__ import annotations

import torch.nn.functional as F

from .. import activations
from ..device import on_gpu
from ..linear import cpu as linear_cpu
from . import cpu, grouped_mm


def invariant(x, top_w, top_i, gate_up, down):
    """Batch-invariant experts: the Triton grouped GEMMs on CUDA, per-group invariant GEMMs on the CPU."""
    if on_gpu(x):
        from .grouped_triton import experts as experts_triton  # lazy: CPU machines have no triton

        return experts_triton(x, top_w, top_i, gate_up, down)
    return cpu.experts(x, top_w, top_i, gate_up, down, linear_cpu.linear, activations.silu)


def stock(x, top_w, top_i, gate_up, down):
    """torch._grouped_mm on CUDA (bf16; naive otherwise), torch ops per expert group on the CPU."""
    if x.is_cuda:
        return grouped_mm.experts(x, top_w, top_i, gate_up, down)
    return cpu.experts(x, top_w, top_i, gate_up, down, F.linear, F.silu)


invariant.name = "triton_grouped/cpu_rows"  # CUDA form / CPU form, for Numerics.describe()
stock.name = "grouped_mm/cpu_torch"

__all__ = ["invariant", "stock"]
