import pytest
import torch

from zeromismatch.models.qwen3_5 import build_model


@pytest.fixture(scope="session")
def tiny_models():
    """Random-weight tiny models, one per (preset, numerics), built once per test session."""
    cache = {}

    def get(preset="tiny", numerics="bi", seed=1):
        key = (preset, numerics, seed)
        if key not in cache:
            cache[key] = build_model(preset, numerics, seed=seed).eval()
        return cache[key]

    return get


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
