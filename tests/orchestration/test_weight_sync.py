"""Weight sync by collective broadcast (orchestration/weight_sync.py): versions arrive with the weights, the
received weights are the sent ones bit for bit, and a generator samples with them what the trainer scores
(diff exactly 0 in bi). Two processes over gloo on the CPU; the GPU transports run the same check on a GPU
(docs/distributed.md)."""

import pytest
import torch

from zeromismatch.orchestration.weight_sync import _by_dtype, _unflatten, layout_of, pick_transport
from zeromismatch.orchestration.weight_sync_check import check


def test_two_processes_gloo_bitwise_in_bi():
    res = check(device="cpu", transport="gloo", numerics="bi")
    assert res["versions"] == [1, 2]
    assert res["weights_equal"] and res["logprobs_equal"] and res["max_abs_diff"] == 0.0


def test_flat_layout_round_trip_keeps_bits_and_dtypes():
    w = {"b": torch.randn(3, 4), "a": torch.arange(6, dtype=torch.int64).view(2, 3), "c": torch.randn(5).half()}
    layout = layout_of(w)
    flat = {d: torch.cat([w[k].reshape(-1) for k in names]) for d, names in _by_dtype(layout).items()}
    back = _unflatten(flat, layout)
    assert set(back) == set(w) and all(torch.equal(back[k], w[k]) and back[k].dtype == w[k].dtype for k in w)


@pytest.mark.parametrize("device,shares,expected", [("cpu", True, "gloo"), ("cuda", True, "cuda_ipc"), ("cuda:1", False, "nccl")])
def test_transport_choice(device, shares, expected):
    assert pick_transport(device, shares) == expected
