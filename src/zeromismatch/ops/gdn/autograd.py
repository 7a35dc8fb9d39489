"""The GDN form every mode differentiates: `chunk_reference`, the chunked torch form as the trainer runs it (its
scan over chunks a Triton kernel pair on CUDA when TRITON_SCAN is on, scan_triton.py). stock trains through it
directly; the other forwards train through it with ops.autograd.backward_through:
- `bi` (the published method): the recurrent forward, bitwise the generator's decode arithmetic.
  Backpropagating through the T-step loop would keep T copies of the state.
- the Triton kernels (recurrent_triton.py, chunk_triton.py): no autograd of their own.

The gradient is the chunked form's gradient evaluated at the same inputs: it matches the forward's own to fp32
rounding (tests/ops/test_gdn.py), the published method's choice too.
"""

from __future__ import annotations

from ..device import on_gpu
from .naive import chunk_output


# the trainer's scan over chunks on CUDA: scan_triton's kernels (tf32 dots, as FLA's chunk kernels use; within
# 1e-2 relative of the fp32 torch loop, tests/gpu/test_gpu_kernels.py). Off: the torch loop (benchmarks/trainer.py
# times both in one run)
TRITON_SCAN = True


def chunk_reference(q, k, v, g, beta, state):
    """naive.chunk_output (same inputs, o [B, HV, T, V]) as the trainer differentiates it: on CUDA the scan over
    chunks is scan_triton's kernel pair (one launch forward, one backward, instead of ~7 small kernels per chunk
    each way) when TRITON_SCAN is on, else (and on CPU) the torch loop."""
    if not (TRITON_SCAN and on_gpu(q)):
        return chunk_output(q, k, v, g, beta, state)
    from .scan_triton import chunk_scan_triton  # lazy: CPU machines have no triton

    return chunk_output(q, k, v, g, beta, state, scan=chunk_scan_triton)
