"""Which tokens count, and what to divide by.

Losses and metrics share these two helpers so that the loss and every logged mismatch number see
exactly the same token set: a token is *valid* iff it is in the loss mask AND its generator
logprob is finite. Invalid tokens leave both numerator and denominator.

Data parallelism: each rank computes `count_valid_tokens` on its shard, the caller all-reduces the
counts (SUM) and passes the result as `global_valid_tokens`. Every mean in this package is then a
*partial* mean (local sum / global count), and an all-reduce SUM of the partial means over ranks gives
the exact global token-weighted mean. With `global_valid_tokens=None` the local count is used, i.e.
ordinary single-process means.
"""

from __future__ import annotations

import torch

__all__ = ["valid_token_mask", "count_valid_tokens", "denominator"]


def valid_token_mask(loss_mask: torch.Tensor, gen_logprobs: torch.Tensor) -> torch.Tensor:
    """Bool tensor: in the loss mask and scored by the generator (finite logprob)."""
    if loss_mask.shape != gen_logprobs.shape:
        raise ValueError(f"loss_mask {tuple(loss_mask.shape)} vs gen_logprobs {tuple(gen_logprobs.shape)}")
    return (loss_mask != 0) & torch.isfinite(gen_logprobs)


def count_valid_tokens(loss_mask: torch.Tensor, gen_logprobs: torch.Tensor) -> torch.Tensor:
    """Local number of valid tokens (int64, 0-dim). All-reduce SUM it to get `global_valid_tokens`."""
    return valid_token_mask(loss_mask, gen_logprobs).sum()


def denominator(
    global_valid_tokens: int | float | torch.Tensor | None,
    valid: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The divisor for token means, as a 0-dim tensor on valid's device.

    Clamped to >= 1 so that a batch (or rank) without valid tokens yields 0 and zero gradients, not NaN.
    No check that the global count covers the local one: that needs a device sync (caller's contract).
    """
    if global_valid_tokens is None:
        count = valid.sum()
    else:
        count = torch.as_tensor(global_valid_tokens, device=valid.device)
    return count.to(dtype).clamp_min(1)
