"""Row reductions over the last dim (RMSNorm's mean of squares, the q / k l2 norms, the router's renormalization),
every row's bits independent of how many rows share the call.

CPU: torch's own reductions over the innermost dim were row-count invariant (tests/ops/test_invariant.py), so
these are exactly x.pow(2).mean / (x * x).sum / x.sum. CUDA: torch picks block shapes from the number of rows,
so triton.py runs one reduction whose layout depends only on the row length.
"""

from __future__ import annotations

import torch

from ..device import on_gpu


def _row_reduce_triton(x: torch.Tensor, square: bool, mean: bool) -> torch.Tensor:
    from .triton import row_reduce  # lazy: CPU machines have no triton

    return row_reduce(x, square=square, mean=mean)


def mean_sq_last(x: torch.Tensor) -> torch.Tensor:
    """mean(x^2) over the last dim, keepdim."""
    if on_gpu(x):
        return _row_reduce_triton(x, square=True, mean=True)
    return x.pow(2).mean(-1, keepdim=True)


def sum_sq_last(x: torch.Tensor) -> torch.Tensor:
    """sum(x^2) over the last dim, keepdim."""
    if on_gpu(x):
        return _row_reduce_triton(x, square=True, mean=False)
    return (x * x).sum(-1, keepdim=True)


def sum_last(x: torch.Tensor) -> torch.Tensor:
    """sum over the last dim, keepdim."""
    if on_gpu(x):
        return _row_reduce_triton(x, square=False, mean=False)
    return x.sum(-1, keepdim=True)


__all__ = ["mean_sq_last", "sum_last", "sum_sq_last"]
