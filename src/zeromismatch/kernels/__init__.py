"""GPU kernels (Triton) and GPU batch-invariant ops.

Nothing here imports triton at module import: CPU machines (CI) have no triton, and every entry point below
falls back to the plain-torch CPU formulation the project already uses, bit for bit. The Triton modules are
imported lazily, only when a CUDA tensor arrives.

Why these exist (measured or known on the H200, torch 2.11 + triton 3.6; see experiments/gpu/h200_suite.py):
- torch's CUDA reductions (sum / mean over the last dim) pick block shapes from the number of rows, so a row's
  bits depend on how many rows share the call. `mean_sq_last`, `sum_sq_last`, `sum_last` run one Triton
  reduction whose layout depends only on the row length.
- cuBLAS picks GEMM kernels by M (and batch count): `gemm.linear` / `bmm.bmm` are Triton GEMMs with a fixed
  K order and no split-K.
- `gdn_recurrent` is the recurrent GDN forward (one compiled variant for every call); `gdn_chunk` the chunked
  forward (bi_chunk's trainer) and the fused chunk-consistent decode step that equals its rows bit for bit.
- `gemm`, `bmm`, `reduce`: the batch-invariant GEMMs and row reductions.
"""

from __future__ import annotations

import os

import torch

_configured = False
# TRITON_INTERPRET=1 runs the GPU path on CPU tensors through Triton's interpreter (debugging only)
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def on_gpu(x: torch.Tensor) -> bool:
    """Whether x takes the kernels/ path: CUDA tensors (or any tensor under TRITON_INTERPRET=1)."""
    return x.is_cuda or INTERPRET


def configure_cuda() -> None:
    """TF32 off, reduced-precision reductions off (torch matmuls that remain: stock mode, backward)."""
    global _configured
    if _configured:
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    _configured = True


def enable_cublaslt_invariant() -> None:
    """Make cuBLASLt the BLAS backend with its workspace starved (no split-K): measured batch-invariant and
    bitwise equal to the Triton GEMMs on the H200, so ZM_GEMM_POLICY=hybrid may route large GEMMs to it.
    Must run before CUDA is initialized (the workspace size is read once)."""
    if torch.cuda.is_initialized():
        raise RuntimeError("enable_cublaslt_invariant() must run before CUDA is initialized")
    os.environ["CUBLASLT_WORKSPACE_SIZE"] = "1"
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":16:8"
    torch.backends.cuda.preferred_blas_library("cublaslt")


def mean_sq_last(x: torch.Tensor) -> torch.Tensor:
    """mean(x^2) over the last dim, keepdim. CPU: x.pow(2).mean(-1, keepdim=True) exactly."""
    if on_gpu(x):
        from .reduce import row_reduce

        return row_reduce(x, square=True, mean=True)
    return x.pow(2).mean(-1, keepdim=True)


def sum_sq_last(x: torch.Tensor) -> torch.Tensor:
    """sum(x^2) over the last dim, keepdim. CPU: (x * x).sum(-1, keepdim=True) exactly."""
    if on_gpu(x):
        from .reduce import row_reduce

        return row_reduce(x, square=True, mean=False)
    return (x * x).sum(-1, keepdim=True)


def sum_last(x: torch.Tensor) -> torch.Tensor:
    """sum over the last dim, keepdim. CPU: x.sum(-1, keepdim=True) exactly."""
    if on_gpu(x):
        from .reduce import row_reduce

        return row_reduce(x, square=False, mean=False)
    return x.sum(-1, keepdim=True)


__all__ = ["INTERPRET", "configure_cuda", "enable_cublaslt_invariant", "mean_sq_last", "on_gpu", "sum_sq_last", "sum_last"]
