"""CPU batch-invariant GEMM: `linear(x, weight)` = x @ weight.T (CPU tensors) where a row's bits never depend
on how many rows share the call, where the row sits, or how many threads torch uses.

Construction (why it holds at every shape and on every CPU):
- Every row is its own GEMM problem, [1, Kp] x [Kp, N], and every problem of every call for a weight is the
  same problem up to the row's values: one batched call (torch.bmm over the rows, the weight broadcast with
  batch stride 0), K zero-padded to a multiple of 64 bytes in a fresh allocation so that every row starts on a
  64-byte boundary and every problem sees the same shape, strides and alignment. The BLAS then runs the same
  arithmetic for each, so a row's result is a function of that row alone. (The padded terms add exact zeros.)
  A GEMM over many rows would not do: a BLAS blocks and vectorizes across rows, so a row's bits can depend on
  its position in the tile; MKL on AMD EPYC computes the rows of a [4, 131] weight differently at positions
  that are not multiples of 4, and MKL re-blocks and re-threads by the row count M on every CPU.
- Each problem runs on one thread: MKL's thread-local thread count is set to 1 around the call (the MKL service
  function mkl_set_num_threads_local, exported by torch's own libtorch_cpu), so no reduction is split across
  threads and the bits are the same with 1 or 2 torch threads.
- bf16 / fp16 inputs are computed in fp32 (their products are exact in fp32; one rounding at the end):
  torch's reduced-precision CPU GEMM runs in oneDNN, whose threading the MKL setting does not reach.

The cost: a row-at-a-time GEMM reuses no weight tile across rows (3-4.5x one blocked GEMM at the tiny presets'
shapes on our CPU). The backward is plain torch matmuls: gradients need determinism for the same tensors, not
batch invariance. tests/ops/test_linear_cpu.py checks the invariances over a grid of shapes (N, K from 1 to
4096 incl. odd sizes, M 1..300, fp32 and bf16, 1 and 2 threads).
"""

from __future__ import annotations

import ctypes
import os

import torch

_ALIGN = 64  # bytes: torch's CPU allocator aligns fresh tensors to this; rows are padded to a multiple of it


def _mkl_thread_control():
    """MKL_Set_Num_Threads_Local (C calling convention) from torch's MKL, or None on a torch without MKL."""
    lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    if not torch.backends.mkl.is_available() or not os.path.exists(lib):
        return None
    try:
        fn = ctypes.CDLL(lib).MKL_Set_Num_Threads_Local
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int]
    return fn


_set_mkl_local_threads = _mkl_thread_control()
SEQUENTIAL_GEMM = _set_mkl_local_threads is not None  # False: blocks run under torch's threading


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _row_mm(x2: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """[M, K] x [N, K]^T as M identical [1, Kp] x [Kp, N] problems of one batched call, on one MKL thread;
    result in the compute dtype, [M, N]."""
    m, k = x2.shape
    n = weight.shape[0]
    dtype = _compute_dtype(x2.dtype)
    per = _ALIGN // torch.empty(0, dtype=dtype).element_size()  # elements in 64 bytes
    kp = -(-k // per) * per
    xp = torch.zeros(m, kp, dtype=dtype)  # fresh: 64-byte aligned, every row too (row stride kp)
    xp[:, :k] = x2
    wp = torch.zeros(n, kp, dtype=dtype)
    wp[:, :k] = weight
    previous = _set_mkl_local_threads(1) if SEQUENTIAL_GEMM else None
    try:
        y = torch.bmm(xp.view(m, 1, kp), wp.t().expand(m, kp, n))
    finally:
        if SEQUENTIAL_GEMM:
            _set_mkl_local_threads(previous)
    return y.view(m, n)


class _InvariantLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, weight):
        ctx.save_for_backward(x2, weight)
        return _row_mm(x2, weight).to(x2.dtype)

    @staticmethod
    def backward(ctx, grad):
        x2, weight = ctx.saved_tensors
        grad_x = grad @ weight if ctx.needs_input_grad[0] else None
        grad_w = grad.t() @ x2 if ctx.needs_input_grad[1] else None
        return grad_x, grad_w


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T (no bias) with every row computed by the same GEMM problem, whatever the row count."""
    *lead, k = x.shape
    x2 = x.reshape(-1, k)
    if x2.shape[0] == 0:
        return x.new_zeros(*lead, weight.shape[0])
    if torch.is_grad_enabled() and (x2.requires_grad or weight.requires_grad):
        y = _InvariantLinear.apply(x2, weight)
    else:
        y = _row_mm(x2, weight).to(x2.dtype)
    return y.reshape(*lead, weight.shape[0])
