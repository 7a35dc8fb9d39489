import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def single_thread():
    """The models here are tiny: intra-op threads only add overhead, and stall badly on a busy machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
