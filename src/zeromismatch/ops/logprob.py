"""The one logprob op. Trainer and generator both call it on fp32, untempered logits, so a token's logprob
is a function of its logits row alone (a separate generator kernel left a constant 4.8e-7 diff upstream)."""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """logits [N, V] (any float dtype, computed in fp32), tokens [N] -> fp32 [N] log p(token)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
