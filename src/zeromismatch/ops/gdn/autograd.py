"""The `bi` training op: recurrent forward (bitwise the generator's decode arithmetic), chunked backward.

Backpropagating through the T-step recurrent loop would keep T copies of the state; instead the backward
recomputes the output through the chunked form (same function, mathematically) and differentiates that.
The gradient is therefore the chunked form's gradient evaluated at the same inputs: it matches the
recurrent form's to fp32 rounding (tests/ops/test_gdn.py), the published method's choice too.
"""

from __future__ import annotations

import torch

from .reference import chunk_fwd, recurrent_fwd, to_chunks


class RecurrentFwdChunkBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, state):
        ctx.save_for_backward(q, k, v, g, beta, state)
        o, _ = recurrent_fwd(q, k, v, g, beta, state)
        return o

    @staticmethod
    def backward(ctx, grad_o):
        inputs = ctx.saved_tensors
        t = inputs[0].shape[2]
        needs = ctx.needs_input_grad
        with torch.enable_grad():
            leaves = [x.detach().requires_grad_(needs[i]) for i, x in enumerate(inputs)]
            o, _ = chunk_fwd(*to_chunks(*leaves[:5]), leaves[5])
            wrt = [x for i, x in enumerate(leaves) if needs[i]]
            got = iter(torch.autograd.grad(o[:, :, :t], wrt, grad_o) if wrt else [])
        return tuple(next(got) if needs[i] else None for i in range(len(inputs)))


def gdn_recurrent_train(q, k, v, g, beta, state):
    """Inputs as `recurrent_fwd` (prepared layout). Differentiable: recurrent forward, chunked backward."""
    return RecurrentFwdChunkBwd.apply(q, k, v, g, beta, state)
