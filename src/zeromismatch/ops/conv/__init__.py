"""Causal depthwise conv (kernel W, no bias) + SiLU over the GDN qkv channels.

One implementation serves the trainer's full sequence and the generator's steps: both run the conv with a
carried state of the previous W-1 inputs (zeros at a sequence start). Output t is the same fixed left-to-right
sum  w[0]*x[t-W+1] + ... + w[W-1]*x[t]  (each product and partial sum rounded to the activation dtype) either
way, so a step equals the full-sequence result bit for bit (tests/ops/test_conv.py, tests/gpu).

CPU: the torch form (naive.py). CUDA: one Triton kernel for the outputs and one for the carried state
(triton.py), the generator's states read and written in place by slot; trained through the torch form.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..autograd import backward_through
from ..device import on_gpu
from . import naive

Activation = Callable[[torch.Tensor], torch.Tensor] | None


def _needs_grad(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)


def causal_conv(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor | None = None,
                activation: Activation = None, lengths: torch.Tensor | None = None):
    """x [B, T, C] new inputs (right-padded); weight [C, W]; state [B, W-1, C] the previous inputs (None: a
    sequence start); lengths [B] valid new inputs per row (None: all T); activation: SiLU or None (the CUDA
    kernel computes SiLU itself; the callable is the mode's, for the CPU and the backward).

    Returns (y [B, T, C], new_state [B, W-1, C] = the last W-1 inputs of each row, for the next call)."""
    if not on_gpu(x) or (state is not None and _needs_grad(x, weight)):  # (a carried state is never trained through)
        return naive.causal_conv(x, weight, state, activation, lengths)
    from . import triton as kernels  # lazy: CPU machines have no triton

    silu = activation is not None
    if state is None:
        y = backward_through(lambda x, w: kernels.conv(x, w, None, None, silu),
                             lambda x, w: naive.causal_conv(x, w, None, activation)[0], x, weight)
    else:
        y = kernels.conv(x, weight, state, None, silu)
    return y, kernels.next_state(x, weight.shape[-1], state, None, lengths, out=None)


def causal_conv_slots(x: torch.Tensor, weight: torch.Tensor, states: torch.Tensor, slots: torch.Tensor,
                      activation: Activation = None, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """causal_conv from the carried states of `slots` [B] in the cache's states [S, W-1, C], which are updated
    in place (the CUDA kernels read and write the slots directly: no gather, no scatter). Returns y."""
    if not on_gpu(x) or _needs_grad(x, weight):
        y, new = naive.causal_conv(x, weight, states[slots], activation, lengths)
        states[slots] = new.detach().to(states.dtype)
        return y
    from . import triton as kernels

    y = kernels.conv(x, weight, states, slots, activation is not None)
    kernels.next_state(x, weight.shape[-1], states, slots, lengths, out=states)  # after the conv: it read the old states
    return y


__all__ = ["causal_conv", "causal_conv_slots"]
