"""ops/fused on the GPU: a row's bits do not depend on the call's row count, the row's position or the input's
strides (what lets trainer and generator share these kernels in every mode), values close to the torch forms
(tolerances stated), bf16 RoPE bitwise equal to them, and gradients through the torch forms."""

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu
DEV = "cuda"
BF16_TOL = dict(rtol=8e-3, atol=8e-3)  # one bf16 ulp where exp / rsqrt differ from torch's in the last fp32 bits


def _randn(*shape, seed, dtype=torch.bfloat16, scale=1.0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return (torch.randn(*shape, device=DEV, generator=g) * scale).to(dtype)


ROW_SETS = (slice(0, 1), slice(4095, 4096), slice(17, 18), slice(3, 700), slice(0, 2048))


@pytest.mark.parametrize("d", [128, 256, 4096, 2560, 5000])
def test_rms_norm_row_invariant_and_close(d):
    from zeromismatch.ops.fused import naive, triton as k

    x, w = _randn(4096, d, seed=1, scale=3), _randn(d, seed=2, scale=0.2)
    full = k.rms_norm(x, w, 1e-6)
    for rows in ROW_SETS:
        assert torch.equal(k.rms_norm(x[rows], w, 1e-6), full[rows]), rows
    torch.testing.assert_close(full, naive.rms_norm(x, w, 1e-6), **BF16_TOL)
    if d in (128, 256):  # q / k norms: head views of a wider projection, read in place
        proj = _randn(1024, 40 * d, seed=3, scale=3)
        heads = proj.view(1024, 40, d)[:, 8:24]
        got = k.rms_norm(heads, w, 1e-6)
        assert torch.equal(got, k.rms_norm(heads.contiguous(), w, 1e-6))
        assert torch.equal(k.rms_norm(heads[5:6], w, 1e-6), got[5:6])
        assert torch.equal(got.view(-1, d)[:7], k.rms_norm(heads.reshape(-1, d)[:7], w, 1e-6))


@pytest.mark.parametrize("d", [128, 256])
def test_gated_rms_norm_row_invariant_and_close(d):
    from zeromismatch.ops.fused import naive, triton as k

    x = _randn(4096, d, seed=4, dtype=torch.float32, scale=2)
    z, w = _randn(4096, d, seed=5, scale=3), _randn(d, seed=6)
    full = k.gated_rms_norm(x, z, w, 1e-6)
    for rows in ROW_SETS:
        assert torch.equal(k.gated_rms_norm(x[rows], z[rows], w, 1e-6), full[rows]), rows
    zw = torch.cat([z, z], 1)[:, d:]
    assert torch.equal(k.gated_rms_norm(x, zw, w, 1e-6), full)
    ref = naive.gated_rms_norm(x, z, w, 1e-6, F.silu)
    torch.testing.assert_close(full, ref, **BF16_TOL)
    assert (full == ref).float().mean() > 0.95


def test_gdn_gates_element_invariant_and_close():
    from zeromismatch.ops.fused import naive, triton as k

    a, b = _randn(3000, 32, seed=7, scale=12), _randn(3000, 32, seed=8, scale=6)
    a_log, dt = _randn(32, seed=9, dtype=torch.float32), _randn(32, seed=10, dtype=torch.float32, scale=4)
    g, beta = k.gdn_gates(a, b, a_log, dt)
    for rows in (slice(0, 1), slice(2999, 3000), slice(5, 900)):
        g1, b1 = k.gdn_gates(a[rows], b[rows], a_log, dt)
        assert torch.equal(g1, g[rows]) and torch.equal(b1, beta[rows]), rows
    ab = torch.cat([a, b], 1)  # a and b as column slices of one projection
    g2, b2 = k.gdn_gates(ab[:, :32], ab[:, 32:], a_log, dt)
    assert torch.equal(g2, g) and torch.equal(b2, beta)
    rg, rbeta = naive.gdn_gates(a, b, a_log, dt, F.softplus, torch.sigmoid)
    torch.testing.assert_close(g, rg, rtol=4e-6, atol=1e-30)
    torch.testing.assert_close(beta, rbeta, rtol=4e-6, atol=1e-7)


@pytest.mark.parametrize("d,half", [(128, 64), (256, 32)])  # full rotary; partial (Qwen3.5: 64 of 256 dims)
def test_rope_bitwise_torch_form_and_row_invariant(d, half):
    from zeromismatch.ops.fused import naive, triton as k

    n, h, p = 2000, 8, 8192
    inv = 1.0 / (10000 ** (torch.arange(half, device=DEV, dtype=torch.float32) / half))
    ang = torch.arange(p, device=DEV, dtype=torch.float32)[:, None] * inv
    cos, sin = ang.cos(), ang.sin()
    pos = torch.randint(0, p, (n,), device=DEV, generator=torch.Generator(device=DEV).manual_seed(11))
    x = _randn(n, 3 * h * d, seed=12).view(n, 3 * h, d)[:, h : 2 * h]
    full = k.rope(x, pos, cos, sin)
    assert torch.equal(full, naive.rope(x, pos, cos, sin))
    for rows in (slice(0, 1), slice(1999, 2000), slice(3, 700)):
        assert torch.equal(k.rope(x[rows], pos[rows], cos, sin), full[rows]), rows


def test_dispatch_gradients_match_the_torch_forms():
    from zeromismatch.ops import fused
    from zeromismatch.ops.fused import naive

    x, w = _randn(64, 256, seed=13).requires_grad_(), _randn(256, seed=14).requires_grad_()
    dy = _randn(64, 256, seed=15)
    got = torch.autograd.grad(fused.rms_norm(x, w, 1e-6), (x, w), dy)
    want = torch.autograd.grad(naive.rms_norm(x, w, 1e-6), (x, w), dy)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("c", [8192, 6144 + 40])
def test_conv_steps_equal_the_full_sequence_and_close_to_torch(c):
    """ops/conv's kernels: decode steps and prefill pieces from slot states (updated in place) give the full
    sequence's bits; a row alone the batch's; values close to the torch form."""
    from zeromismatch.ops.conv import naive, triton as k

    b, t, w = 4, 300, 4
    x, wt = _randn(b, t, c, seed=16, scale=2), _randn(c, w, seed=17, scale=0.5)
    full = k.conv(x, wt, None, None, True)
    torch.testing.assert_close(full, naive.causal_conv(x, wt, None, F.silu)[0], **BF16_TOL)
    assert torch.equal(k.conv(x, wt, None, None, False), naive.causal_conv(x, wt)[0])  # products and sums: exact
    states = torch.zeros(9, w - 1, c, device=DEV, dtype=x.dtype)
    slots = torch.tensor([7, 0, 3, 5], device=DEV)
    pieces, pos = [], 0
    for n in (1, 1, 63, 1, 130, 1, 1, 102):
        pieces.append(k.conv(x[:, pos : pos + n], wt, states, slots, True))
        k.next_state(x[:, pos : pos + n], w, states, slots, None, out=states)
        pos += n
    assert pos == t and torch.equal(torch.cat(pieces, 1), full)
    assert torch.equal(states[slots], naive.causal_conv(x, wt)[1])
    assert torch.equal(k.conv(x[2:3], wt, None, None, True), full[2:3])


@pytest.mark.parametrize("act", ["silu", "sigmoid"])
def test_gated_element_invariant_and_close(act):
    from zeromismatch.ops.fused import naive, triton as k

    n, h, d = 3000, 16, 256
    x, proj = _randn(n, h * d, seed=18, scale=2), _randn(n, h * 2 * d, seed=19, scale=4)
    gate = proj.view(n, h, 2 * d)[..., d:]
    full = k.gated(x, gate, act)
    for rows in (slice(0, 1), slice(2999, 3000), slice(7, 900)):
        assert torch.equal(k.gated(x[rows], gate[rows], act), full[rows]), rows
    assert torch.equal(k.gated(x, gate.contiguous().view(n, -1), act), full)
    ref = naive.gated(x, gate, F.silu if act == "silu" else torch.sigmoid)
    torch.testing.assert_close(full, ref, **BF16_TOL)
    assert (full == ref).float().mean() > 0.95


def test_gated_reads_a_merged_projection_in_place():
    """The MLP's [gate | up] GEMM output, both halves strided row views: the same bits as dense copies and per row."""
    from zeromismatch.ops.fused import triton as k

    n, f = 3000, 12288
    gate, up = _randn(n, 2 * f, seed=20, scale=3).split(f, dim=-1)
    full = k.gated(up, gate, "silu")
    assert torch.equal(full, k.gated(up.contiguous(), gate.contiguous(), "silu"))
    for rows in (slice(0, 1), slice(2999, 3000), slice(7, 900)):
        assert torch.equal(k.gated(up[rows], gate[rows], "silu"), full[rows]), rows


def test_qk_l2norm_row_invariant_and_close():
    from zeromismatch.ops.fused import naive, triton as k

    b, t, h, d, hv = 3, 700, 16, 128, 32
    mixed = _randn(b, t, 2 * h * d + 4096, seed=20, scale=3)
    q, kk = mixed[..., : h * d].unflatten(-1, (h, d)), mixed[..., h * d : 2 * h * d].unflatten(-1, (h, d))
    gq, gk = k.qk_l2norm(q, kk, hv)
    rq, rk = naive.qk_l2norm(q, kk, hv)
    torch.testing.assert_close(gq, rq, rtol=2e-6, atol=1e-7)
    torch.testing.assert_close(gk, rk, rtol=2e-6, atol=1e-7)
    for sl in (slice(0, 1), slice(699, 700), slice(64, 128)):  # a decode token, a prefill piece
        oq, ok = k.qk_l2norm(q[1:2, sl], kk[1:2, sl], hv)
        assert torch.equal(oq, gq[1:2, :, sl]) and torch.equal(ok, gk[1:2, :, sl])
