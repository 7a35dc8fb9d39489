"""ops/fused: the Triton kernels (interpreted here; compiled in tests/gpu) against the torch forms they replace,
row invariance (a row's bits do not depend on the call's row count, its position or the input's strides), and
gradients through backward_through."""

import pytest
import torch
import torch.nn.functional as F

from interpreted_helpers import interpreted_kernels
from zeromismatch.ops import fused
from zeromismatch.ops.autograd import backward_through
from zeromismatch.ops.fused import naive

# the kernels' exp / rsqrt / division are the GPU's (here numpy's), so values agree with torch to a few ulps;
# a bf16 output can then differ by one bf16 ulp where the fp32 value sits near a rounding boundary
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.bfloat16: dict(rtol=8e-3, atol=8e-3)}


@pytest.fixture(scope="module")
def fk():
    yield from interpreted_kernels("zeromismatch.ops.fused.triton")


def _randn(*shape, seed, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def test_cpu_dispatch_is_the_torch_form():
    x, w = _randn(5, 12, seed=0), _randn(12, seed=1)
    assert torch.equal(fused.rms_norm(x, w, 1e-6), naive.rms_norm(x, w, 1e-6))
    a, b, al, dt = _randn(5, 4, seed=2), _randn(5, 4, seed=3), _randn(4, seed=4), _randn(4, seed=5)
    for got, ref in zip(fused.gdn_gates(a, b, al, dt, F.softplus, torch.sigmoid),
                        naive.gdn_gates(a, b, al, dt, F.softplus, torch.sigmoid)):
        assert torch.equal(got, ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [16, 40, 1500])  # 1500: wider than one block, not a power of two
def test_rms_norm_matches_torch_and_is_row_invariant(fk, dtype, d):
    x, w = _randn(37, d, seed=6, dtype=dtype, scale=3), _randn(d, seed=7, dtype=dtype, scale=0.2)
    full = fk.rms_norm(x, w, 1e-6)
    torch.testing.assert_close(full, naive.rms_norm(x, w, 1e-6), **TOL[dtype])
    for rows in (slice(0, 1), slice(36, 37), slice(5, 22)):
        assert torch.equal(fk.rms_norm(x[rows], w, 1e-6), full[rows])
    # 3-d input: [N, H, D] rows in order
    assert torch.equal(fk.rms_norm(x[:36].view(12, 3, d), w, 1e-6), full[:36].view(12, 3, d))


def test_rms_norm_reads_a_strided_head_view_in_place(fk):
    """q / k heads are views of one projection output: [N, H, D] with a token stride wider than H * D."""
    proj = _randn(9, 7 * 32, seed=8, dtype=torch.bfloat16, scale=2)
    heads = proj.view(9, 7, 32)[:, 2:6]  # not contiguous
    w = _randn(32, seed=9, dtype=torch.bfloat16, scale=0.2)
    got = fk.rms_norm(heads, w, 1e-6)
    assert got.shape == heads.shape and got.is_contiguous()
    assert torch.equal(got, fk.rms_norm(heads.contiguous(), w, 1e-6))
    torch.testing.assert_close(got, naive.rms_norm(heads, w, 1e-6), **TOL[torch.bfloat16])


@pytest.mark.parametrize("zdtype", [torch.float32, torch.bfloat16])
def test_gated_rms_norm_matches_torch_and_is_row_invariant(fk, zdtype):
    d = 48
    x = _randn(21, d, seed=10, scale=2)  # the core output is fp32 in every mode
    z, w = _randn(21, d, seed=11, dtype=zdtype, scale=3), _randn(d, seed=12, dtype=zdtype)
    full = fk.gated_rms_norm(x, z, w, 1e-6)
    assert full.dtype == zdtype
    ref = naive.gated_rms_norm(x, z, w, 1e-6, F.silu)
    torch.testing.assert_close(full, ref, **TOL[zdtype])
    if zdtype == torch.bfloat16:  # each bf16 rounding step is torch's (exp / rsqrt are not): nearly all exact
        assert (full == ref).float().mean() > 0.95
    for rows in (slice(0, 1), slice(20, 21), slice(3, 11)):
        assert torch.equal(fk.gated_rms_norm(x[rows], z[rows], w, 1e-6), full[rows])
    zs = torch.cat([z, z], 1)[:, d:]  # strided z rows
    assert torch.equal(fk.gated_rms_norm(x, zs, w, 1e-6), full)


def test_gdn_gates_match_torch_across_the_softplus_threshold(fk):
    n, hv = 29, 6
    a = _randn(n, hv, seed=13, dtype=torch.bfloat16, scale=12)  # spans x > 20 and very negative x
    b = _randn(n, hv, seed=14, dtype=torch.bfloat16, scale=6)
    a_log, dt = _randn(hv, seed=15), _randn(hv, seed=16, scale=4)
    g, beta = fk.gdn_gates(a, b, a_log, dt)
    rg, rbeta = naive.gdn_gates(a, b, a_log, dt, F.softplus, torch.sigmoid)
    assert (a.float() + dt > 20).any() and (a.float() + dt < -15).any()
    torch.testing.assert_close(g, rg, rtol=2e-6, atol=1e-30)
    torch.testing.assert_close(beta, rbeta, rtol=2e-6, atol=1e-7)
    g1, b1 = fk.gdn_gates(a[7:8], b[7:8], a_log, dt)
    assert torch.equal(g1, g[7:8]) and torch.equal(b1, beta[7:8])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d,half", [(16, 8), (32, 8)])  # full and partial rotary (the rest passes through)
def test_rope_matches_torch_and_is_row_invariant(fk, dtype, d, half):
    n, h, p = 11, 3, 64
    inv = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32) / half))
    ang = torch.arange(p, dtype=torch.float32)[:, None] * inv
    cos, sin = ang.cos(), ang.sin()
    pos = torch.randint(0, p, (n,), generator=torch.Generator().manual_seed(17))
    proj = _randn(n, (h + 2) * d, seed=18, dtype=dtype)
    x = proj.view(n, h + 2, d)[:, 1 : 1 + h]  # a head view, as attention passes q and k
    full = fk.rope(x, pos, cos, sin)
    ref = naive.rope(x, pos, cos, sin)
    assert torch.equal(full[..., 2 * half :], x[..., 2 * half :])
    # the products and sums are torch's IEEE operations, each rounded to x's dtype (on the GPU an fp32 product may
    # be contracted into an FMA; a bf16 one is rounded first, so bf16 is bitwise there too: tests/gpu)
    assert torch.equal(full, ref)
    assert torch.equal(fk.rope(x[4:5], pos[4:5], cos, sin), full[4:5])


