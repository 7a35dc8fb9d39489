"""Factories for small rollouts, shared by the rl tests (fixtures, so no test-package imports)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from zeromismatch.rl.types import Group, Sample, Turn

PROMPT = [101, 102]
TOOL_TOKEN = 7


def build_sample(
    reward: float = 0.0,
    turn_versions: Sequence[int] = (0,),
    tokens_per_turn: int = 2,
    token_versions: Sequence[int] | None = None,
) -> Sample:
    """prompt (2 tokens), then per turn `tokens_per_turn` generated tokens, with one tool token between
    turns. Generated tokens are trained (mask 1) and, unless token_versions (one per generated token) is
    given, carry their turn's admission version."""
    ids, mask, lps, vers, turns = (
        list(PROMPT),
        [0] * len(PROMPT),
        [math.nan] * len(PROMPT),
        [-1] * len(PROMPT),
        [],
    )
    k = 0
    for i, v in enumerate(turn_versions):
        toks = [10 + k + j for j in range(tokens_per_turn)]
        turns.append(Turn(tokens=toks, admission_version=v))
        for t in toks:
            ids.append(t)
            mask.append(1)
            lps.append(-0.5)
            vers.append(v if token_versions is None else token_versions[k])
            k += 1
        if i + 1 < len(turn_versions):
            ids.append(TOOL_TOKEN)
            mask.append(0)
            lps.append(math.nan)
            vers.append(-1)
    return Sample(PROMPT, ids, mask, lps, vers, reward, turns)


def build_group(prompt_id, rewards: Sequence[float] = (0.0, 1.0), version: int = 0) -> Group:
    return Group(prompt_id, [build_sample(r, turn_versions=(version,)) for r in rewards])


@pytest.fixture
def make_sample():
    return build_sample


@pytest.fixture
def make_group():
    return build_group
