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
