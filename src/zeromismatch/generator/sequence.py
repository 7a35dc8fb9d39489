"""A request inside the engine (Sequence) and what the engine hands back when one finishes (GenerationOutput)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .sampling import SamplingParams


@dataclass
class GenerationOutput:
    request_id: int
    prompt_ids: list[int]
    tokens: list[int]  # generated tokens of all turns (appended tool tokens are not included)
    logprobs: list[float]  # raw generator logprob of each generated token (fp32 values)
    versions: list[int]  # weight version that sampled each generated token
    admission_version: int  # weight version when the current turn was admitted
    finish_reason: str  # "stop" | "length"
    all_tokens: list[int] = field(default_factory=list)  # prompt + every turn, as the trainer will see it
    logprob_tensor: torch.Tensor | None = None  # fp32 logprobs of this turn's generated tokens, bit-exact
    # True: some token was sampled from a cache that still held entries of older weights (a 'keep' swap), so
    # no single weight version reproduces it; None: the backend cannot tell
    mixed_versions: bool | None = None


@dataclass(eq=False)
class Sequence:
    request_id: int
    prompt_ids: list[int]
    params: SamplingParams
    gen: torch.Generator
    admission_version: int
    tokens: list[int] = field(default_factory=list)
    seed: int = 0  # the device sampler's key: a token's draw is a function of (seed, its position, its logits)
    num_computed: int = 0
    slot: int = -1  # -1: holds no cache (waiting, preempted, or released)
    block_table: list[int] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # each generated token's fp32 logprob (exact as a float)
    versions: list[int] = field(default_factory=list)
    turn_start: int = 0  # index into `generated` where the current turn starts
    looked_up: bool = False
    finish_reason: str | None = None
    stale_cache: bool = False  # cache kept across a 'keep' swap: mixes weight versions, never shared
    mixed_versions: bool = False  # a token was sampled while stale_cache (sticky; see GenerationOutput)

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def num_uncomputed(self) -> int:
        return len(self.tokens) - self.num_computed
