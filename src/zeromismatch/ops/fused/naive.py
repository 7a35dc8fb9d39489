"""The model's row-wise and elementwise ops in plain torch: the CPU form, and the form the CUDA kernels
(triton.py) are differentiated through (ops.autograd.backward_through) and checked against.

- rms_norm        zero-centred RMSNorm: normalize in fp32, scale by (1 + w)
- gated_rms_norm  GDN output norm: the fp32 core output cast to the activation dtype, normalized, times w, times
                  silu(z)
- gdn_gates       GDN log decay g = -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b), fp32
- rope            NeoX rotary embedding of the first 2 * half dims by absolute position, from cos / sin tables
- gated           act(gate) * x: the MLP's silu(gate) * up, attention's output times sigmoid(gate)
- qk_l2norm       GDN q, k: l2-normalized in fp32, q scaled, expanded to the value heads, in the kernel layout
"""

from __future__ import annotations

import torch

from ..reduce import mean_sq_last, sum_sq_last


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(mean_sq_last(xf) + eps)
    return (y * (1.0 + weight.float())).to(x.dtype)


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, silu) -> torch.Tensor:
    """x [R, D] (any float dtype: cast to z's first), z [R, D] -> z.dtype."""
    xf = x.to(z.dtype).float()
    y = (xf * torch.rsqrt(mean_sq_last(xf) + eps)).to(z.dtype)
    return (weight * y * silu(z.float())).to(z.dtype)


def gdn_gates(a, b, a_log, dt_bias, softplus, sigmoid) -> tuple[torch.Tensor, torch.Tensor]:
    """a, b [N, HV] -> (g, beta) [N, HV] fp32."""
    g = -torch.exp(a_log.float()) * softplus(a.float() + dt_bias.float())
    return g, sigmoid(b.float())


def rope(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, H, D]; positions [N]; cos, sin [P, half] fp32 tables. The products and sums in x's dtype."""
    half = cos.shape[-1]
    c, s = cos[positions][:, None, :].to(x.dtype), sin[positions][:, None, :].to(x.dtype)
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, rest], dim=-1)


def gated(x: torch.Tensor, gate: torch.Tensor, act) -> torch.Tensor:
    """act(gate) * x, each rounded to x's dtype; gate has x's elements in the same order (any view shape)."""
    return x * act(gate).reshape(x.shape)


def qk_l2norm(q: torch.Tensor, k: torch.Tensor, num_v_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T, H, K] raw q, k -> [B, HV, T, K] fp32, l2-normalized (eps 1e-6 inside the rsqrt), q scaled by
    K^-0.5. Value head hv reads key head hv // (HV / H)."""
    q, k = q.float(), k.float()
    # sum_sq_last: (x * x).sum(-1, keepdim=True) on CPU; a row-count-invariant Triton reduction on CUDA
    q = q * torch.rsqrt(sum_sq_last(q) + 1e-6)
    k = k * torch.rsqrt(sum_sq_last(k) + 1e-6)
    q = q * (q.shape[-1] ** -0.5)
    rep = num_v_heads // q.shape[2]
    if rep > 1:
        q, k = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)
    return q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()
