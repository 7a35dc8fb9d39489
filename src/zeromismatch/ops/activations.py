"""Batch-invariant activations for the `bi` / `bi_chunk` modes: an element's bits never depend on where it
sits in the tensor.

- CPU (measured on our CPU, torch 2.13, asserted in tests/ops/test_invariant.py): torch's sigmoid / silu /
  softplus run a vectorized body and a scalar tail whose results differ by an ulp, so an element's bits depend
  on its position. exp, log, log1p, rsqrt and IEEE division agree between the two paths, so the activations are
  composed from those.
- CUDA: torch's own kernels. A CUDA elementwise kernel runs one functor per element whether it takes the
  vectorized, the unrolled or the strided path, so an element's bits depend on its value alone (checked at every
  alignment offset, strided views and single elements, under autograd: tests/gpu/test_gpu_kernels.py); one pass
  over memory instead of the composed form's three to four, forward and backward (the 9B-shaped bi step 5%
  faster, 3.4 GB less peak memory: results/gpu/trainer_candidates_6d35b41).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    if x.is_cuda:
        return torch.sigmoid(x)
    return 1.0 / (1.0 + torch.exp(-x))


def silu(x: torch.Tensor) -> torch.Tensor:
    if x.is_cuda:
        return F.silu(x)
    return x / (1.0 + torch.exp(-x))


def softplus(x: torch.Tensor) -> torch.Tensor:
    if x.is_cuda:
        return F.softplus(x)
    # same threshold as torch.nn.functional.softplus (beta=1, threshold=20)
    return torch.where(x > 20.0, x, torch.log1p(torch.exp(torch.clamp(x, max=20.0))))
