"""CPU batch-invariant GEMM: `linear(x, weight)` = x @ weight.T (CPU tensors) where a row's bits never depend
on how many rows share the call, where the row sits, or how many threads torch uses.

Construction (why it holds at every shape):
- Every GEMM issued for a weight has ONE shape: the rows of x are cut into blocks of ROW_BLOCK rows (the
  last block zero-padded) and each block is its own [ROW_BLOCK, K] x [K, N] GEMM, on operands laid out the
  same way every time (contiguous, row stride K in and N out, every operand starting on a 64-byte boundary:
  inputs that are not are copied into a fresh allocation). MKL chooses its kernel, cache blocking and order of the K
  reduction from the call (shape, strides, alignment, dtype, thread count) and the CPU, so every block of
  every call runs the same arithmetic, whatever the number of rows M. One GEMM over all M rows does not:
  MKL re-blocks and re-threads by M (a [384, 1024] weight at 2 threads gives rows that differ between
  M = 1..129 and M = 300).
- Each GEMM runs on one thread: MKL's thread-local thread count is set to 1 around the calls (the MKL service
  function mkl_set_num_threads_local, exported by torch's own libtorch_cpu), so no reduction is split across
  threads and the bits are the same with 1 or 2 torch threads (threaded, the same fixed-shape GEMMs change
  bits between 1 and 2 threads at every K >= 1000 tried here).
- bf16 / fp16 inputs are computed in fp32 (their products are exact in fp32; one rounding at the end):
  torch's reduced-precision CPU GEMM runs in oneDNN, whose threading the MKL setting does not reach.

What is measured rather than constructed: inside one GEMM, a row's bits depend only on that row (not on its
position in the block nor on the other rows' values). A BLAS kernel computes each output element in a
register tile with a K order that the tile position does not change; tests/ops/test_linear_cpu.py asserts it
over a grid of shapes (N, K from 1 to 4096 incl. odd sizes, M 1..300, fp32 and bf16, 1 and 2 threads), and
the construction above reduces every other source of variation to it.

Cost against one padded GEMM and F.linear at the presets' shapes: results/bench/cpu_invariant_linear.json.
The backward is plain torch matmuls: gradients need determinism for the same tensors, not batch invariance.
"""

from __future__ import annotations

import ctypes
import os

import torch
import torch.nn.functional as F

ROW_BLOCK = 32  # rows per GEMM call: decode (M <= 64) pays for at most 31 padded rows per call
_ALIGN = 64  # bytes: torch's CPU allocator aligns fresh tensors to this


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


def _is_aligned(t: torch.Tensor, dtype: torch.dtype) -> bool:
    """Usable as a GEMM operand as is: the compute dtype, contiguous, starting on a 64-byte boundary."""
    return t.dtype == dtype and t.is_contiguous() and t.data_ptr() % _ALIGN == 0


def _blocked_mm(x2: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """[M, K] x [N, K]^T in fixed [ROW_BLOCK, K] x [K, N] GEMMs, each on one MKL thread; result in the
    compute dtype, [M, N]."""
    m, k = x2.shape
    n = weight.shape[0]
    dtype = _compute_dtype(x2.dtype)
    blocks = -(-m // ROW_BLOCK)
    rows = blocks * ROW_BLOCK
    # a fresh allocation (contiguous, 64-byte aligned) unless x2 already is one whole number of blocks
    xp = x2 if rows == m and _is_aligned(x2, dtype) else F.pad(x2.to(dtype), (0, 0, 0, rows - m))
    w = weight if _is_aligned(weight, dtype) else weight.to(dtype, memory_format=torch.contiguous_format, copy=True)
    wt = w.t()
    previous = _set_mkl_local_threads(1) if SEQUENTIAL_GEMM else None
    try:
        if blocks == 1:
            y = torch.mm(xp, wt)
        else:
            y = torch.empty(rows, n, dtype=dtype)
            for i in range(0, rows, ROW_BLOCK):
                torch.mm(xp[i : i + ROW_BLOCK], wt, out=y[i : i + ROW_BLOCK])
    finally:
        if SEQUENTIAL_GEMM:
            _set_mkl_local_threads(previous)
    return y[:m]


class _InvariantLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, weight):
        ctx.save_for_backward(x2, weight)
        return _blocked_mm(x2, weight).to(x2.dtype)

    @staticmethod
    def backward(ctx, grad):
        x2, weight = ctx.saved_tensors
        grad_x = grad @ weight if ctx.needs_input_grad[0] else None
        grad_w = grad.t() @ x2 if ctx.needs_input_grad[1] else None
        return grad_x, grad_w


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T (no bias) with every row computed by the same fixed-shape GEMM, whatever the row count."""
    *lead, k = x.shape
    x2 = x.reshape(-1, k)
    if x2.shape[0] == 0:
        return x.new_zeros(*lead, weight.shape[0])
    if torch.is_grad_enabled() and (x2.requires_grad or weight.requires_grad):
        y = _InvariantLinear.apply(x2, weight)
    else:
        y = _blocked_mm(x2, weight).to(x2.dtype)
    return y.reshape(*lead, weight.shape[0])
