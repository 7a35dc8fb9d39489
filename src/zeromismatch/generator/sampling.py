"""Sampling with per-request seeds. The returned logprob is the RAW (untempered, unfiltered) log p of the
sampled token, through the same op the trainer uses (ops.logprob.token_logprobs); a request with
``tempered_logprobs`` gets log p under softmax(logits / temperature) instead (still before top-k / top-p), the
logprob of the distribution it was sampled from, which the RL loss at that temperature compares against.

Two schemes, one per device path of the engine:
- `sample` (CPU, and the CUDA engine with device_sampling=False): each row draws from its request's
  torch.Generator over `filtered_probs` (multinomial on the CPU), as every CPU result so far was made.
- `sample_on_device` (CUDA): batched Gumbel-max on the device keyed by (seed, position) (ops/gumbel.py): no
  per-row host work, no generator state, a row's token a function of its seed, position and logits only.
Both draw from the same filtered distribution (tests/generator/test_sampling.py, tests/gpu/test_gpu_generator.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..ops.gumbel import gumbel_argmax, nucleus_threshold, row_key
from ..ops.logprob import token_logprobs


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    keep_cache: bool = False  # keep the slot after finishing, so the caller can append tokens and continue
    tempered_logprobs: bool = False  # logprobs of logits / temperature (greedy rows stay raw)

    def __post_init__(self):
        # written as `not (valid)` so that NaN is refused too
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not self.top_k >= 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not self.max_new_tokens >= 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        self.stop_token_ids = tuple(self.stop_token_ids)


def filtered_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Probabilities after temperature, top-k and top-p (one row, fp32)."""
    x = logits.float() / p.temperature
    if p.top_k and p.top_k < x.shape[-1]:
        kth = torch.topk(x, p.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if p.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the token crossing it included)
        drop = (sorted_p.cumsum(-1) - sorted_p) >= p.top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum()
    return probs


def sample(logits: torch.Tensor, params: list[SamplingParams], gens: list[torch.Generator]):
    """logits [R, V] fp32 -> (tokens [R] long, logprobs [R] fp32: raw, or tempered per request)."""
    tokens = []
    for row, p, g in zip(logits, params, gens):
        if p.temperature == 0:
            tokens.append(int(torch.argmax(row)))
        else:
            probs = filtered_probs(row, p)
            tokens.append(int(torch.multinomial(probs.cpu(), 1, generator=g)))
    tok = torch.tensor(tokens, device=logits.device)
    return tok, token_logprobs(logits, tok, logprob_temperatures(params))


def logprob_temperatures(params: list[SamplingParams]) -> list[float] | None:
    """The per-row temperatures of the returned logprobs: None when every row is raw (the untouched fast path)."""
    ts = [p.temperature if p.tempered_logprobs and p.temperature > 0 else 1.0 for p in params]
    return None if all(t == 1.0 for t in ts) else ts


def sample_on_device(logits: torch.Tensor, params: list[SamplingParams], seeds: list[int], positions: list[int]):
    """logits [R, V] fp32 -> (tokens [R] long, logprobs [R] fp32 as in `sample`), on the logits' device. Row r's token is
    Gumbel-max over its filtered logits keyed by (seeds[r], positions[r]). The rows' temperatures and keys go
    to the device in one transfer; top-k / top-p rows get their threshold from device ops, one row at a time."""
    r = len(params)
    keys = [row_key(sd, pos) for sd, pos in zip(seeds, positions)]
    meta = torch.tensor([[float(p.temperature) for p in params], [k[0] for k in keys], [k[1] for k in keys]],
                        dtype=torch.float64).to(logits.device, non_blocking=True)
    temperature, k1, k2 = meta[0].float(), meta[1].long(), meta[2].long()
    threshold = torch.full((r,), float("-inf"), device=logits.device)
    for i, p in enumerate(params):
        if p.temperature > 0 and (0 < p.top_k < logits.shape[1] or p.top_p < 1.0):
            threshold[i : i + 1] = nucleus_threshold(logits[i].float() / temperature[i], p.top_k, p.top_p)
    tokens = gumbel_argmax(logits, temperature, threshold, k1, k2)
    return tokens, token_logprobs(logits, tokens, logprob_temperatures(params))
