"""Routed experts for `stock` on CUDA: torch._grouped_mm (CUTLASS grouped GEMM), no invariance claimed.

The pairs are grouped by expert (routing.py); offs are the int32 cumulative group ends, as _grouped_mm takes
them for a 2-D x 3-D product (ragged rows: no padding of the groups is needed, torch >= 2.8). The weights are
read transposed in place ([E, H, 2I] and [E, I, H] views, column-major in the last two dims, which
_grouped_mm accepts). bf16 only (its one dtype) and 16-byte row strides; anything else, or a torch without it, takes naive.experts.
Autograd: _grouped_mm has a derivative in torch (checked on the CPU form vs naive, tests/ops/test_moe.py; on
CUDA by tests/gpu/test_gpu_moe.py). No host sync.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import naive, routing

AVAILABLE = hasattr(torch, "_grouped_mm")


def supported(x: torch.Tensor, down: torch.Tensor) -> bool:
    """bf16 (its one dtype), H and I multiples of 8: every operand's row stride a multiple of 16 bytes."""
    return AVAILABLE and x.dtype == down.dtype == torch.bfloat16 and x.shape[1] % 8 == 0 and down.shape[2] % 8 == 0


def experts(x, top_w, top_i, gate_up, down):
    """x [N, H], top_w / top_i [N, k], gate_up [E, 2I, H], down [E, H, I] -> [N, H] in x's dtype."""
    if not supported(x, down):
        return naive.experts(x, top_w, top_i, gate_up, down)
    n, h = x.shape
    r = routing.route(top_w, top_i, gate_up.shape[0])
    offs = r.offsets[1:].to(torch.int32)
    gate, up = torch._grouped_mm(x[r.token], gate_up.transpose(1, 2), offs=offs).chunk(2, dim=-1)
    y = torch._grouped_mm(F.silu(gate) * up, down.transpose(1, 2), offs=offs)
    y = y * r.top_w.reshape(-1)[r.pair, None]
    y_pairs = torch.empty(r.rows, h, dtype=y.dtype, device=x.device).index_copy(0, r.pair, y)
    return routing.combine(y_pairs, n, r.k, x.dtype)
