import importlib.util

import pytest
import torch

from zeromismatch.models.qwen3_5 import build_model


def _import_triton_interpreted() -> None:
    """Where triton is installed and no GPU is (the `interpret` extra), import it under its interpreter first.
    Triton decides at decoration time whether a @triton.jit function is interpreted, its own standard library
    (tl.zeros, tl.cdiv, ...) included, at its first import: if another library imported it first (transformers
    does), an interpreted kernel calling tl.zeros fails ("Cannot call @triton.jit'd outside of the scope of a
    kernel"). TRITON_INTERPRET is restored, so zeromismatch.ops keeps its CPU forms; the interpreted tests
    (tests/ops/test_moe.py, test_interpreter.py) set it again around their own kernels."""
    if torch.cuda.is_available() or importlib.util.find_spec("triton") is None:
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        import triton.language  # noqa: F401


_import_triton_interpreted()


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
