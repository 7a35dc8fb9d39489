"""Batch-invariant activations for the `bi` / `bi_chunk` modes: an element's bits never depend on where it
sits in the tensor.

Why these formulations (measured on our CPU, torch 2.13, asserted in tests/ops/test_invariant.py): torch's
sigmoid / silu / softplus run a vectorized body and a scalar tail whose results differ by an ulp, so an
element's bits depend on its position. exp, log, log1p, rsqrt and IEEE division agree between the two paths, so
the activations are composed from those. The same code runs on CUDA, where elementwise kernels compute every
element alike.
"""

from __future__ import annotations

import torch


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    return 1.0 / (1.0 + torch.exp(-x))


def silu(x: torch.Tensor) -> torch.Tensor:
    return x / (1.0 + torch.exp(-x))


def softplus(x: torch.Tensor) -> torch.Tensor:
    # same threshold as torch.nn.functional.softplus (beta=1, threshold=20)
    return torch.where(x > 20.0, x, torch.log1p(torch.exp(torch.clamp(x, max=20.0))))
