"""The bi modes' CUDA attention (ops/attention/flash_triton.py): accuracy against SDPA (tolerances stated), and
the bitwise facts parity rests on, at the published head shapes (16 query / 4 or 2 KV heads, head dim 256) and
small ones: a query's bits depend on its position alone, not on the tile, the launch settings, the prefill piece
or decode step that computes it, the other sequences, or what the cache holds past its position."""

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu
DEV = "cuda"
SHAPES = [(16, 4, 256), (16, 2, 256), (4, 2, 64), (3, 1, 40)]  # (query heads, KV heads, head dim)


def _qkv(b, hq, hkv, t, d, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return tuple(torch.randn(b, h, t, d, device=DEV, generator=g).to(dtype) for h in (hq, hkv, hkv))


@pytest.mark.parametrize("hq,hkv,d", SHAPES)
def test_matches_sdpa_and_zeroes_padding(hq, hkv, d):
    from zeromismatch.ops.attention import sdpa_attention
    from zeromismatch.ops.attention.flash_triton import attention_fwd

    for dtype, tol in ((torch.bfloat16, 2e-2), (torch.float32, 1e-5)):
        q, k, v = _qkv(2, hq, hkv, 300, d, dtype, seed=1)
        pos = torch.arange(300, device=DEV).expand(2, -1).clone()
        pos[1, 250:] = -1
        out = attention_fwd(q, k, v, pos, d**-0.5).float()
        ref = sdpa_attention(*(x.float() for x in (q, k, v)), pos, d**-0.5)
        for i, n in ((0, 300), (1, 250)):
            rel = float((out[i, :, :n] - ref[i, :, :n]).norm() / ref[i, :, :n].norm())
            assert rel < tol, (dtype, i, rel)
        assert torch.equal(out[1, :, 250:], torch.zeros_like(out[1, :, 250:]))


@pytest.mark.parametrize("hq,hkv,d", SHAPES)
def test_decode_prefill_pieces_and_batches_equal_the_full_pass(hq, hkv, d):
    from zeromismatch.ops.attention.flash_triton import attention_fwd

    t = 200
    q, k, v = _qkv(3, hq, hkv, t, d, seed=2)
    full = attention_fwd(q, k, v, torch.arange(t, device=DEV).expand(3, -1), 0.07)
    width = 320  # a CUDA-graph bucket wider than any context here; NaN past each query's position
    for p in (0, 1, 63, 64, 65, 127, 150, 199):
        live = (torch.arange(width, device=DEV) <= p)[None, None, :, None]
        kc = torch.where(live, F.pad(k, (0, 0, 0, width - t)), float("nan"))
        vc = torch.where(live, F.pad(v, (0, 0, 0, width - t)), float("nan"))
        one = attention_fwd(q[:, :, p : p + 1], kc, vc, torch.full((3, 1), p, device=DEV), 0.07)
        assert torch.equal(one[:, :, 0], full[:, :, p]), p
        alone = attention_fwd(q[2:, :, p : p + 1], kc[2:], vc[2:], torch.full((1, 1), p, device=DEV), 0.07)
        assert torch.equal(alone[0, :, 0], full[2, :, p]), p
    # decode rows at different positions in one call
    ps = torch.tensor([7, 130, 64], device=DEV)
    mixed = attention_fwd(q[torch.arange(3), :, ps][:, :, None], k, v, ps[:, None], 0.07)
    assert torch.equal(mixed[:, :, 0], full[torch.arange(3), :, ps])
    for start, n in ((0, 5), (37, 100), (64, 136), (199, 1)):
        piece = attention_fwd(q[:, :, start : start + n], k[:, :, : start + n], v[:, :, : start + n],
                              torch.arange(start, start + n, device=DEV).expand(3, -1), 0.07)
        assert torch.equal(piece, full[:, :, start : start + n]), start
    # a sequence packed beside a longer one (the trainer's padded batch)
    pos = torch.arange(t, device=DEV).expand(2, -1).clone()
    pos[1, 120:] = -1
    two = attention_fwd(torch.stack([q[0], q[1]]), k[:2], v[:2], pos, 0.07)
    assert torch.equal(two[0], full[0]) and torch.equal(two[1, :, :120], full[1, :, :120])


@pytest.mark.parametrize("hq,hkv,d", SHAPES[:2] + SHAPES[3:])
def test_every_launch_setting_gives_the_same_bits(hq, hkv, d):
    """The tile height (16 to 128 rows: mma.sync or wgmma), warps and pipeline stages change no bit."""
    from zeromismatch.ops.attention.flash_triton import attention_fwd

    q, k, v = _qkv(2, hq, hkv, 260, d, seed=3)
    pos = torch.arange(260, device=DEV).expand(2, -1)
    ref = attention_fwd(q, k, v, pos, 0.06)
    for rows in (16, 32, 64, 128):
        for warps in (4, 8):
            for stages in (1, 2, 3):  # a setting that does not fit the shared memory runs a smaller one
                got = attention_fwd(q, k, v, pos, 0.06, rows=rows, num_warps=warps, num_stages=stages)
                assert torch.equal(got, ref), (rows, warps, stages)
    one = attention_fwd(q[:, :, 200:201], k, v, pos[:, 200:201], 0.06)
    for warps in (1, 2, 8):
        got = attention_fwd(q[:, :, 200:201], k, v, pos[:, 200:201], 0.06, num_warps=warps)
        assert torch.equal(got, one), warps
    assert torch.equal(one[:, :, 0], ref[:, :, 200])


def test_trains_through_sdpa():
    from zeromismatch.ops.attention import sdpa_attention
    from zeromismatch.ops.attention.flash_triton import attention

    q, k, v = (x.requires_grad_() for x in _qkv(2, 16, 4, 200, 256, seed=4))
    pos = torch.arange(200, device=DEV).expand(2, -1)
    out, ref = attention(q, k, v, pos, 0.0625, causal=True), sdpa_attention(q, k, v, pos, 0.0625, causal=True)
    assert torch.equal(out, attention(q, k, v, pos, 0.0625))  # causal changes only the backward's SDPA call
    masked = sdpa_attention(q, k, v, pos, 0.0625)
    assert float((masked - ref).float().norm() / ref.float().norm()) < 1e-2
    assert float((out - ref).float().norm() / ref.float().norm()) < 2e-2
    w = torch.randn_like(out)
    # SDPA's own backward, recomputed (its kernels may add in a run-dependent order: compared to a tolerance)
    for a, b in zip(torch.autograd.grad((out * w).sum(), (q, k, v)), torch.autograd.grad((ref * w).sum(), (q, k, v))):
        assert float((a - b).float().norm() / b.float().norm()) < 1e-3
