import pytest
import torch
import torch.nn.functional as F

from interpreted_helpers import interpreted_kernels
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


# ------------------------------------------------------------- the CUDA kernel (flash_triton.py), interpreted


@pytest.fixture(scope="module")
def flash():
    """flash_triton with its kernel interpreted (TRITON_INTERPRET is read when a kernel is decorated and at
    launch) and tl.dot as a sequential chain (ops.interpreter): the kernel's logic on the CPU; its tensor-core bits
    are checked on the GPU (tests/gpu/test_gpu_attention.py)."""
    yield from interpreted_kernels("zeromismatch.ops.attention.flash_triton")


@pytest.mark.parametrize("hq,hkv,d", [(4, 2, 32), (3, 1, 40), (2, 2, 16)])
def test_flash_matches_sdpa_and_zeroes_padding(flash, hq, hkv, d):
    q, k, v = qkv(hq=hq, hkv=hkv, t=150, d=d, seed=3)
    pos = torch.arange(150).expand(2, -1).clone()
    pos[1, 140:] = -1  # a shorter second sequence: padded queries
    out = flash.attention_fwd(q, k, v, pos, 0.2)
    ref = sdpa_attention(q, k, v, pos, 0.2)
    torch.testing.assert_close(out[0], ref[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[1, :, :140], ref[1, :, :140], rtol=1e-5, atol=1e-5)
    assert torch.equal(out[1, :, 140:], torch.zeros_like(out[1, :, 140:]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flash_decode_and_prefill_pieces_equal_the_full_pass(flash, dtype):
    """A query alone (decode: its cache holds NaN past its position, read up to a wider bucket), or in a prefill
    piece starting anywhere, gives the full pass's bits; so do other tile heights and warp counts."""
    q, k, v = (x.to(dtype) for x in qkv(hq=4, hkv=2, t=150, d=32, seed=4))
    full = flash.attention_fwd(q, k, v, torch.arange(150).expand(2, -1), 0.2)
    for p in (0, 5, 63, 64, 100, 149):
        live = (torch.arange(192) <= p)[None, None, :, None]
        kc = torch.where(live, F.pad(k, (0, 0, 0, 42)), float("nan"))
        vc = torch.where(live, F.pad(v, (0, 0, 0, 42)), float("nan"))
        one = flash.attention_fwd(q[:, :, p : p + 1], kc, vc, torch.full((2, 1), p), 0.2)
        assert torch.equal(one[:, :, 0], full[:, :, p]), p
        alone = flash.attention_fwd(q[1:, :, p : p + 1], kc[1:], vc[1:], torch.full((1, 1), p), 0.2)
        assert torch.equal(alone[0, :, 0], full[1, :, p]), p
    for start, n in ((0, 7), (37, 50), (64, 86)):
        piece = flash.attention_fwd(q[:, :, start : start + n], k[:, :, : start + n], v[:, :, : start + n],
                                    torch.arange(start, start + n).expand(2, -1), 0.2)
        assert torch.equal(piece, full[:, :, start : start + n]), start
    for rows, warps in ((16, 1), (32, 2), (128, 8)):
        other = flash.attention_fwd(q, k, v, torch.arange(150).expand(2, -1), 0.2, rows=rows, num_warps=warps)
        assert torch.equal(other, full), rows


def test_flash_trains_through_sdpa(flash):
    q, k, v = (x.requires_grad_() for x in qkv(hq=4, hkv=2, t=70, d=16, seed=5))
    pos = torch.arange(70).expand(2, -1)
    out = flash.attention(q, k, v, pos, 0.2)
    ref = sdpa_attention(q, k, v, pos, 0.2)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    w = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad((out * w).sum(), (q, k, v)), torch.autograd.grad((ref * w).sum(), (q, k, v))):
        assert torch.equal(a, b)


def test_flash_falls_back_to_tiles_that_fit(flash, monkeypatch):
    """A launch setting whose tiles do not fit the shared memory (fp32 at head dim 256 on the GPU) falls back to
    smaller tiles and fewer stages, remembered per shape: the same bits (any tile gives them)."""
    from triton.runtime.errors import OutOfResources

    q, k, v = qkv(hq=4, hkv=2, t=100, d=32, seed=6)
    pos = torch.arange(100).expand(2, -1)
    ref = flash.attention_fwd(q, k, v, pos, 0.2, rows=16, num_stages=1)
    kernel, tried = flash._attention_kernel, []

    class Small:  # launches only 32-row tiles at one stage, as a smaller shared memory would
        def __getitem__(self, grid):
            def launch(*args, **kw):
                tried.append((kw["BM"], kw["num_stages"]))
                if kw["BM"] > 32 or kw["num_stages"] > 1:
                    raise OutOfResources(1, 0, "shared memory")
                return kernel[grid](*args, **kw)
            return launch

    monkeypatch.setattr(flash, "_attention_kernel", Small())
    monkeypatch.setattr(flash, "_FITS", {})
    assert torch.equal(flash.attention_fwd(q, k, v, pos, 0.2, rows=128, num_stages=2), ref)
    assert tried == [(128, 2), (128, 1), (64, 2), (64, 1), (32, 2), (32, 1)]
    tried.clear()
    assert torch.equal(flash.attention_fwd(q, k, v, pos, 0.2, rows=128, num_stages=2), ref)
    assert tried == [(32, 1)]  # remembered
