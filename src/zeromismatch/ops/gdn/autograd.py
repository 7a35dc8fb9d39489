"""GDN training ops whose forward is not the chunked torch form: the backward recomputes the output through
the chunked form (same function, mathematically) and differentiates that.

- `bi` (the published method): recurrent forward, bitwise the generator's decode arithmetic. Backpropagating
  through the T-step loop would keep T copies of the state.
- the CUDA chunked kernels (kernels.gdn_chunk, `bi_chunk` and `stock` on the GPU): Triton, no autograd.

The gradient is the chunked form's gradient evaluated at the same inputs: it matches the forward's own to
fp32 rounding (tests/ops/test_gdn.py), the published method's choice too.
"""

from __future__ import annotations

import torch

from .reference import chunk_fwd_torch, recurrent_fwd, to_chunks


class ChunkedBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, forward, q, k, v, g, beta, state):
        ctx.save_for_backward(q, k, v, g, beta, state)
        return forward(q, k, v, g, beta, state)

    @staticmethod
    def backward(ctx, grad_o):
        inputs = ctx.saved_tensors
        t = inputs[0].shape[2]
        needs = ctx.needs_input_grad[1:]
        with torch.enable_grad():
            leaves = [x.detach().requires_grad_(needs[i]) for i, x in enumerate(inputs)]
            o, _ = chunk_fwd_torch(*to_chunks(*leaves[:5]), leaves[5])
            wrt = [x for i, x in enumerate(leaves) if needs[i]]
            got = iter(torch.autograd.grad(o[:, :, :t], wrt, grad_o) if wrt else [])
        return (None, *(next(got) if needs[i] else None for i in range(len(inputs))))


def _recurrent_o(q, k, v, g, beta, state):
    return recurrent_fwd(q, k, v, g, beta, state)[0]


def gdn_recurrent_train(q, k, v, g, beta, state):
    """Inputs as `recurrent_fwd` (prepared layout). Differentiable: recurrent forward, chunked backward."""
    return ChunkedBackward.apply(_recurrent_o, q, k, v, g, beta, state)


def chunk_fwd_cuda_train(q, k, v, g, beta, state):
    """`kernels.gdn_chunk.chunk_fwd`'s output, differentiable (chunked torch backward). T a multiple of 64."""
    from ...kernels.gdn_chunk import chunk_fwd

    return ChunkedBackward.apply(lambda *xs: chunk_fwd(*xs)[0], q, k, v, g, beta, state)
