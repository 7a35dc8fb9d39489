"""A built-in toy task for controller tests and quick experiments: random-token prompts, reward 1 when the
response starts with a token from the lower half of the vocabulary. Learnable in a few steps by a random
tiny model, with reward variance from the start (about half the samples score)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import torch

from .base import PromptItem, Task


class ToyTask(Task):
    name = "toy"

    def __init__(self, vocab_size: int, seed: int = 0, min_len: int = 4, max_len: int = 40):
        self.vocab, self.seed, self.min_len, self.max_len = vocab_size, seed, min_len, max_len

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return ()

    def _item(self, i: int) -> PromptItem:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        n = int(torch.randint(self.min_len, self.max_len + 1, (1,), generator=g))
        return PromptItem(i, torch.randint(0, self.vocab, (n,), generator=g).tolist(), "low")

    def train_prompts(self, start: int = 0) -> Iterator[PromptItem]:
        return (self._item(i) for i in itertools.count(start))

    def eval_prompts(self) -> list[PromptItem]:
        return [self._item(-1 - i) for i in range(16)]

    def reward(self, response_ids: Sequence[int], gold) -> float:
        return float(bool(response_ids) and response_ids[0] < self.vocab // 2)
