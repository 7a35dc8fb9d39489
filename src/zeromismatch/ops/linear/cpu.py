"""The CPU batch-invariant GEMM: y = x @ weight.T with every row computed identically whatever the number of
rows in the call.

Why (measured on our CPU, torch 2.13 + MKL, asserted in tests/ops/test_invariant.py): F.linear picks different
kernels for different row counts (a single row takes a GEMV path; other M change the blocking), so a row's bits
depend on M. A GEMM whose row count is always a multiple of ROW_TILE gives every row the same bits wherever it
sits: rows are zero-padded to that multiple.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ROW_TILE = 32


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ weight [N, K]^T -> [..., N]."""
    *lead, k = x.shape
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    pad = (-m) % ROW_TILE
    if pad:
        x2 = F.pad(x2, (0, 0, 0, pad))
    y = x2 @ weight.t()
    if pad:
        y = y[:m]
    return y.reshape(*lead, weight.shape[0])
