"""`linear` and `bmm` by device: the plain-torch CPU form, or the Triton one on CUDA (ops/device.py)."""

from __future__ import annotations

import torch

from ..device import on_gpu
from . import cpu
from .policy import DEFAULT_GEMM_POLICY


def linear(x: torch.Tensor, weight: torch.Tensor, policy: str = DEFAULT_GEMM_POLICY) -> torch.Tensor:
    """x [..., K] @ weight [N, K]^T, batch-invariant. policy: the CUDA GEMM's tile policy (unused on CPU)."""
    if on_gpu(x):
        from .triton import linear as linear_triton  # lazy: CPU machines have no triton

        return linear_triton(x, weight, policy)
    return cpu.linear(x, weight)


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.matmul for [..., M, K] @ [..., K, N] (leading dims broadcast), batch-count-invariant. On CPU
    torch.matmul itself: batch-count invariant at the blocked attention's shapes (tests/ops/test_attention.py)."""
    if on_gpu(a):
        from .bmm_triton import bmm as bmm_triton  # lazy: CPU machines have no triton

        return bmm_triton(a, b)
    return torch.matmul(a, b)
