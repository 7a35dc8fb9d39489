"""Routed experts on the GPU (ops/moe), bf16: the Triton grouped kernels are batch-invariant (torch.equal for a
token's row whatever else shares the call) and match a float64 reference within a named tolerance, forward and
backward; stock's torch._grouped_mm form matches too; the invariant op replays under a CUDA graph (no host
sync, no data-dependent host shape). Trainer/generator parity of tiny_moe on these kernels:
tests/gpu/test_gpu_parity.py::test_gpu_parity_bitwise[tiny_moe-*]. Skipped without CUDA."""

import pytest
import torch

from zeromismatch.ops import moe
from zeromismatch.ops.moe import grouped_mm, naive

pytestmark = pytest.mark.gpu
DEV = "cuda"
# (hidden, expert width, experts, top-k): tiny_moe's, odd widths, the 35B-A3B layer's
SHAPES = [(64, 192, 8, 2), (96, 40, 6, 3), (2048, 512, 256, 8)]
FWD_TOL = 2e-2  # relative Frobenius error vs float64: bf16 inputs, h and outputs rounded to bf16
BWD_TOL = 3e-2


def _problem(n, h, i, e, k, seed=0, skip=()):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(n, h, device=DEV, generator=g).bfloat16()
    logits = torch.randn(n, e, device=DEV, generator=g)
    logits[:, list(skip)] = -1e9
    top_w, top_i = torch.topk(torch.softmax(logits, -1), k, dim=-1)
    top_w = (top_w / top_w.sum(-1, keepdim=True)).bfloat16()
    gate_up = (torch.randn(e, 2 * i, h, device=DEV, generator=g) * h**-0.5).bfloat16()
    down = (torch.randn(e, h, i, device=DEV, generator=g) * i**-0.5).bfloat16()
    return x, top_w, top_i, gate_up, down


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _reference64(x, top_w, top_i, gate_up, down):
    return naive.experts(*(t.double() for t in (x, top_w)), top_i, gate_up.double(), down.double())


def _triton(*args):
    from zeromismatch.ops.moe.grouped_triton import experts

    return experts(*args)


@pytest.mark.parametrize("shape", SHAPES)
def test_triton_forward_matches_reference(shape):
    args = _problem(1000, *shape, skip=(1,))  # expert 1 gets no token
    assert _rel(_triton(*args), _reference64(*args)) < FWD_TOL
    assert _rel(naive.experts(*args), _reference64(*args)) < FWD_TOL  # the tolerance is bf16's own


@pytest.mark.parametrize("shape", SHAPES)
def test_triton_is_batch_invariant(shape):
    n = 3000
    x, top_w, top_i, gate_up, down = _problem(n, *shape, seed=1)
    with torch.no_grad():
        full = _triton(x, top_w, top_i, gate_up, down)
        g = torch.Generator(device=DEV).manual_seed(2)
        compositions = [torch.arange(m, device=DEV) for m in (1, 2, 7, 64, 65, 129, 1000)]
        compositions += [torch.arange(n, device=DEV).flip(0), torch.randperm(n, device=DEV, generator=g),
                         torch.randint(0, n, (5000,), device=DEV, generator=g), torch.tensor([n - 1], device=DEV)]
        for rows in compositions:
            assert torch.equal(_triton(x[rows], top_w[rows], top_i[rows], gate_up, down), full[rows]), rows.numel()
        # with autograd on (the trainer's forward saves activations) the bits are the same
        with torch.enable_grad():
            assert torch.equal(_triton(x.requires_grad_(), top_w, top_i, gate_up, down).detach(), full)


@pytest.mark.parametrize("shape", SHAPES[:2])
def test_triton_backward_matches_reference(shape):
    x, top_w, top_i, gate_up, down = _problem(700, *shape, seed=3, skip=(0,))
    leaves = [t.requires_grad_() for t in (x, top_w, gate_up, down)]
    dy = torch.randn(x.shape, device=DEV, generator=torch.Generator(device=DEV).manual_seed(4)).bfloat16()
    got = torch.autograd.grad(_triton(x, top_w, top_i, gate_up, down), leaves, dy)
    ref = torch.autograd.grad(_reference64(x, top_w, top_i, gate_up, down), leaves, dy.double())
    for name, a, b in zip(("x", "top_w", "gate_up", "down"), got, ref):
        assert a.dtype == torch.bfloat16 and _rel(a, b) < BWD_TOL, (name, _rel(a, b))


@pytest.mark.parametrize("shape", SHAPES)
def test_grouped_mm_matches_reference(shape):
    """stock's form: forward, and backward through torch._grouped_mm's autograd."""
    assert grouped_mm.supported(torch.empty(1, shape[0], device=DEV, dtype=torch.bfloat16),
                                torch.empty(1, 1, shape[1], device=DEV, dtype=torch.bfloat16))
    x, top_w, top_i, gate_up, down = _problem(700, *shape, seed=5, skip=(2,))
    leaves = [t.requires_grad_() for t in (x, top_w, gate_up, down)]
    y = moe.stock(x, top_w, top_i, gate_up, down)
    ref = _reference64(x, top_w, top_i, gate_up, down)
    assert _rel(y, ref) < FWD_TOL
    dy = torch.randn(x.shape, device=DEV, generator=torch.Generator(device=DEV).manual_seed(6)).bfloat16()
    for name, a, b in zip(("x", "top_w", "gate_up", "down"), torch.autograd.grad(y, leaves, dy),
                          torch.autograd.grad(ref, leaves, dy.double())):
        assert _rel(a, b) < BWD_TOL, (name, _rel(a, b))


def test_invariant_op_replays_under_a_cuda_graph():
    """Captured once, replayed on new routing and inputs: the same bits as eager (what lifting the engine's
    CUDA-graph refusal for MoE would rest on)."""
    shape = SHAPES[0]
    x, top_w, top_i, gate_up, down = _problem(16, *shape, seed=7)
    with torch.no_grad():
        _triton(x, top_w, top_i, gate_up, down)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = _triton(x, top_w, top_i, gate_up, down)
        for seed in (8, 9):
            x2, w2, i2, _, _ = _problem(16, *shape, seed=seed)
            x.copy_(x2), top_w.copy_(w2), top_i.copy_(i2)
            graph.replay()
            assert torch.equal(out, _triton(x, top_w, top_i, gate_up, down))


def test_modes_route_experts():
    from zeromismatch.numerics import get_numerics

    assert get_numerics("stock").experts is moe.stock
    assert get_numerics("bi").experts is moe.invariant and get_numerics("bi_chunk").experts is moe.invariant
