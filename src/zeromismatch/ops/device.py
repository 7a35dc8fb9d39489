"""Where an op runs, and the CUDA settings the invariant kernels assume.

Every op family has a plain-torch CPU form and a CUDA form (Triton): CUDA tensors take the CUDA form. Under
TRITON_INTERPRET=1 every tensor takes it, so Triton's interpreter can check the kernels' logic on a machine
without a GPU (experiments/gpu/interpret_check.py). Nothing here imports triton: CPU machines have none.
"""

from __future__ import annotations

import os

import torch

# Triton's own switch, read once: the interpreter runs the CUDA forms on CPU tensors (debugging only)
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
_configured = False


def on_gpu(x: torch.Tensor | torch.device | str) -> bool:
    """Whether a tensor (or a tensor on this device) takes the CUDA form of an op."""
    if isinstance(x, torch.Tensor):
        return x.is_cuda or INTERPRET
    return torch.device(x).type == "cuda" or INTERPRET


def configure_cuda() -> None:
    """TF32 off, reduced-precision reductions off (for the torch matmuls that remain: stock mode, backward)."""
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
    bitwise equal to the Triton GEMMs on the H200, so gemm_policy=hybrid may route large GEMMs to it.
    Must run before CUDA is initialized (the workspace size is read once)."""
    if torch.cuda.is_initialized():
        raise RuntimeError("enable_cublaslt_invariant() must run before CUDA is initialized")
    os.environ["CUBLASLT_WORKSPACE_SIZE"] = "1"
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":16:8"
    torch.backends.cuda.preferred_blas_library("cublaslt")


_NUM_SMS: dict[int, int] = {}


def num_sms(dev: torch.device) -> int:
    """The device's multiprocessor count (launch sizing: persistent grids, how many programs fill the GPU)."""
    if dev.type != "cuda":  # TRITON_INTERPRET debugging
        return 4
    i = dev.index if dev.index is not None else torch.cuda.current_device()
    if i not in _NUM_SMS:
        _NUM_SMS[i] = torch.cuda.get_device_properties(i).multi_processor_count
    return _NUM_SMS[i]


__all__ = ["INTERPRET", "configure_cuda", "enable_cublaslt_invariant", "num_sms", "on_gpu"]
