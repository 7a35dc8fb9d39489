"""The trainer's view of rollouts: one packed forward over whole sequences, logprob of every next token.
Used by the loss and by the parity check alike (one piece of code for 'what the trainer thinks'); and the
packing of samples into token-budgeted microbatches."""

from __future__ import annotations

import torch

from ..ops.logprob import token_logprobs
from ..rl.types import Sample


def pack(sequences: list[list[int]], device=None) -> tuple[torch.Tensor, list[int]]:
    cu = [0]
    for s in sequences:
        cu.append(cu[-1] + len(s))
    ids = torch.tensor([t for s in sequences for t in s], device=device, dtype=torch.long)
    return ids, cu


def next_token_logprobs(model, sequences: list[list[int]], tap=None, temperature: float | None = None) -> list[torch.Tensor]:
    """For each sequence s (length L) the fp32 tensor [L-1]: log p(s[j+1] | s[:j+1]) under `model`, from one
    packed varlen forward (no padding between documents, no state crossing them). ``temperature``: None for raw
    logprobs, else those of logits / temperature (ops/logprob.py; what the generator returns for requests with
    SamplingParams.tempered_logprobs)."""
    device = next(model.parameters()).device
    ids, cu = pack(sequences, device)
    # rows whose next token exists: every position but each sequence's last
    rows = torch.cat([torch.arange(cu[i], cu[i + 1] - 1, device=device) for i in range(len(sequences))])
    logits = model(ids, cu, logits_rows=rows, tap=tap)
    lp = token_logprobs(logits, ids[rows + 1], temperature)
    out, o = [], 0
    for i in range(len(sequences)):
        n = cu[i + 1] - cu[i] - 1
        out.append(lp[o : o + n])
        o += n
    return out


def microbatches(samples: list[Sample], max_tokens: int) -> list[list[int]]:
    """Greedy packing of sample indices, in order, into microbatches of at most max_tokens tokens."""
    out, cur, n = [], [], 0
    for i, s in enumerate(samples):
        length = s.token_ids.numel()
        if cur and n + length > max_tokens:
            out.append(cur)
            cur, n = [], 0
        cur.append(i)
        n += length
    if cur:
        out.append(cur)
    return out
