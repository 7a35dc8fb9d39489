"""Activations shared by the Triton kernels, written once: fp32 in, fp32 out, elementwise (so row-invariant).

z / (1 + exp(-z)) is the GPU's exp and division, not torch's silu / sigmoid: kernels that use these match the torch
forms to a few ulps; trainer and generator agree because both run the same kernels.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def sigmoid(z):
    return 1.0 / (1.0 + tl.exp(-z))


@triton.jit
def silu(z):
    return z / (1.0 + tl.exp(-z))
