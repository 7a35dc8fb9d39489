"""GPU kernels: batch invariance (bitwise) and agreement with the plain-torch references (tolerances stated), at
power-of-two and other head sizes. Run on the H200 by benchmarks/run_h200.sh; skipped without CUDA.
experiments/gpu/interpret_check.py runs the GDN checks' logic on a CPU under Triton's interpreter."""

import pytest
import torch

pytestmark = pytest.mark.gpu
DEV = "cuda"


def _gen(seed=0):
    return torch.Generator(device=DEV).manual_seed(seed)


@pytest.mark.parametrize("d", [128, 1024, 4096])
def test_row_reduce_invariant(d):
    from zeromismatch.ops.reduce import mean_sq_last, sum_sq_last

    x = torch.randn(3000, d, device=DEV, generator=_gen())
    full_m, full_s = mean_sq_last(x), sum_sq_last(x)
    for m in (1, 2, 7, 64, 257, 3000):
        assert torch.equal(mean_sq_last(x[:m]), full_m[:m])
        assert torch.equal(sum_sq_last(x[m - 1 : m]), full_s[m - 1 : m])
    torch.testing.assert_close(full_m, x.double().pow(2).mean(-1, keepdim=True).float(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_activations_elementwise_invariant(dtype):
    """The bi modes' activations on CUDA (ops/activations.py: torch's one-pass kernels): an element's bits do not
    depend on its position, the tensor's size, alignment (vectorized vs unrolled paths) or strides; under
    autograd too."""
    from zeromismatch.ops import activations

    x = (torch.randn(10007, device=DEV, generator=_gen(40)) * 8).to(dtype)
    m = (torch.randn(300, 257, device=DEV, generator=_gen(41)) * 8).to(dtype)
    for fn in (activations.silu, activations.sigmoid, activations.softplus):
        full = fn(x)
        for off in range(9):
            assert torch.equal(fn(x[off:]), full[off:]), (fn.__name__, off)
        for i in (0, 1, 5003, 10006):
            assert torch.equal(fn(x[i : i + 1]), full[i : i + 1]), (fn.__name__, i)
        assert torch.equal(fn(x[::3]), full[::3]), fn.__name__
        assert torch.equal(fn(m.t()), fn(m.t().contiguous())), fn.__name__
        assert torch.equal(fn(m[:, 1:]), fn(m)[:, 1:]), fn.__name__
        with torch.enable_grad():
            assert torch.equal(fn(x.clone().requires_grad_()).detach(), full), fn.__name__


@pytest.mark.parametrize("policy", ["fixed", "adaptive"])
@pytest.mark.parametrize("k,n", [(256, 512), (1024, 8192), (1024, 32), (4096, 4096), (192, 1), (4096, 12352), (96, 40)])
def test_linear_row_invariant(policy, k, n):
    from zeromismatch.ops.linear.triton import linear_raw

    x = torch.randn(2048, k, device=DEV, generator=_gen(1)).bfloat16()
    w = (torch.randn(n, k, device=DEV, generator=_gen(2)) * 0.02).bfloat16()
    full = linear_raw(x, w, policy=policy)
    for m in (1, 3, 16, 64, 65, 300, 1024):
        assert torch.equal(linear_raw(x[:m], w, policy=policy), full[:m]), m
    ref = x.double() @ w.double().t()
    assert ((full.double() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.parametrize("m,k,n", [(512, 1024, 8192), (300, 256, 512), (64, 4096, 4096), (1000, 1024, 4096), (3, 4096, 12352)])
def test_linear_every_config_same_bits_and_accurate(m, k, n):
    """Config independence (what lets the adaptive policy pick tiles by M): every bf16 tile config gives the
    bits of the reference config s64, each within bf16 rounding of float64; the fp32 configs likewise."""
    from zeromismatch.ops.linear.triton import CONFIGS, _tma_ok, linear_raw

    x = torch.randn(m, k, device=DEV, generator=_gen(7)).bfloat16()
    w = (torch.randn(n, k, device=DEV, generator=_gen(8)) * 0.02).bfloat16()
    ref = x.double() @ w.double().t()
    for dtype, base_name in ((torch.bfloat16, "s64"), (torch.float32, "f32")):
        xd, wd = x.to(dtype), w.to(dtype)
        base = linear_raw(xd, wd, base_name)
        for name, cfg in CONFIGS.items():
            if name.startswith("f32") != (dtype == torch.float32) or (cfg.tma and not _tma_ok(xd, wd, n)):
                continue
            y = linear_raw(xd, wd, name)
            assert torch.equal(y, base), name
            assert ((y.double() - ref).norm() / ref.norm()).item() < (1e-2 if dtype == torch.bfloat16 else 1e-6), name


def test_linear_fp32_invariant_and_accurate():
    from zeromismatch.ops.linear.triton import linear_raw

    x = torch.randn(600, 1024, device=DEV, generator=_gen(3))
    w = torch.randn(4096, 1024, device=DEV, generator=_gen(4)) * 0.02
    full = linear_raw(x, w)
    for m in (1, 5, 64, 599):
        assert torch.equal(linear_raw(x[:m], w), full[:m])
    ref = x.double() @ w.double().t()
    assert ((full.double() - ref).norm() / ref.norm()).item() < 1e-6


@pytest.mark.parametrize("k,n", [(1024, 32768), (4096, 248320), (4096, 4100), (256, 96)])
def test_lm_head_fp32_output_invariant_every_config_and_fp32_accurate(k, n):
    """The lm_head (ops/linear/head.py): bf16 operands, fp32 accumulator stored as the fp32 logits. Rows do not
    depend on the call's other rows or on the tile config (the TMA ones with their epilogue and stages fitted to
    the wider output). Accuracy, a tolerance: the tensor cores add the exact products with fewer bits than IEEE
    fp32 (measured on the H200: 4.4e-6 relative at K = 4096, 1e-6 at K = 1024; the fp32 GEMM 6e-7): within 1e-5 of
    float64, and at least 100x closer than bf16 logits; cuBLAS's fp32-output GEMM (stock) likewise."""
    from zeromismatch.ops.linear.triton import CONFIGS, _tma_ok, linear_raw

    x = torch.randn(2048, k, device=DEV, generator=_gen(21)).bfloat16()
    w = (torch.randn(n, k, device=DEV, generator=_gen(22)) * 0.02).bfloat16()
    full = linear_raw(x, w, out_dtype=torch.float32)
    assert full.dtype == torch.float32
    for m in (1, 3, 16, 33, 64, 65, 300, 1024):
        assert torch.equal(linear_raw(x[:m], w, out_dtype=torch.float32), full[:m]), m
    for name, cfg in CONFIGS.items():
        if name.startswith("f32") or (cfg.tma and not _tma_ok(x, w, n)):
            continue
        assert torch.equal(linear_raw(x[:300], w, name, out_dtype=torch.float32), full[:300]), name
    ref = x[:64].double() @ w.double().t()
    rel = lambda y: ((y.double() - ref).norm() / ref.norm()).item()  # noqa: E731
    bf16 = rel(linear_raw(x[:64], w))
    for y in (full[:64], torch.mm(x[:64], w.t(), out_dtype=torch.float32)):
        assert rel(y) < min(1e-5, bf16 / 100), (rel(y), bf16)


@pytest.mark.parametrize("dtype,m,k,n", [(torch.bfloat16, 64, 256, 320), (torch.float32, 64, 256, 320),
                                         (torch.bfloat16, 64, 2048, 256), (torch.bfloat16, 64, 48, 192),
                                         (torch.float32, 64, 128, 128), (torch.float32, 64, 64, 96)])
def test_bmm_batch_invariant(dtype, m, k, n):
    """Attention shapes (bf16; head dims 256, 48; 2048 keys) and chunked-GDN shapes (fp32)."""
    from zeromismatch.ops.linear.bmm_triton import bmm

    a = torch.randn(300, m, k, device=DEV, generator=_gen(5)).to(dtype)
    b = torch.randn(300, k, n, device=DEV, generator=_gen(6)).to(dtype)
    full = bmm(a, b)
    for nb in (1, 2, 9, 77):
        assert torch.equal(bmm(a[:nb], b[:nb]), full[:nb])
    ref = a.double() @ b.double()
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-6
    assert ((full.double() - ref).norm() / ref.norm()).item() < tol


def _gdn_inputs(n, h=4, hv=8, dk=128, dv=128, seed=7):
    g = _gen(seed)
    mixed = torch.randn(n, 2 * h * dk + hv * dv, device=DEV, generator=g).bfloat16()
    q = mixed[:, : h * dk].view(n, h, dk)
    k = mixed[:, h * dk : 2 * h * dk].view(n, h, dk)
    v = mixed[:, 2 * h * dk :].view(n, hv, dv)
    gg = -torch.rand(n, hv, device=DEV, generator=g) * 0.3
    beta = torch.rand(n, hv, device=DEV, generator=g)
    return q, k, v, gg, beta


HEAD_DIMS = [(128, 128), (64, 64), (96, 96), (128, 96), (96, 40)]  # (K, V): powers of two and not


@pytest.mark.parametrize("dk,dv", HEAD_DIMS)
def test_gdn_recurrent_reference_and_invariance(dk, dv):
    check_recurrent_reference_and_invariance(dk, dv, [100, 1, 37, 250])


def check_recurrent_reference_and_invariance(dk, dv, lens):
    """The recurrent kernel vs the float64 torch recurrence (rel. err < 1e-4); each sequence alone == in the
    batch, and the last one split in 3 calls with the fp32 state carried through a cache slot (bitwise)."""
    from zeromismatch.ops.gdn.naive import prepare_qk, recurrent_fwd
    from zeromismatch.ops.gdn.recurrent_triton import recurrent_fwd_triton

    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device=DEV, dtype=torch.int32)
    q, k, v, g, beta = _gdn_inputs(int(cu[-1]), dk=dk, dv=dv)
    hv, dk, dv = v.shape[1], q.shape[2], v.shape[2]
    state = torch.zeros(len(lens), hv, dk, dv, device=DEV)
    o = recurrent_fwd_triton(q, k, v, g, beta, cu, state)
    for i in range(len(lens)):
        s, e = int(cu[i]), int(cu[i + 1])
        qq, kk = prepare_qk(q[None, s:e].double(), k[None, s:e].double(), hv)
        vv = v[None, s:e].double().transpose(1, 2)
        gg, bb = g[s:e].double().t()[None], beta[s:e].double().t()[None]
        oref, sref = recurrent_fwd(qq.double(), kk.double(), vv, gg, bb, torch.zeros(1, hv, dk, dv, device=DEV, dtype=torch.float64))
        oref = oref[0].transpose(0, 1)
        assert ((o[s:e].double() - oref).norm() / oref.norm()).item() < 1e-4
        assert ((state[i].double() - sref[0]).norm() / sref[0].norm()).item() < 1e-4
        # alone == in the batch (bitwise)
        st1 = torch.zeros(1, hv, dk, dv, device=DEV)
        one = torch.tensor([0, e - s], device=DEV, dtype=torch.int32)
        o1 = recurrent_fwd_triton(q[s:e], k[s:e], v[s:e], g[s:e], beta[s:e], one, st1)
        assert torch.equal(o1, o[s:e]) and torch.equal(st1[0], state[i])
    # split with the fp32 state carried, through cache slots (bitwise)
    s, e = int(cu[-2]), int(cu[-1])
    cache = torch.randn(5, hv, dk, dv, device=DEV)
    cache[2] = 0
    slot = torch.tensor([2], device=DEV)
    parts = []
    cut = (e - s) // 2
    for a, bnd in ((s, s + cut), (s + cut, s + cut + 1), (s + cut + 1, e)):
        parts.append(recurrent_fwd_triton(q[a:bnd], k[a:bnd], v[a:bnd], g[a:bnd], beta[a:bnd],
                                       torch.tensor([0, bnd - a], device=DEV, dtype=torch.int32), cache, slot))
    assert torch.equal(torch.cat(parts), o[s:e]) and torch.equal(cache[2], state[-1])


def test_gdn_recurrent_decode_slots():
    """One token for 64 sequences in scattered cache slots == each sequence alone; other slots untouched."""
    from zeromismatch.ops.gdn.recurrent_triton import recurrent_fwd_triton

    n, hv = 64, 8
    q, k, v, g, beta = _gdn_inputs(n, hv=hv, seed=3)
    cache = torch.randn(100, hv, 128, 128, device=DEV, generator=_gen(4)) * 0.1
    snap = cache.clone()
    slots = torch.randperm(100, device=DEV, generator=_gen(5))[:n]
    ones = torch.arange(n + 1, device=DEV, dtype=torch.int32)
    o = recurrent_fwd_triton(q, k, v, g, beta, ones, cache, slots)
    for i in (0, 5, 63):
        alone = snap.clone()
        oi = recurrent_fwd_triton(q[i : i + 1], k[i : i + 1], v[i : i + 1], g[i : i + 1], beta[i : i + 1], ones[:2],
                                  alone, slots[i : i + 1])
        assert torch.equal(oi, o[i : i + 1]) and torch.equal(alone[slots[i]], cache[slots[i]])
    untouched = torch.ones(100, dtype=torch.bool, device=DEV)
    untouched[slots] = False
    assert torch.equal(cache[untouched], snap[untouched])


@pytest.fixture
def scan_precision():
    """Set scan_triton.PRECISION for one test ("ieee": fp32 products, comparable to the torch loop at fp32
    rounding), restored after."""
    import zeromismatch.ops.gdn.scan_triton as scan

    old = scan.PRECISION
    yield lambda p: setattr(scan, "PRECISION", p)
    scan.PRECISION = old


def test_gdn_recurrent_backward_matches_reference(scan_precision):
    """bi's training op (recurrent Triton forward, gradients through the chunked reference) against the reference
    differentiated by autograd; the scan at fp32 ("ieee") so that the two agree to fp32 rounding (its tf32
    accuracy: test_gdn_scan_triton_matches_torch_loop)."""
    scan_precision("ieee")
    from zeromismatch.ops.gdn.recurrent import chunk_reference_packed, recurrent_train_triton

    cu = [0, 70, 75, 200]
    q, k, v, g, beta = (x.detach().float().clone().requires_grad_(True) for x in _gdn_inputs(200, seed=9))
    o = recurrent_train_triton(q, k, v, g, beta, cu)
    w = torch.randn_like(o)
    grads = torch.autograd.grad((o * w).sum(), (q, k, v, g, beta))
    o_ref = chunk_reference_packed(q, k, v, g, beta, cu)
    torch.testing.assert_close(o, o_ref, rtol=1e-4, atol=1e-4)
    grads_ref = torch.autograd.grad((o_ref * w).sum(), (q, k, v, g, beta))
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b)


# bi_chunk's chunked arithmetics and their accuracy against float64 (relative, output and states): ieee is fp32
# FMA chains; tf32 rounds each product's inputs to 10 mantissa bits (FLA's chunk kernels: bf16)
CHUNK_TOL = {"ieee": 1e-5, "tf32": 5e-3}


@pytest.mark.parametrize("dots", ["tf32", "ieee"])
@pytest.mark.parametrize("dk,dv", HEAD_DIMS)
def test_gdn_chunk_cuda_reference_prefix_and_batch(dk, dv, dots):
    from functools import partial

    from zeromismatch.ops.gdn.chunk_triton import chunk_fwd_triton as fwd
    chunk_fwd_triton = partial(fwd, dots=dots)
    from zeromismatch.ops.gdn.naive import chunk_fwd

    g = _gen(11)
    b, h, t = 3, 4, 192
    q = torch.nn.functional.normalize(torch.randn(b, h, t, dk, device=DEV, generator=g), dim=-1) * dk**-0.5
    k = torch.nn.functional.normalize(torch.randn(b, h, t, dk, device=DEV, generator=g), dim=-1)
    v = torch.randn(b, h, t, dv, device=DEV, generator=g)
    gg = -torch.rand(b, h, t, device=DEV, generator=g) * 0.3
    beta = torch.rand(b, h, t, device=DEV, generator=g)
    s0 = torch.randn(b, h, dk, dv, device=DEV, generator=g) * 0.1
    o, st = chunk_fwd_triton(q, k, v, gg, beta, s0)
    o64, st64 = chunk_fwd(*(x.double() for x in (q, k, v, gg, beta, s0)))
    assert ((o.double() - o64).norm() / o64.norm()).item() < CHUNK_TOL[dots]
    assert ((st.double() - st64).norm() / st64.norm()).item() < CHUNK_TOL[dots]
    o1, st1 = chunk_fwd_triton(q[1:2], k[1:2], v[1:2], gg[1:2], beta[1:2], s0[1:2])
    assert torch.equal(o1, o[1:2]) and torch.equal(st1, st[1:2])
    for r in (1, 17, 63):  # a zero-padded open chunk from the boundary state gives the same rows
        sl = slice(128, 128 + r)

        def pad(x):
            y = torch.zeros_like(x[:, :, 128:192])
            y[:, :, :r] = x[:, :, sl]
            return y

        op, _ = chunk_fwd_triton(pad(q), pad(k), pad(v), pad(gg), pad(beta), st[:, :, 2])
        assert torch.equal(op[:, :, :r], o[:, :, sl]), r


def _prepared_inputs(b, h, t, dk, dv, seed):
    g = _gen(seed)
    q = torch.nn.functional.normalize(torch.randn(b, h, t, dk, device=DEV, generator=g), dim=-1) * dk**-0.5
    k = torch.nn.functional.normalize(torch.randn(b, h, t, dk, device=DEV, generator=g), dim=-1)
    v = torch.randn(b, h, t, dv, device=DEV, generator=g)
    gg = -torch.rand(b, h, t, device=DEV, generator=g) * 0.3
    beta = torch.rand(b, h, t, device=DEV, generator=g)
    return q, k, v, gg, beta


DECODE_KERNELS = [("tf32", "split"), ("tf32", "dot"), ("ieee", "chain"), ("ieee", "dot"), ("ieee", "split")]  # (arithmetic, kernel)


@pytest.mark.parametrize("dots,kernel", DECODE_KERNELS)
@pytest.mark.parametrize("dk,dv", HEAD_DIMS)
def test_gdn_chunk_decode_equals_chunked_forward(dk, dv, dots, kernel):
    """bi_chunk's fused decode step (each arithmetic, each kernel) == the trainer's chunked forward, bit for bit."""
    check_chunk_decode_equals_chunked_forward(dots, kernel, dk, dv)


def check_chunk_decode_equals_chunked_forward(dots, kernel, dk=128, dv=128, h=4, prefill=(0, 5, 63, 81), total=200):
    """len(prefill) sequences in as many of 8 cache slots, each prefilled to its length (boundary state +
    open-chunk rows stored from chunk_fwd_triton(return_rows=True)), then decoded together token by token with
    the decode `kernel` (every position in the open chunk, chunk closes included) to `total` tokens; rows and
    final states compared with torch.equal; other slots untouched. Both sides use the arithmetic `dots`."""
    from zeromismatch.ops.gdn import CHUNK
    from zeromismatch.ops.gdn.chunk_triton import chunk_decode_triton, chunk_fwd_triton

    b, width = len(prefill), (total // CHUNK + 1) * CHUNK
    q, k, v, gg, beta = _prepared_inputs(b, h, width, dk, dv, 21)
    for x in (q, k, v, gg, beta):
        x[:, :, total:] = 0  # the trainer's zero padding
    s0 = torch.zeros(b, h, dk, dv, device=DEV)
    o_ref, st_ref = chunk_fwd_triton(q, k, v, gg, beta, s0, dots=dots)

    slots = torch.tensor([5, 2, 7, 0][:b], device=DEV)
    n_slots = 8
    f32 = dict(device=DEV, dtype=torch.float32)
    cache = {
        "ssm": torch.randn(n_slots, h, dk, dv, **f32), "ck": torch.randn(n_slots, h, CHUNK, dk, **f32),
        "cv": torch.randn(n_slots, h, CHUNK, dv, **f32), "cg": torch.randn(n_slots, h, CHUNK, **f32),
        "cb": torch.randn(n_slots, h, CHUNK, **f32), "ct": torch.randn(n_slots, h, CHUNK, CHUNK, **f32),
        "cu": torch.randn(n_slots, h, CHUNK, dv, **f32),
    }
    others = [i for i in range(n_slots) if i not in slots.tolist()]
    before = {n: t[others].clone() for n, t in cache.items()}
    for i, p in enumerate(prefill):  # what the generator stores after a prefill of p tokens
        width = (p // CHUNK + 1) * CHUNK
        xs = [x[i : i + 1, :, :width].clone() for x in (q, k, v, gg, beta)]
        for x in xs:
            x[:, :, p:] = 0
        _, st, tm, u = chunk_fwd_triton(*xs, s0[i : i + 1], return_rows=True, dots=dots)
        full, sl = p // CHUNK, slice(p // CHUNK * CHUNK, p // CHUNK * CHUNK + CHUNK)
        s = slots[i]
        cache["ssm"][s] = st[0, :, full]
        cache["ck"][s], cache["cv"][s] = xs[1][0, :, sl], xs[2][0, :, sl]
        cache["cg"][s], cache["cb"][s] = xs[3][0, :, sl], xs[4][0, :, sl]
        cache["ct"][s], cache["cu"][s] = tm[0, :, full], u[0, :, sl]
    pos = torch.tensor(prefill, device=DEV)
    out = torch.zeros(b, h, total, dv, device=DEV)
    while True:
        live = (pos < total).nonzero().flatten()
        if not len(live):
            break
        p = pos[live]
        qt, kt, vt, gt, bt = (x[live, :, p] for x in (q, k, v, gg, beta))  # [n, HV, ...]
        o = chunk_decode_triton(qt, kt, vt, gt, bt, slots[live], p % CHUNK, cache, dots=dots, kernel=kernel)
        for j, i in enumerate(live.tolist()):
            out[i, :, pos[i]] = o[j]
        pos[live] += 1
    for i, p in enumerate(prefill):
        assert torch.equal(out[i, :, p:total], o_ref[i, :, p:total]), i
    # the state in the cache is the boundary state after the last complete chunk
    assert torch.equal(cache["ssm"][slots], st_ref[:, :, total // CHUNK])
    for n, t in before.items():
        assert torch.equal(cache[n][others], t), n


@pytest.mark.parametrize("dots", ["tf32", "ieee"])
def test_gdn_chunk_cuda_grad_matches_reference(scan_precision, dots):
    """bi_chunk's training op against naive.chunk_fwd under autograd; the scan at fp32 as above. The gradient is
    the reference's whatever the forward's arithmetic; the tf32 forward is within its tolerance."""
    scan_precision("ieee")
    from zeromismatch.ops.gdn.aligned_chunk import chunk_train_triton
    from zeromismatch.ops.gdn.naive import chunk_fwd

    q, k, v, gg, beta = (x.requires_grad_() for x in _prepared_inputs(2, 2, 128, 128, 128, 22))
    s0 = torch.zeros(2, 2, 128, 128, device=DEV)
    o = chunk_train_triton(q, k, v, gg, beta, s0, dots=dots)
    w = torch.randn_like(o)
    grads = torch.autograd.grad((o * w).sum(), (q, k, v, gg, beta))
    o_ref, _ = chunk_fwd(q, k, v, gg, beta, s0)
    if dots == "ieee":
        torch.testing.assert_close(o, o_ref, rtol=1e-4, atol=1e-4)
    else:
        assert float((o - o_ref).detach().norm() / o_ref.detach().norm()) < CHUNK_TOL[dots]
    grads_ref = torch.autograd.grad((o_ref * w).sum(), (q, k, v, gg, beta))
    for a, b_ in zip(grads, grads_ref):
        torch.testing.assert_close(a, b_)


@pytest.mark.parametrize("dk,dv", [(128, 128), (96, 96), (128, 96), (96, 40)])
@pytest.mark.parametrize("t", [0, 1, 31, 62, 63])
def test_gdn_chunk_decode_kernels_agree(t, dk, dv):
    check_decode_kernels_agree(t, dk, dv)


def check_decode_kernels_agree(t, dk, dv, n=6, h=4):
    """In the ieee arithmetic, the loop-chain decode kernel (its default) == the dot decode kernel (the trainer's
    construct) == the split pair, output and every cache tensor, from random open-chunk rows at position t (relies on tl.dot's fp32 lowering being a
    fused FMA chain; at K not a power of two the loop's chain is the dot's less its trailing 0 * 0 terms)."""
    from zeromismatch.ops.gdn import CHUNK
    from zeromismatch.ops.gdn.chunk_triton import chunk_decode_triton

    g = _gen(30 + t)
    cache = {"ssm": torch.randn(n, h, dk, dv, device=DEV, generator=g) * 0.1,
             "ck": torch.randn(n, h, CHUNK, dk, device=DEV, generator=g),
             "cv": torch.randn(n, h, CHUNK, dv, device=DEV, generator=g),
             "cg": -torch.rand(n, h, CHUNK, device=DEV, generator=g), "cb": torch.rand(n, h, CHUNK, device=DEV, generator=g),
             "ct": torch.randn(n, h, CHUNK, CHUNK, device=DEV, generator=g) * 0.1,
             "cu": torch.randn(n, h, CHUNK, dv, device=DEV, generator=g)}
    xs = [x[:, :, 0] for x in _prepared_inputs(n, h, 1, dk, dv, 31)]
    slots, pos = torch.arange(n, device=DEV), torch.full((n,), t, device=DEV)
    a, b, c = ({k: v.clone() for k, v in cache.items()} for _ in range(3))
    oa = chunk_decode_triton(*xs, slots, pos, a, dots="ieee", kernel="dot")
    ob = chunk_decode_triton(*xs, slots, pos, b, dots="ieee", kernel="chain")
    oc = chunk_decode_triton(*xs, slots, pos, c, dots="ieee", kernel="split")
    assert torch.equal(oa, ob) and torch.equal(oa, oc)
    for k in a:
        assert torch.equal(a[k], b[k]) and torch.equal(a[k], c[k]), k


@pytest.mark.parametrize("dk,dv", HEAD_DIMS)
@pytest.mark.parametrize("prec", ["ieee", "tf32"])
def test_gdn_scan_triton_matches_torch_loop(dk, dv, prec, scan_precision):
    """The trainer's Triton scan over chunks (forward and its own backward) against the torch loop it replaces,
    outputs and every input's gradient, the boundary states' gradient included: ieee to fp32 rounding, tf32
    within 1e-2 relative (10-bit products)."""
    from zeromismatch.ops.gdn.naive import chunk_fwd
    from zeromismatch.ops.gdn.scan_triton import chunk_scan_triton

    scan_precision(prec)
    xs = [x.requires_grad_() for x in _prepared_inputs(2, 3, 192, dk, dv, 31)]
    s0 = (0.1 * torch.randn(2, 3, dk, dv, device=DEV, generator=_gen(32))).requires_grad_()
    ref_o, ref_st = chunk_fwd(*xs, s0)
    o, st = chunk_fwd(*xs, s0, scan=chunk_scan_triton)
    wo, ws = torch.randn_like(o), torch.randn_like(st)
    for use_states in (False, True):
        loss = lambda o_, st_: (o_ * wo).sum() + ((st_ * ws).sum() if use_states else 0.0)  # noqa: E731
        ref = torch.autograd.grad(loss(ref_o, ref_st), xs + [s0], retain_graph=True)
        got = torch.autograd.grad(loss(o, st), xs + [s0], retain_graph=True)
        for name, a, b in zip(("o", "states", "q", "k", "v", "g", "beta", "s0"), (o, st, *got), (ref_o, ref_st, *ref)):
            if prec == "ieee":
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
            else:
                assert float((a - b).detach().norm() / b.detach().norm()) < 1e-2, name


@pytest.mark.parametrize("dk,dv", [(128, 128), (96, 40)])
def test_gdn_chunk_tf32_bits_do_not_depend_on_launch_settings(dk, dv, monkeypatch):
    """The tf32 kernels' bits under other warp counts, value blocks, decode value splits and the prep kernel's
    whole-tile substitution: the tile-independence of the tensor-core products that decode == chunked rows rests
    on, at the kernels' own shapes."""
    from zeromismatch.ops.gdn import CHUNK
    from zeromismatch.ops.gdn import chunk_triton as ct

    q, k, v, gg, beta = _prepared_inputs(2, 4, 192, dk, dv, 41)
    s0 = 0.1 * torch.randn(2, 4, dk, dv, device=DEV, generator=_gen(42))
    ref = ct.chunk_fwd_triton(q, k, v, gg, beta, s0, return_rows=True)
    n, pos = 3, torch.tensor([0, 31, 63], device=DEV)
    xs = [x[:n, :, 0].contiguous() for x in _prepared_inputs(n, 4, 1, dk, dv, 43)]
    cache = {"ssm": 0.1 * torch.randn(n, 4, dk, dv, device=DEV, generator=_gen(44)),
             "ck": torch.randn(n, 4, CHUNK, dk, device=DEV, generator=_gen(45)),
             "cv": torch.randn(n, 4, CHUNK, dv, device=DEV, generator=_gen(46)),
             "cg": -torch.rand(n, 4, CHUNK, device=DEV, generator=_gen(47)),
             "cb": torch.rand(n, 4, CHUNK, device=DEV, generator=_gen(48)),
             "ct": 0.1 * torch.randn(n, 4, CHUNK, CHUNK, device=DEV, generator=_gen(49)),
             "cu": torch.randn(n, 4, CHUNK, dv, device=DEV, generator=_gen(50))}
    slots = torch.arange(n, device=DEV)
    dec_ref = {name: t.clone() for name, t in cache.items()}
    o_ref = ct.chunk_decode_triton(*xs, slots, pos, dec_ref)
    for warps, bv, vsplit, whole in (
            ({"prep": 4, "scan": 4, "decode": 4, "rows": 8, "values": 2}, {"prep": 32, "scan": 32, "decode": 32,
                                                                         "values": 64}, 2, False),
            ({"prep": 8, "scan": 2, "decode": 2, "rows": 2, "values": 8}, {"prep": 16, "scan": 64, "decode": 64,
                                                                         "values": 16}, 1, True),
            ({"prep": 4}, {}, 3, True), ({"prep": 16}, {"decode": 16, "values": 128}, 8, True)):
        monkeypatch.setattr(ct, "NUM_WARPS", {**ct.NUM_WARPS, **warps})
        monkeypatch.setattr(ct, "BV_MAX", {**ct.BV_MAX, **bv})
        monkeypatch.setattr(ct, "DECODE_VSPLIT", vsplit)
        monkeypatch.setattr(ct, "WHOLE_TILE_SUBSTITUTION", whole)
        got = ct.chunk_fwd_triton(q, k, v, gg, beta, s0, return_rows=True)
        for a, b in zip(got, ref):
            assert torch.equal(a, b), warps
        for kernel in ("split", "dot"):  # the tf32 kernels: each equal to the default's run before any patch
            dec = {name: t.clone() for name, t in cache.items()}
            assert torch.equal(ct.chunk_decode_triton(*xs, slots, pos, dec, kernel=kernel), o_ref), (warps, kernel)
            for name in dec:
                assert torch.equal(dec[name], dec_ref[name]), (warps, kernel, name)
