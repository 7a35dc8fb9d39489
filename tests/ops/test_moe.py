"""Routed experts (ops/moe): the device routing's groups and tile table; the CPU form equals the naive per-expert
loop bit for bit and is batch-invariant (a token's output bits depend on its own row only, whatever else shares
the call, experts without tokens included); stock's torch._grouped_mm form (its CPU kernel) and the Triton
grouped kernels (under TRITON_INTERPRET=1, fp32) match naive forward and backward. tests/gpu/test_gpu_moe.py
runs the compiled kernels in bf16."""


import pytest
import torch
import torch.nn.functional as F

from interpreted_helpers import interpreted_kernels
from zeromismatch.ops import activations, moe
from zeromismatch.ops.linear import cpu as linear_cpu
from zeromismatch.ops.moe import cpu, grouped_mm, naive, routing

# (tokens, hidden, expert width, experts, top-k): tiny_moe's (8 experts, top-2), odd widths, k = E, one token
SHAPES = [(37, 64, 48, 8, 2), (20, 40, 24, 6, 3), (9, 33, 17, 4, 4), (1, 64, 32, 8, 2), (64, 32, 16, 16, 8)]
GRAD_TOL = dict(rtol=1e-4, atol=1e-5)  # fp32: the forms differ in their backward's summation order


def _problem(n, h, i, e, k, dtype=torch.float32, seed=0, skip=()):
    """Inputs as the model makes them: softmax router, top-k, renormalized; experts in `skip` get no token."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, h, generator=g).to(dtype)
    logits = torch.randn(n, e, generator=g)
    logits[:, list(skip)] = -1e9
    probs = torch.softmax(logits, -1)
    top_w, top_i = torch.topk(probs, k, dim=-1)
    top_w = (top_w / top_w.sum(-1, keepdim=True)).to(dtype)
    gate_up = (torch.randn(e, 2 * i, h, generator=g) * h**-0.5).to(dtype)
    down = (torch.randn(e, h, i, generator=g) * i**-0.5).to(dtype)
    return x, top_w, top_i, gate_up, down


def _invariant_cpu(*args):
    return cpu.experts(*args, linear_cpu.linear, activations.silu)


def _naive_invariant(*args):
    return naive.experts(*args, linear=linear_cpu.linear, silu=activations.silu)


# ------------------------------------------------------------------------------------------- routing


@pytest.mark.parametrize("shape", SHAPES)
def test_routing_groups_and_tiles(shape):
    n, _, _, e, k = shape
    _, top_w, top_i, _, _ = _problem(*shape, skip=(1,) if e > k else ())
    r = routing.route(top_w, top_i, e)
    counts = torch.bincount(top_i.reshape(-1), minlength=e)
    assert torch.equal(r.offsets, F.pad(torch.cumsum(counts, 0), (1, 0)))
    # grouped rows: ascending expert, within an expert ascending token; pair j of a token is its j-th smallest expert
    assert torch.equal(r.expert, torch.sort(top_i.reshape(-1)).values)
    sorted_i = torch.sort(top_i, dim=1).values.reshape(-1)
    assert torch.equal(sorted_i[r.pair], r.expert) and torch.equal(r.token, r.pair // k)
    for a, b in zip(r.offsets[:-1].tolist(), r.offsets[1:].tolist()):
        assert torch.all(r.token[a:b].diff() > 0)
    assert torch.equal(torch.sort(r.pair).values, torch.arange(n * k))
    assert torch.equal(r.top_w.reshape(-1)[r.pair], top_w[r.token, (top_i[r.token] == r.expert[:, None]).int().argmax(1)])
    for bm in (1, 4, 16, 64):
        te, ts = routing.tiles(r, bm)
        assert te.shape[0] == routing.max_tiles(n * k, e, bm)
        covered = torch.zeros(n * k, dtype=torch.int64)
        for ex, st in zip(te.tolist(), ts.tolist()):
            if ex < 0:
                continue
            end = min(st + bm, int(r.offsets[ex + 1]))
            assert int(r.offsets[ex]) <= st < end  # a tile never starts past its expert's rows
            covered[st:end] += 1
            assert torch.all(r.expert[st:end] == ex)
        assert torch.all(covered == 1)  # every grouped row in exactly one tile
        used = int((te >= 0).sum())
        assert used == int(((counts + bm - 1) // bm).sum()) and torch.all(te[used:] == -1)


# ------------------------------------------------------------------------------------------ CPU form


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_cpu_form_equals_naive_bitwise(shape, dtype):
    """Same GEMM problems on the same rows, same fp32 sums in the same order: with the invariant ops (bi) the bits
    match naive's. With torch's ops (stock) only closely: a group's rows sit at another address than naive's
    gathered copy, and MKL's and silu's vectorization depends on alignment and position."""
    args = _problem(*shape, dtype=dtype, skip=(0,) if shape[3] > shape[4] else ())
    assert torch.equal(_invariant_cpu(*args), _naive_invariant(*args))
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(cpu.experts(*args, F.linear, F.silu), naive.experts(*args), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_cpu_form_is_batch_invariant(shape, dtype):
    """A token's output bits are the same alone, in any subset, in any order, with other tokens added, and when
    the other tokens leave some experts empty."""
    n, h, i, e, k = shape
    x, top_w, top_i, gate_up, down = _problem(*shape, dtype=dtype, seed=1)
    full = _invariant_cpu(x, top_w, top_i, gate_up, down)
    g = torch.Generator().manual_seed(2)
    subsets = [torch.arange(n), torch.randperm(n, generator=g), torch.arange(n).flip(0)[: max(1, n // 3)],
               torch.tensor([n - 1]), torch.randint(0, n, (2 * n + 3,), generator=g)]  # duplicates too
    for rows in subsets:
        out = _invariant_cpu(x[rows], top_w[rows], top_i[rows], gate_up, down)
        assert torch.equal(out, full[rows])
    # add new tokens routed only to experts the others never use
    x2, w2, i2, _, _ = _problem(5, h, i, e, k, dtype=dtype, seed=3)
    both = _invariant_cpu(torch.cat([x2, x]), torch.cat([w2, top_w]), torch.cat([i2, top_i]), gate_up, down)
    assert torch.equal(both[5:], full)


def test_cpu_form_backward_matches_naive():
    for shape in SHAPES:
        x, top_w, top_i, gate_up, down = _problem(*shape, seed=4)
        leaves = [t.requires_grad_() for t in (x, top_w, gate_up, down)]
        dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(5))
        got = torch.autograd.grad(_invariant_cpu(x, top_w, top_i, gate_up, down), leaves, dy)
        ref = torch.autograd.grad(naive.experts(x, top_w, top_i, gate_up, down), leaves, dy)
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, **GRAD_TOL)


def test_numerics_dispatch_on_cpu():
    args = _problem(*SHAPES[0])
    assert torch.equal(moe.invariant(*args), _naive_invariant(*args))
    assert torch.equal(moe.stock(*args), naive.experts(*args))


# ----------------------------------------------------------------------- stock: torch._grouped_mm


@pytest.mark.skipif(not grouped_mm.AVAILABLE, reason="torch without _grouped_mm")
@pytest.mark.parametrize("shape", SHAPES)
def test_grouped_mm_form_matches_naive_forward_and_backward(shape):
    """torch._grouped_mm's CPU kernel (bf16): the offsets, transposed weight views and scatter are right, and its
    autograd gives naive's gradients (tolerance: bf16 rounding in different places)."""
    x, top_w, top_i, gate_up, down = _problem(*shape, dtype=torch.bfloat16, seed=6, skip=(2,) if shape[3] > shape[4] else ())
    leaves = [t.requires_grad_() for t in (x, top_w, gate_up, down)]
    y, ref = grouped_mm.experts(x, top_w, top_i, gate_up, down), naive.experts(x, top_w, top_i, gate_up, down)
    torch.testing.assert_close(y, ref, rtol=2e-2, atol=2e-2)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(7)).to(y.dtype)
    for a, b in zip(torch.autograd.grad(y, leaves, dy), torch.autograd.grad(ref, leaves, dy)):
        torch.testing.assert_close(a.float(), b.float(), rtol=3e-2, atol=3e-2)


