"""What the Triton kernels share, written once: launch options and activations (fp32 in, fp32 out, elementwise, so
row-invariant).

EXACT: launch with it (`kernel[grid](..., **EXACT)`) where a kernel's rounding must follow its torch form or another
kernel step by step. Without it the GPU compiler contracts a multiply and an add into one fused multiply-add, and
it does so after folding a product rounded to bf16 back into bf16 arithmetic: a bf16 `x1 * c - x2 * s` then skips
the product's rounding (1-ulp differences in ~0.5% of RoPE's outputs, the conv's sums too, measured on an H100).
Triton's interpreter never contracts, so only a GPU shows it.

z / (1 + exp(-z)) is the GPU's exp and division, not torch's silu / sigmoid: kernels that use these match the torch
forms to a few ulps; trainer and generator agree because both run the same kernels.
"""

from __future__ import annotations

import triton
import triton.language as tl

EXACT = dict(enable_fp_fusion=False)


@triton.jit
def sigmoid(z):
    return 1.0 / (1.0 + tl.exp(-z))


@triton.jit
def silu(z):
    return z / (1.0 + tl.exp(-z))
