"""The causal depthwise conv in plain torch: the CPU form, and the form the CUDA kernels (triton.py) are
differentiated through and checked against."""

from __future__ import annotations

from typing import Callable

import torch


def causal_conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    state: torch.Tensor | None = None,
    activation: Callable[[torch.Tensor], torch.Tensor] | None = None,
    lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [B, T, C] new inputs (right-padded); weight: [C, W]; state: [B, W-1, C] previous inputs (None =
    sequence start); lengths: [B] valid new inputs per row (None = all T).

    Returns (y [B, T, C], new_state [B, W-1, C] = the last W-1 inputs of each row, for the next call)."""
    b, t, c = x.shape
    width = weight.shape[-1]
    if state is None:
        state = x.new_zeros(b, width - 1, c)
    xs = torch.cat([state.to(x.dtype), x], dim=1)  # [B, W-1+T, C]
    y = xs[:, 0:t] * weight[:, 0]
    for i in range(1, width):
        y = y + xs[:, i : i + t] * weight[:, i]
    if activation is not None:
        y = activation(y)
    if lengths is None:
        return y, xs[:, t:].clone()
    idx = lengths.to(x.device).view(b, 1) + torch.arange(width - 1, device=x.device).view(1, -1)
    return y, xs.gather(1, idx.unsqueeze(-1).expand(b, width - 1, c))
