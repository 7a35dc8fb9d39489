"""The trainer's view of rollouts: one packed forward over whole sequences, logprob of every next token.
Used by the loss and by the parity audit alike (one piece of code for 'what the trainer thinks')."""

from __future__ import annotations

import torch

from ..ops.logprob import token_logprobs


def pack(sequences: list[list[int]], device=None) -> tuple[torch.Tensor, list[int]]:
    cu = [0]
    for s in sequences:
        cu.append(cu[-1] + len(s))
    ids = torch.tensor([t for s in sequences for t in s], device=device, dtype=torch.long)
    return ids, cu


def next_token_logprobs(model, sequences: list[list[int]], tap=None) -> list[torch.Tensor]:
    """For each sequence s (length L) the fp32 tensor [L-1]: log p(s[j+1] | s[:j+1]) under `model`, from one
    packed varlen forward (no padding between documents, no state crossing them)."""
    device = next(model.parameters()).device
    ids, cu = pack(sequences, device)
    # rows whose next token exists: every position but each sequence's last
    rows = torch.cat([torch.arange(cu[i], cu[i + 1] - 1, device=device) for i in range(len(sequences))])
    logits = model(ids, cu, logits_rows=rows, tap=tap)
    lp = token_logprobs(logits, ids[rows + 1])
    out, o = [], 0
    for i in range(len(sequences)):
        n = cu[i + 1] - cu[i] - 1
        out.append(lp[o : o + n])
        o += n
    return out