def test_gradients_flow_through_the_torch_forms(fk):
    x, w = _randn(6, 24, seed=19).requires_grad_(), _randn(24, seed=20).requires_grad_()
    y = backward_through(lambda x, w: fk.rms_norm(x, w, 1e-6), lambda x, w: naive.rms_norm(x, w, 1e-6), x, w)
    ref = naive.rms_norm(x, w, 1e-6)
    dy = _randn(6, 24, seed=21)
    for a, b in zip(torch.autograd.grad(y, (x, w), dy), torch.autograd.grad(ref, (x, w), dy)):
        assert torch.equal(a, b)
    a, b = _randn(4, 3, seed=22).requires_grad_(), _randn(4, 3, seed=23).requires_grad_()
    al, dt = _randn(3, seed=24).requires_grad_(), _randn(3, seed=25).requires_grad_()
    ref_fn = lambda *t: naive.gdn_gates(*t, F.softplus, torch.sigmoid)  # noqa: E731
    g, beta = backward_through(fk.gdn_gates, ref_fn, a, b, al, dt)
    rg, rbeta = ref_fn(a, b, al, dt)
    got = torch.autograd.grad(g.sum() + 2 * beta.sum(), (a, b, al, dt))
    want = torch.autograd.grad(rg.sum() + 2 * rbeta.sum(), (a, b, al, dt))
    for u, v in zip(got, want):
        assert torch.equal(u, v)


@pytest.mark.parametrize("act", ["silu", "sigmoid"])
def test_gated_matches_torch_and_reads_a_head_view(fk, act):
    fn = F.silu if act == "silu" else torch.sigmoid
    x = _randn(13, 6 * 24, seed=26, dtype=torch.bfloat16, scale=2)
    proj = _randn(13, 6 * 48, seed=27, dtype=torch.bfloat16, scale=4)
    gate = proj.view(13, 6, 48)[..., 24:]  # the gate half of each head, a strided view
    got = fk.gated(x, gate, act)
    ref = naive.gated(x, gate, fn)
    torch.testing.assert_close(got, ref, **TOL[torch.bfloat16])
    assert (got == ref).float().mean() > 0.95  # the roundings are torch's; exp is not
    assert torch.equal(fk.gated(x, gate.contiguous().view(13, -1), act), got)  # the same values, dense
    assert torch.equal(fk.gated(x[5:6], gate[5:6], act), got[5:6])
    with pytest.raises(ValueError, match="act='tanh'"):
        fk.gated(x, gate, "tanh")


@pytest.mark.parametrize("rows", [1, 13])
def test_gated_reads_both_halves_of_a_merged_projection_in_place(fk, rows):
    """The MLP's [gate | up] GEMM output: both halves are strided row views; same bits as from dense copies."""
    y = _randn(rows, 2 * 40, seed=28, dtype=torch.bfloat16, scale=3)
    gate, up = y.split(40, dim=-1)
    got = fk.gated(up, gate, "silu")
    assert got.shape == (rows, 40) and got.is_contiguous()
    assert torch.equal(got, fk.gated(up.contiguous(), gate.contiguous(), "silu"))
    torch.testing.assert_close(got, naive.gated(up, gate, F.silu), **TOL[torch.bfloat16])


def test_qk_l2norm_matches_torch_and_is_row_invariant(fk):
    b, t, h, k, hv = 2, 9, 2, 40, 6  # 3 value heads per key head; K not a power of two
    mixed = _randn(b, t, 2 * h * k + 5, seed=28, dtype=torch.bfloat16, scale=3)  # q | k | more, as the conv output
    q, kk = mixed[..., : h * k].unflatten(-1, (h, k)), mixed[..., h * k : 2 * h * k].unflatten(-1, (h, k))
    gq, gk = fk.qk_l2norm(q, kk, hv)
    rq, rk = naive.qk_l2norm(q, kk, hv)
    assert gq.shape == (b, hv, t, k) and gq.dtype == torch.float32
    torch.testing.assert_close(gq, rq, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(gk, rk, rtol=1e-6, atol=1e-7)
    one_q, one_k = fk.qk_l2norm(q[1:, 4:5], kk[1:, 4:5], hv)  # one token of one sequence
    assert torch.equal(one_q, gq[1:, :, 4:5]) and torch.equal(one_k, gk[1:, :, 4:5])
