"""The batch-invariant CPU building blocks: a row's bits never depend on the other rows of the call."""

import pytest
import torch
import torch.nn.functional as F

from zeromismatch.ops import activations
from zeromismatch.ops.gdn.naive import recurrent_step
from zeromismatch.ops.linear import cpu as linear_cpu


@pytest.mark.parametrize("k,n", [(256, 768), (768, 256), (256, 2048), (64, 4), (256, 1)])
def test_linear_rows_do_not_depend_on_batch(k, n):
    g = torch.Generator().manual_seed(k * n)
    w = torch.randn(n, k, generator=g)
    pool = torch.randn(400, k, generator=g)
    ref = torch.cat([linear_cpu.linear(pool[i : i + 1], w) for i in range(len(pool))])
    for m in [2, 3, 31, 32, 33, 64, 100, 257, 400, 1500]:
        idx = torch.randint(0, len(pool), (m,), generator=g)
        assert torch.equal(linear_cpu.linear(pool[idx], w), ref[idx]), f"M={m}"


def test_plain_linear_is_not_batch_invariant_here():
    """Why linear_cpu.linear exists: plain F.linear's row 0 changes with the row count on this CPU."""
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(768, 256, generator=g), torch.randn(64, 256, generator=g)
    assert any(not torch.equal(F.linear(x[:m], w)[0], F.linear(x[:1], w)[0]) for m in (2, 5, 17, 64))


@pytest.mark.parametrize("fn", [activations.sigmoid, activations.silu, activations.softplus])
def test_activations_do_not_depend_on_position(fn):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5000, generator=g) * 8
    ref = fn(x)
    for n in list(range(1, 70)) + [333, 4097]:
        for off in (0, 3, 17):
            assert torch.equal(fn(x[off : off + n]), ref[off : off + n])


@pytest.mark.parametrize("fn,ref", [(activations.sigmoid, torch.sigmoid), (activations.silu, F.silu), (activations.softplus, F.softplus)])
def test_activations_match_torch(fn, ref):
    x = torch.linspace(-40, 40, 10001)
    torch.testing.assert_close(fn(x), ref(x), rtol=1e-6, atol=1e-7)


def test_row_reductions_are_row_invariant():
    g = torch.Generator().manual_seed(2)
    base = torch.randn(300, 2048, generator=g)
    ref = torch.log_softmax(base, -1)
    for m in (1, 2, 7, 64, 300):
        assert torch.equal(torch.log_softmax(base[:m], -1), ref[:m])


def test_thread_count_does_not_change_bits():
    """The RL job drops to one intra-op thread per role after the warm start: same bits either way."""
    g = torch.Generator().manual_seed(3)
    w, x = torch.randn(768, 256, generator=g), torch.randn(300, 256, generator=g)
    s = torch.randn(16, 4, 64, 64, generator=g)
    q, k, v = (torch.randn(16, 4, 64, generator=g) for _ in range(3))
    gate, beta = -torch.rand(16, 4, generator=g), torch.rand(16, 4, generator=g)
    n = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs.append((linear_cpu.linear(x, w), *recurrent_step(s, q, k, v, gate, beta)))
    finally:
        torch.set_num_threads(n)
    assert all(torch.equal(a, b) for a, b in zip(*outs))
