"""Routed experts, the plain-torch reference: one expert at a time in ascending expert id (the model's original
loop, one host sync per expert). Tests compare every grouped form against it.

Semantics every form shares (what "the expert op" means in this repo):
- per (token, slot) pair routed to expert e: gate, up = linear(x_t, gate_up[e]) (rounded to x's dtype),
  h = silu(gate) * up, y = linear(h, down[e]) * w (the routing weight, in x's dtype);
- a token's k expert outputs are added in fp32, starting from 0, in ascending expert id, then rounded once to
  x's dtype: the order never depends on which other tokens share the call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def experts(x, top_w, top_i, gate_up, down, linear=F.linear, silu=F.silu):
    """x [N, H], top_w [N, k] (x's dtype), top_i [N, k] (distinct experts per row), gate_up [E, 2I, H],
    down [E, H, I] -> [N, H] in x's dtype."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in range(gate_up.shape[0]):
        rows, slot = torch.where(top_i == e)
        if rows.numel() == 0:
            continue
        gate, up = linear(x[rows], gate_up[e]).chunk(2, dim=-1)
        y = linear(silu(gate) * up, down[e]) * top_w[rows, slot, None]
        out = out.index_add(0, rows, y.float())
    return out.to(x.dtype)
