"""Fixtures for the generator unit tests: a *micro* hybrid (1 GDN + 1 attention layer, vocab 256) that keeps
every engine mechanism (paged KV, fp32 GDN state, prefix snapshots) but runs a step in ~15 ms on one core."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # gen_helpers, also under --import-mode=importlib
from gen_helpers import MICRO  # noqa: E402
from zeromismatch.models.qwen3_5 import build_model  # noqa: E402


@pytest.fixture(scope="session")
def micro_model():
    """micro_model(numerics="bi", seed=1): built once per (numerics, seed) and shared, so never mutate its
    weights; fresh=True builds a private copy (weight-swap tests)."""
    cache = {}

    def get(numerics="bi", seed=1, fresh=False):
        if fresh:
            return build_model("tiny", numerics, seed=seed, **MICRO).eval()
        if (numerics, seed) not in cache:
            cache[(numerics, seed)] = build_model("tiny", numerics, seed=seed, **MICRO).eval()
        return cache[(numerics, seed)]

    return get