# --------------------------------------------------------------------- Triton kernels, interpreted


@pytest.fixture(scope="module")
def gt():
    """grouped_triton with its kernels interpreted: TRITON_INTERPRET is read when a kernel is decorated and again
    at launch, so it stays set for this module's tests (ops.device read it at import: the other ops keep their CPU
    forms). The interpreter's fp32 tl.dot is numpy's matmul, whose BLAS blocks across rows; emulate_gpu_arithmetic
    replaces it by the sequential multiply-add chain over K that the GPU's FMA lowering runs."""
    yield from interpreted_kernels("zeromismatch.ops.moe.grouped_triton")


@pytest.mark.parametrize("shape", SHAPES[:4])
def test_triton_forward_backward_match_naive_interpreted(gt, shape):
    x, top_w, top_i, gate_up, down = _problem(*shape, seed=8, skip=(1,) if shape[3] > shape[4] else ())
    leaves = [t.requires_grad_() for t in (x, top_w, gate_up, down)]
    y, ref = gt.experts(x, top_w, top_i, gate_up, down), naive.experts(x, top_w, top_i, gate_up, down)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(9))
    for a, b in zip(torch.autograd.grad(y, leaves, dy), torch.autograd.grad(ref, leaves, dy)):
        torch.testing.assert_close(a, b, **GRAD_TOL)
    with torch.no_grad():  # the inference path (no saved activations) gives the same bits
        assert torch.equal(gt.experts(x, top_w, top_i, gate_up, down), y.detach())


def test_triton_is_batch_invariant_interpreted(gt):
    n, h, i, e, k = SHAPES[0]
    x, top_w, top_i, gate_up, down = _problem(*SHAPES[0], seed=10)
    full = gt.experts(x, top_w, top_i, gate_up, down)
    g = torch.Generator().manual_seed(11)
    for rows in (torch.randperm(n, generator=g), torch.arange(3), torch.tensor([n - 1]),
                 torch.randint(0, n, (70,), generator=g)):  # 70 tokens: several row tiles per expert
        assert torch.equal(gt.experts(x[rows], top_w[rows], top_i[rows], gate_up, down), full[rows])
