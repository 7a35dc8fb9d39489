import torch
import torch.nn.functional as F

from zeromismatch.ops import activations
from zeromismatch.ops.conv import causal_conv


def test_step_equals_full_sequence_bitwise():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 50, 40, generator=g), torch.randn(40, 4, generator=g)
    full, _ = causal_conv(x, w, activation=activations.silu)
    state, steps = None, []
    for t in range(50):
        y, state = causal_conv(x[:, t : t + 1], w, state, activation=activations.silu)
        steps.append(y)
    assert torch.equal(torch.cat(steps, 1), full)
    # and arbitrary splits with the carried state
    a, st = causal_conv(x[:, :17], w, activation=activations.silu)
    b, _ = causal_conv(x[:, 17:], w, st, activation=activations.silu)
    assert torch.equal(torch.cat([a, b], 1), full)


def test_matches_torch_conv1d():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(2, 30, 8, generator=g), torch.randn(8, 4, generator=g)
    ref = F.conv1d(x.transpose(1, 2), w.unsqueeze(1), padding=3, groups=8)[..., :30].transpose(1, 2)
    torch.testing.assert_close(causal_conv(x, w)[0], ref, rtol=1e-6, atol=1e-6)


def test_state_respects_lengths():
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(2, 10, 6, generator=g), torch.randn(6, 4, generator=g)
    _, st = causal_conv(x, w, lengths=torch.tensor([10, 4]))
    assert torch.equal(st[0], x[0, 7:10]) and torch.equal(st[1], x[1, 1:4])


# --------------------------------------------------------------------- the CUDA kernels, interpreted

import pytest  # noqa: E402

from interpreted_helpers import interpreted_kernels  # noqa: E402
from zeromismatch.ops.conv import naive  # noqa: E402


@pytest.fixture(scope="module")
def ck():
    yield from interpreted_kernels("zeromismatch.ops.conv.triton")


def _silu(x):  # the kernel's SiLU in torch (the naive form takes the mode's; values agree to a few ulps)
    return (x.float() / (1 + torch.exp(-x.float()))).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_torch_form_and_steps_equal_full(ck, dtype):
    g = torch.Generator().manual_seed(3)
    b, t, c, w = 3, 37, 200, 4  # T and C not multiples of the kernel's tiles
    x, wt = torch.randn(b, t, c, generator=g).to(dtype), torch.randn(c, w, generator=g).to(dtype)
    full = ck.conv(x, wt, None, None, True)
    ref, ref_state = naive.causal_conv(x, wt, None, _silu)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=8e-3, atol=8e-3)
    torch.testing.assert_close(full, ref, **tol)
    assert torch.equal(ck.conv(x, wt, None, None, False), naive.causal_conv(x, wt)[0])  # no activation: exact
    assert torch.equal(ck.next_state(x, w, None, None, None, None), ref_state)
    # from carried states held in a slot tensor, updated in place, one token at a time and in pieces
    states = torch.randn(6, w - 1, c, generator=g).to(dtype)
    states[[4, 1, 2]] = 0
    others = states[[0, 3, 5]].clone()
    slots = torch.tensor([4, 1, 2])
    steps = []
    for i in range(5):
        steps.append(ck.conv(x[:, i : i + 1], wt, states, slots, True))
        ck.next_state(x[:, i : i + 1], w, states, slots, None, out=states)
    piece = ck.conv(x[:, 5:20], wt, states, slots, True)
    assert torch.equal(torch.cat(steps + [piece], 1), full[:, :20])
    ck.next_state(x[:, 5:20], w, states, slots, None, out=states)
    assert torch.equal(states[slots], naive.causal_conv(x[:, :20], wt)[1])
    assert torch.equal(states[[0, 3, 5]], others)  # the other slots untouched


def test_kernel_state_respects_lengths_and_row_invariance(ck):
    g = torch.Generator().manual_seed(4)
    x, wt = torch.randn(3, 10, 70, generator=g), torch.randn(70, 4, generator=g)
    st0 = torch.randn(3, 3, 70, generator=g)
    lengths = torch.tensor([10, 2, 1])  # shorter than W-1: part of the old state carries over
    got = ck.next_state(x, 4, st0, None, lengths, None)
    assert torch.equal(got, naive.causal_conv(x, wt, st0, None, lengths)[1])
    full = ck.conv(x, wt, st0, None, True)
    assert torch.equal(ck.conv(x[1:2], wt, st0[1:2], None, True), full[1:2])
    # a row continued from a state: the same bits as inside the full sequence, whatever the split
    zero = ck.conv(x, wt, None, None, True)
    assert torch.equal(ck.conv(x[:, 3:], wt, x[:, :3], None, True), zero[:, 3:])
