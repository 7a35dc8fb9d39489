import torch

from zeromismatch.ops.attention import blocked_attention, sdpa_attention


def qkv(b=2, hq=4, hkv=2, t=150, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, hq, t, d, generator=g), torch.randn(b, hkv, t, d, generator=g), torch.randn(b, hkv, t, d, generator=g))


def test_blocked_matches_sdpa():
    q, k, v = qkv()
    pos = torch.arange(150).expand(2, -1)
    torch.testing.assert_close(blocked_attention(q, k, v, pos, 0.2), sdpa_attention(q, k, v, pos, 0.2), rtol=1e-5, atol=1e-5)


def test_blocked_decode_equals_full_pass_bitwise():
    """One query against the cached keys (zero beyond its context) gives the full pass's bits."""
    q, k, v = qkv()
    full = blocked_attention(q, k, v, torch.arange(150).expand(2, -1), 0.2)
    for p in (0, 5, 63, 64, 100, 149):
        live = (torch.arange(150) <= p)[None, None, :, None]
        kc, vc = torch.where(live, k, 0.0)[:, :, : p + 1], torch.where(live, v, 0.0)[:, :, : p + 1]
        one = blocked_attention(q[:, :, p : p + 1], kc, vc, torch.full((2, 1), p), 0.2)
        assert torch.equal(one[:, :, 0], full[:, :, p])
        # a batch of one, and a different partner sequence, change nothing
        alone = blocked_attention(q[1:, :, p : p + 1], kc[1:], vc[1:], torch.full((1, 1), p), 0.2)
        assert torch.equal(alone[0, :, 0], full[1, :, p])


def test_padding_queries_ignored():
    q, k, v = qkv(b=1, t=10)
    pos = torch.tensor([[0, 1, 2, -1, -1, -1, -1, -1, -1, -1]])
    out = blocked_attention(q, k, v, pos, 0.2)
    assert torch.equal(out[:, :, 3:], torch.zeros_like(out[:, :, 3:]))
