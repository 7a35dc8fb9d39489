"""A kernel's forward differentiated through a reference: the one pattern every invariant forward trains with.

The invariant kernels (GDN recurrent and chunked, attention) have no autograd of their own and need none: their
gradient is taken as the gradient of a reference form of the same function (the chunked torch GDN, torch SDPA)
evaluated at the same inputs, recomputed in the backward. It matches the forward's own gradient to the forms'
rounding difference (tests/ops), and is what the published method does for its recurrent GDN forward.
"""

from __future__ import annotations

from typing import Callable

import torch


class RecomputedBackward(torch.autograd.Function):
    """o = forward(*xs), computed without a graph; the backward recomputes reference(*xs) (same function, same
    output layout: a tensor or a tuple of tensors) under autograd and differentiates that."""

    @staticmethod
    def forward(ctx, forward: Callable, reference: Callable, *xs):
        ctx.save_for_backward(*xs)
        ctx.reference = reference
        return forward(*xs)

    @staticmethod
    def backward(ctx, *grad_o):
        inputs = ctx.saved_tensors
        needs = ctx.needs_input_grad[2:]
        with torch.enable_grad():
            leaves = [x.detach().requires_grad_(needs[i]) for i, x in enumerate(inputs)]
            o = ctx.reference(*leaves)
            o = list(o) if isinstance(o, tuple) else [o]
            wrt = [x for i, x in enumerate(leaves) if needs[i]]
            got = iter(torch.autograd.grad(o, wrt, list(grad_o), allow_unused=True) if wrt else [])
        return (None, None, *(next(got) if needs[i] else None for i in range(len(inputs))))


def backward_through(forward: Callable, reference: Callable, *xs: torch.Tensor) -> torch.Tensor:
    """forward(*xs), differentiable through reference(*xs) when autograd needs it (else forward alone)."""
    if torch.is_grad_enabled() and any(x.requires_grad for x in xs):
        return RecomputedBackward.apply(forward, reference, *xs)
    return forward(*xs)
