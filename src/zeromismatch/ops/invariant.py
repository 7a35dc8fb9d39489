"""Batch-invariant building blocks: each output row depends only on its own input row, never on how many
rows share the call or where the row sits. That is what lets the generator (decode batches of any size)
reproduce the trainer's forward (packed batches) bit for bit.

Why these formulations (measured on our CPU, torch 2.13 + MKL, and asserted in tests/ops/test_invariant.py):
- F.linear picks different kernels for different row counts (a single row takes a GEMV path; other M change
  the blocking and threading), so a row's bits depend on M: linear is the fixed-shape blocked GEMM of
  ops/linear/cpu.py (its docstring says why that is invariant by construction).
- sigmoid / silu / softplus run a vectorized body and a scalar tail whose results differ by an ulp, so an
  element's bits depend on its position in the tensor. exp, log, log1p, rsqrt and IEEE division agree between
  the two paths, so the activations are composed from those.
- Row reductions over the innermost dim (sum, mean, softmax, log_softmax) were invariant to the row count.
"""

from __future__ import annotations

import torch

from .linear.cpu import linear  # noqa: F401  (re-exported: the CPU batch-invariant GEMM)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    return 1.0 / (1.0 + torch.exp(-x))


def silu(x: torch.Tensor) -> torch.Tensor:
    return x / (1.0 + torch.exp(-x))


def softplus(x: torch.Tensor) -> torch.Tensor:
    # same threshold as torch.nn.functional.softplus (beta=1, threshold=20)
    return torch.where(x > 20.0, x, torch.log1p(torch.exp(torch.clamp(x, max=20.0))))
