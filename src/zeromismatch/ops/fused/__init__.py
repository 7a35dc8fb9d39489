"""The model's row-wise and elementwise ops (norms, GDN gates, RoPE): one Triton kernel each on CUDA (triton.py),
the plain-torch forms on the CPU (naive.py). The kernels are row / element invariant, so every numerics mode
uses them; under autograd the backward differentiates the torch form (ops.autograd.backward_through).
"""

from __future__ import annotations

import torch

from ..autograd import backward_through
from ..device import on_gpu
from . import naive


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm over the last dim: (x * rsqrt(mean(x^2) + eps)) * (1 + w) in fp32, in x.dtype."""
    if not on_gpu(x):
        return naive.rms_norm(x, weight, eps)
    from . import triton as kernels  # lazy: CPU machines have no triton

    return backward_through(lambda x, w: kernels.rms_norm(x, w, eps), lambda x, w: naive.rms_norm(x, w, eps), x, weight)


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, silu) -> torch.Tensor:
    """GDN output norm: x (the fp32 core output) cast to z.dtype, normalized, times w, times silu(z). `silu` is the
    mode's on the CPU; the CUDA kernel computes z / (1 + exp(-z)) itself (elementwise, so invariant)."""
    if not on_gpu(x):
        return naive.gated_rms_norm(x, z, weight, eps, silu)
    from . import triton as kernels

    return backward_through(lambda x, z, w: kernels.gated_rms_norm(x, z, w, eps),
                            lambda x, z, w: naive.gated_rms_norm(x, z, w, eps, silu), x, z, weight)


def gdn_gates(a, b, a_log, dt_bias, softplus, sigmoid) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, beta) [N, HV] fp32 from the a / b projections [N, HV]: g = -exp(A_log) softplus(a + dt_bias),
    beta = sigmoid(b). The activations are the mode's on the CPU, the kernel's own on CUDA."""
    if not on_gpu(a):
        return naive.gdn_gates(a, b, a_log, dt_bias, softplus, sigmoid)
    from . import triton as kernels

    return backward_through(kernels.gdn_gates, lambda a, b, al, dt: naive.gdn_gates(a, b, al, dt, softplus, sigmoid),
                            a, b, a_log, dt_bias)


def rope(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX RoPE of x [N, H, D] (a strided head view is fine) at positions [N] from fp32 tables cos, sin
    [P, half]: the first 2 * half dims rotated in x's dtype, the rest passed through."""
    if not on_gpu(x):
        return naive.rope(x, positions, cos, sin)
    from . import triton as kernels

    return backward_through(lambda x: kernels.rope(x, positions, cos, sin), lambda x: naive.rope(x, positions, cos, sin), x)


def gated(x: torch.Tensor, gate: torch.Tensor, act, act_name: str) -> torch.Tensor:
    """act(gate) * x [N, F]: the MLP's silu(gate) * up, attention's output times sigmoid(gate). gate: [N, F] or a
    [N, H, D] view (H * D = F; e.g. the gate half of each head of a projection, read in place). act is the mode's
    on the CPU; act_name ("silu" / "sigmoid") picks the kernel's own on CUDA (elementwise, so invariant)."""
    if not on_gpu(x):
        return naive.gated(x, gate, act)
    from . import triton as kernels

    return backward_through(lambda x, g: kernels.gated(x, g, act_name), lambda x, g: naive.gated(x, g, act), x, gate)


def qk_l2norm(q: torch.Tensor, k: torch.Tensor, num_v_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """GDN q, k [B, T, H, K] (views of the conv output) -> [B, HV, T, K] fp32: l2-normalized, q scaled by K^-0.5,
    each key head repeated for its value heads. One kernel per tensor on CUDA (row-invariant)."""
    if not on_gpu(q):
        return naive.qk_l2norm(q, k, num_v_heads)
    from . import triton as kernels

    return backward_through(lambda q, k: kernels.qk_l2norm(q, k, num_v_heads),
                            lambda q, k: naive.qk_l2norm(q, k, num_v_heads), q, k)


__all__ = ["gated", "gated_rms_norm", "gdn_gates", "qk_l2norm", "rms_norm", "rope"]
