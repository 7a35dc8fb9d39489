"""The CPU batch-invariant GEMM (ops/linear/cpu.py): a row's bits never depend on the row count, the row's
position in its block, the other rows' values or the torch thread count; and it computes x @ W.T."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from zeromismatch.ops.linear import cpu

# weight shapes [N, K]: powers of two, the presets' widths (96, 160, 192, 384, 768), odd sizes, and the
# [384, 1024] weight on which one padded GEMM is not row-count invariant at 2 threads, and [4, 131], whose
# rows MKL computes by their position in the tile on AMD EPYC
NS = [1, 4, 33, 96, 160, 384, 513, 1024]
KS = [64, 96, 131, 160, 256, 768, 1024, 4096]
SHAPES = [(n, k) for n, k in itertools.product(NS, KS) if n * k <= 1024 * 1024] + [(4096, 256), (2048, 1000)]
ROW_COUNTS = [1, 2, 5, 31, 32, 33, 63, 64, 65, 96, 127, 128, 129, 200, 257, 300]


@pytest.fixture
def threads():
    """Set the torch thread count inside a test; restored after."""
    n = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(n)


def _operands(n, k, dtype, rows=300):
    g = torch.Generator().manual_seed(n * 10007 + k)
    return torch.randn(n, k, generator=g).to(dtype), torch.randn(rows, k, generator=g).to(dtype), g


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_rows_do_not_depend_on_row_count_position_or_other_rows(threads, n_threads, dtype):
    threads(n_threads)
    for n, k in SHAPES:
        w, x, g = _operands(n, k, dtype)
        ref = cpu.linear(x, w)
        alone = torch.cat([cpu.linear(x[i : i + 1], w) for i in range(0, len(x), 7)])
        assert torch.equal(alone, ref[::7]), f"[{n}, {k}]: a row alone != the same row among 300"
        for m in ROW_COUNTS:
            start = (m * 13) % (len(x) - m + 1)  # the rows land at other positions within their blocks
            assert torch.equal(cpu.linear(x[start : start + m], w), ref[start : start + m]), f"[{n}, {k}] M={m}"
        other = x.clone()
        other[1::2] = 100 * torch.randn(len(x) // 2, k, generator=g).to(dtype)
        assert torch.equal(cpu.linear(other, w)[::2], ref[::2]), f"[{n}, {k}]: other rows' values matter"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_thread_count_does_not_change_bits(threads, dtype):
    for n, k in SHAPES:
        w, x, _ = _operands(n, k, dtype, rows=100)
        outs = []
        for n_threads in (1, 2):
            threads(n_threads)
            outs.append(cpu.linear(x, w))
        assert torch.equal(*outs), f"[{n}, {k}]"


def test_layout_of_the_input_does_not_change_bits():
    """Views (offsets that break 64-byte alignment, strides) and leading dims give the same rows."""
    w, x, _ = _operands(384, 1024, torch.float32, rows=65)
    ref = cpu.linear(x, w)
    buf = torch.randn(66 * 1024 + 3)
    offset = buf[3 : 3 + 65 * 1024].view(65, 1024)
    offset.copy_(x)
    assert torch.equal(cpu.linear(offset, w), ref)
    assert torch.equal(cpu.linear(x.t().contiguous().t(), w), ref)  # column-major view
    assert torch.equal(cpu.linear(x[:64].view(4, 16, 1024), w), ref[:64].view(4, 16, 384))
    wbuf = torch.randn(384 * 1024 + 5)
    w_offset = wbuf[5:].view(384, 1024)
    w_offset.copy_(w)
    assert torch.equal(cpu.linear(x, w_offset), ref)
    assert cpu.linear(x[:0], w).shape == (0, 384)


def test_mkl_gemm_runs_on_one_thread():
    """Thread-count invariance rests on MKL's thread-local setting: it must be reachable on MKL builds."""
    if not torch.backends.mkl.is_available():
        pytest.skip("torch without MKL")
    assert cpu.SEQUENTIAL_GEMM


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_equals_f_linear_within_tolerance(dtype, tol):
    """Not bitwise (another GEMM), the same product up to rounding: fp32 within 1e-5 relative; bf16 within
    bf16 rounding of the output (computed in fp32, rounded once)."""
    for n, k in [(384, 1024), (96, 160), (513, 131), (1, 4096)]:
        w, x, _ = _operands(n, k, dtype, rows=77)
        torch.testing.assert_close(cpu.linear(x, w).float(), F.linear(x.float(), w.float()), rtol=tol, atol=tol * 10)


def test_gradients_equal_f_linear_within_tolerance():
    w, x, g = _operands(160, 96, torch.float32, rows=45)
    x.requires_grad_(True)
    w.requires_grad_(True)
    gy = torch.randn(45, 160, generator=g)
    grads = []
    for fn in (cpu.linear, F.linear):
        x.grad = w.grad = None
        (fn(x, w) * gy).sum().backward()
        grads.append((x.grad.clone(), w.grad.clone()))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
