"""The one logprob op. Trainer and generator both call it on fp32 logits, so a token's logprob is a function
of its logits row alone (a separate generator kernel left a constant 4.8e-7 diff upstream).

Raw by default (untempered: the published metrics' definition). With ``temperature`` it is log p under
softmax(logits / T), the distribution a sampler at T draws from before top-k / top-p: what a policy gradient on
samples drawn at T needs. The division is always by a per-row fp32 tensor on the logits' device, on both sides,
so its bits never depend on how T reached the op (CUDA divides by a host scalar as a multiply by its reciprocal,
which is not correctly rounded)."""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature=None) -> torch.Tensor:
    """logits [N, V] (any float dtype, computed in fp32), tokens [N] -> fp32 [N] log p(token).
    ``temperature``: None (raw), a float, or an [N] tensor of per-row temperatures (> 0)."""
    x = logits.float()
    if temperature is not None:
        t = torch.as_tensor(temperature, dtype=torch.float32).to(x.device).reshape(-1)
        x = x / t.expand(x.shape[0]).reshape(-1, 1).contiguous()
    logp = torch.log_softmax(x, dim=-1)
    return logp.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
