"""Routed experts on the CPU, batch-invariant: the pairs grouped by expert (routing.py), one GEMM per expert
that has rows, the token sums in fp32 in ascending expert order (routing.combine).

Invariance: with the CPU invariant linear (ops/linear/cpu.py, every row its own GEMM problem) and the
invariant silu (ops/activations.py), a pair's output depends only on its token's row and the expert's weights,
whatever else shares the group; the combine is elementwise. The bits equal naive.experts with the same linear
and silu (tests/ops/test_moe.py). One host sync per call (the offsets, to slice the groups): a CPU has no
stream to stall. Differentiable through torch autograd (the invariant linear has its own backward).
"""

from __future__ import annotations

import torch

from . import routing


def experts(x, top_w, top_i, gate_up, down, linear, silu):
    """x [N, H], top_w / top_i [N, k], gate_up [E, 2I, H], down [E, H, I] -> [N, H] in x's dtype."""
    n, h = x.shape
    r = routing.route(top_w, top_i, gate_up.shape[0])
    xs = x[r.token]
    w = r.top_w.reshape(-1)[r.pair]
    bounds = r.offsets.tolist()
    parts = []
    for e in range(gate_up.shape[0]):
        a, b = bounds[e], bounds[e + 1]
        if a == b:
            continue
        gate, up = linear(xs[a:b], gate_up[e]).chunk(2, dim=-1)
        parts.append(linear(silu(gate) * up, down[e]) * w[a:b, None])
    y = torch.cat(parts) if parts else x.new_zeros(0, h)
    y_pairs = torch.empty(r.rows, h, dtype=y.dtype, device=x.device).index_copy(0, r.pair, y)
    return routing.combine(y_pairs, n, r.k, x.dtype)
