"""Batch-invariant matmuls: every output row depends only on its own input row, never on how many rows (or batch
items) share the call. `linear` serves every projection of the `bi` / `bi_chunk` modes, `bmm` their blocked
attention.

- cpu.py          the CPU GEMM (fixed-shape row blocks, one MKL thread each)
- triton.py       the CUDA GEMM: fixed K order, no split-K; its tile config is chosen by the gemm policy
- bmm_triton.py   the CUDA batched matmul: tile config from the matrix shape only, never the batch count
- policy.py       the CUDA GEMM's tile policies (conf/numerics `gemm_policy`)
- head.py         the fp32 lm_head (stock and invariant): bf16 operands, exact products, fp32 sums and logits
"""

from __future__ import annotations

import torch

from ..device import on_gpu
from . import cpu
from .policy import DEFAULT_GEMM_POLICY, DEFAULT_HEAD, GEMM_POLICIES, HEAD_FORMS


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


from .head import invariant_logits, stock_logits  # noqa: E402  (head.py calls `linear` above)

__all__ = ["DEFAULT_GEMM_POLICY", "DEFAULT_HEAD", "GEMM_POLICIES", "HEAD_FORMS", "bmm", "invariant_logits", "linear",
           "stock_logits"]
