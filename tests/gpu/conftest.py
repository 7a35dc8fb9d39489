import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line("markers", "big: slow GPU tests (qwen3_5_mid parity); deselect with -m 'not big'")


def pytest_collection_modifyitems(config, items):
    """GPU tests skip cleanly on machines without CUDA (CPU CI)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
