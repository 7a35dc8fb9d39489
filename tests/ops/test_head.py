"""The fp32 lm_head (ops/linear/head.py): bf16 operands, exact products, fp32 sums and logits.

On the CPU both modes keep the fp32 GEMM of the casts; the CUDA form (the invariant Triton GEMM with an fp32
output) runs here under Triton's interpreter: rows independent of the call's other rows and of the tile config,
fp32-accurate (not bf16-rounded), and differentiable. tests/gpu/test_gpu_kernels.py checks the compiled kernels
and cuBLAS's fp32-output GEMM (stock) on a GPU."""

import pytest
import torch
import torch.nn.functional as F

from interpreted_helpers import interpreted_kernels
from zeromismatch.ops.linear import invariant_logits, stock_logits
from zeromismatch.ops.linear import linear as invariant_linear


def _operands(m, k, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(m, k, generator=g).bfloat16()
    w = (torch.randn(n, k, generator=g) * 0.05).bfloat16()
    return h, w


def test_cpu_heads_are_the_fp32_gemm_of_the_casts():
    h, w = _operands(37, 96, 200)
    casts = []

    def w_fp32():
        casts.append(1)
        return w.float()

    assert torch.equal(stock_logits(h, w, w_fp32), F.linear(h.float(), w.float()))
    assert torch.equal(invariant_logits(h, w, w_fp32), invariant_linear(h.float(), w.float()))
    assert len(casts) == 2  # the model's kept cast is what the CPU path reads
    assert stock_logits(h, w, w_fp32).dtype == invariant_logits(h, w, w_fp32).dtype == torch.float32


@pytest.fixture(scope="module")
def tri():
    yield from interpreted_kernels("zeromismatch.ops.linear.triton")


def test_fp32_output_rows_are_invariant_and_fp32_accurate_interpreted(tri):
    h, w = _operands(130, 192, 96, seed=1)
    full = tri.linear_raw(h, w, out_dtype=torch.float32)
    assert full.dtype == torch.float32
    for rows in (slice(0, 1), slice(5, 8), slice(64, 130), slice(129, 130)):
        assert torch.equal(tri.linear_raw(h[rows], w, out_dtype=torch.float32), full[rows])
    for name in ("s16", "s64", "m128", "f32"):  # pointer configs (bf16 ones: f32 is the fp32-input tile)
        if name != "f32":
            assert torch.equal(tri.linear_raw(h, w, name, out_dtype=torch.float32), full), name
    ref = h.double() @ w.double().t()
    rel = ((full.double() - ref).norm() / ref.norm()).item()
    bf16_out = tri.linear_raw(h, w)  # the bf16-output GEMM rounds every logit to 8 bits
    rel_bf16 = ((bf16_out.double() - ref).norm() / ref.norm()).item()
    assert rel < 1e-6 < rel_bf16, (rel, rel_bf16)


def test_tma_configs_fit_shared_memory_with_an_fp32_output():
    pytest.importorskip("triton")
    from zeromismatch.ops.linear.triton import CONFIGS, SMEM_BUDGET, SMEM_BUDGET_PERSISTENT, fit_smem

    for name, c in CONFIGS.items():
        assert fit_smem(c, torch.bfloat16) == c
        f = fit_smem(c, torch.float32)
        assert (f.bm, f.bn, f.bk, f.warps, f.tma, f.persistent) == (c.bm, c.bn, c.bk, c.warps, c.tma, c.persistent)
        if not c.tma:
            assert f == c, name
            continue
        tile = f.bm * (f.bn // 2 if f.epi_split else f.bn) * 4
        budget = SMEM_BUDGET_PERSISTENT if c.persistent else SMEM_BUDGET
        assert f.stages * (f.bm + f.bn) * f.bk * 2 + tile <= budget, name
        assert f.epi_split == (c.persistent or c.epi_split), name
    assert fit_smem(CONFIGS["p256"], torch.float32).stages == 3  # measured: exactly the persistent budget
    assert fit_smem(CONFIGS["d64"], torch.float32).stages == 5  # measured
    assert fit_smem(CONFIGS["l256_tma"], torch.float32).stages == 1  # a whole 128 x 256 fp32 tile to stage


def test_head_backward_is_the_bf16_linear_gradient_interpreted(tri, monkeypatch):
    import zeromismatch.ops.linear.head as head

    h, w = _operands(20, 64, 48, seed=3)
    h.requires_grad_()
    w.requires_grad_()
    monkeypatch.setattr(head, "on_gpu", lambda x: True)  # the CUDA path, interpreted
    y = head.invariant_logits(h, w, lambda: w.float())
    assert y.dtype == torch.float32
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(4))
    gh, gw = torch.autograd.grad(y, (h, w), gy)
    assert gh.dtype == gw.dtype == torch.bfloat16
    ref_h, ref_w = gy.double() @ w.double(), gy.double().t() @ h.double()
    for got, ref in ((gh, ref_h), (gw, ref_w)):
        assert ((got.double() - ref).norm() / ref.norm()).item() < 1e-2
    with torch.no_grad():  # the no-grad path (the generator's) gives the same bits
        assert torch.equal(head.invariant_logits(h, w, lambda: w.float()), y.detach())


def test_fp32_form_is_the_fp32_gemm_of_the_casts_on_every_device(tri, monkeypatch):
    """numerics lm_head=fp32 (the published recipe's statement): the fp32 GEMM of the kept cast, also where the
    tensor-core form would run (here: the interpreted CUDA path)."""
    import zeromismatch.ops.linear.head as head

    h, w = _operands(9, 64, 40, seed=5)
    monkeypatch.setattr(head, "on_gpu", lambda x: True)
    casts = []
    y = head.invariant_logits(h, w, lambda: casts.append(1) or w.float(), form="fp32")
    assert casts == [1]
    assert torch.equal(y, invariant_linear(h.float(), w.float()))  # the package's fp32 GEMM (here its CPU form)
    assert not torch.equal(y, head.invariant_logits(h, w, lambda: w.float()))  # the tensor-core form differs
