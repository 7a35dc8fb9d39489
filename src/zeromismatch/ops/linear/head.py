"""The fp32 lm_head: fp32 logits of the final-norm hidden rows, whatever the activation dtype.

In a bf16 model both operands hold bf16 values (the final norm casts its output; the weight is a bf16 parameter),
so every product h_k * w_k is exact in fp32 (8-bit significands). Two forms (conf/numerics `lm_head`):

- "tensor_core" (default): on CUDA a bf16 tensor-core GEMM whose fp32 accumulator is stored as the fp32 logits:
  the bf16 matmul rate instead of fp32 FMAs in the trainer (12x cuBLAS's fp32 GEMM at the 9B head's training
  shape, 36x our fp32 FMA kernel), and in decode half the weight bytes with no fp32 copy of the weight. The
  tensor cores add the exact products with fewer bits than IEEE fp32 additions keep: relative error to float64
  4.4e-6 at K = 4096 (1e-6 at K = 1024), against 6e-7 for the fp32 GEMM and 1.7e-3 for bf16 logits (H200,
  results/gpu/). stock: cuBLAS (torch.mm with an fp32 output); bi modes: the batch-invariant Triton GEMM with an
  fp32 output (triton.linear_raw): bf16 tensor-core dots give a row the same bits whatever the tile config or the
  other rows, as for every other bf16 projection.
- "fp32": the fp32 GEMM of the fp32 casts (`w_fp32()`: the model keeps the cast), as the published recipe states
  it: cuBLAS's fp32 GEMM in stock, the invariant FMA kernel in bi modes.

Anywhere but CUDA with bf16 operands (CPU, fp32 weights) both forms are the fp32 GEMM of the casts.

Backward of the tensor-core form (the trainer's; it needs no invariance, autograd.py): the fp32 logit gradient is
rounded to bf16 and both products run on tensor cores with fp32 accumulation, as autograd of a bf16 linear
computes them; the gradients are bf16 like their operands either way.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ..device import on_gpu
from .autograd import linear_with
from .dispatch import linear
from .policy import DEFAULT_GEMM_POLICY, DEFAULT_HEAD


def _tensor_cores(h: torch.Tensor, w: torch.Tensor) -> bool:
    return h.dtype == w.dtype == torch.bfloat16


def _cublas_fp32_out(h2: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.mm(h2, w.t(), out_dtype=torch.float32)


def stock_logits(h: torch.Tensor, w: torch.Tensor, w_fp32: Callable[[], torch.Tensor],
                 form: str = DEFAULT_HEAD) -> torch.Tensor:
    """fp32 logits h @ w^T for stock: cuBLAS with fp32 output for bf16 operands on CUDA, else the fp32 GEMM."""
    if form == "tensor_core" and h.is_cuda and _tensor_cores(h, w):
        return linear_with(_cublas_fp32_out, h, w)
    return F.linear(h.float(), w_fp32())


def invariant_logits(h: torch.Tensor, w: torch.Tensor, w_fp32: Callable[[], torch.Tensor],
                     form: str = DEFAULT_HEAD, policy: str = DEFAULT_GEMM_POLICY) -> torch.Tensor:
    """fp32 logits h @ w^T, batch-invariant: the invariant GEMM with fp32 output for bf16 operands on CUDA, else the
    invariant fp32 GEMM (CPU: ops/linear/cpu.py; CUDA fp32 weights: the FMA kernel)."""
    if form == "tensor_core" and on_gpu(h) and _tensor_cores(h, w):
        from .triton import linear_raw  # lazy: CPU machines have no triton

        return linear_with(lambda h2, w2: linear_raw(h2, w2, policy=policy, out_dtype=torch.float32), h, w)
    return linear(h.float(), w_fp32(), policy=policy)
