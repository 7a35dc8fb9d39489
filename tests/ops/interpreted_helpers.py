"""The interpreted kernel modules' fixtures (tests/ops) share one set-up: on a CPU machine with triton installed, a
kernel module imported under Triton's interpreter with the GPU's dot order emulated (ops/interpreter.py
`interpreted`); on a CUDA machine tests/gpu runs the compiled kernels instead."""

import pytest
import torch


def interpreted_kernels(module: str):
    """Yield `module` with its kernels interpreted (for a module-scoped fixture to `yield from`)."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine runs the compiled kernels (tests/gpu)")
    pytest.importorskip("triton")
    from zeromismatch.ops.interpreter import interpreted

    with interpreted(module) as kernels:
        yield kernels
