"""The varlen layout's packed <-> padded maps: zeros at padding, exact round trips, and no copy where there is
no padding (a decode step, a one-sequence training microbatch)."""

import pytest
import torch

from zeromismatch.ops.varlen import SeqLayout, to_padded


@pytest.mark.parametrize("cu,unpadded", [([0, 3, 4, 6], False), ([0, 1, 2, 3], True), ([0, 5], True),
                                         ([0, 2, 4, 6], True)])
def test_padded_view_round_trips_and_copies_nothing_without_padding(cu, unpadded):
    lay = SeqLayout.build(cu, start_pos=[7] * (len(cu) - 1))
    x = torch.randn(cu[-1], 3, 4, requires_grad=True)
    p = lay.to_padded(x)
    assert lay.unpadded == unpadded
    assert torch.equal(p, to_padded(x, lay.pad_index))  # the gather form, zeros at padding
    assert (p.data_ptr() == x.data_ptr()) == unpadded  # a view of the packed rows exactly when nothing is padded
    assert torch.equal(lay.to_packed(p), x)
    (p * 2).sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 2.0))


def test_decode_layout_is_unpadded():
    lay = SeqLayout.decode(torch.tensor([3, 0, 9]), max_ctx=16)
    x = torch.randn(3, 5)
    assert lay.unpadded and lay.to_padded(x).shape == (3, 1, 5)
    assert lay.to_padded(x).data_ptr() == x.data_ptr() and torch.equal(lay.to_packed(lay.to_padded(x)), x)
