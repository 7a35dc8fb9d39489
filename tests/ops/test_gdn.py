"""Gated delta rule references: recurrent vs chunked agree (fp32 rounding), packing never leaks state,
the chunked form is prefix-stable (the basis of bi_chunk decoding), the bi training op's gradients; the chunk
length agrees with the generator's cache blocks and the attention key block."""

import pytest
import torch
import torch.nn.functional as F

from interpreted_helpers import interpreted_kernels
from zeromismatch.generator.cache import BLOCK_SIZE
from zeromismatch.ops.attention import BLOCK
from zeromismatch.ops.gdn import CHUNK
from zeromismatch.ops.gdn.naive import (
    chunk_final_states,
    chunk_fwd,
    chunk_gated_delta_rule,
    prepare_qk,
    recurrent_fwd,
    recurrent_gated_delta_rule,
    to_chunks,
)
from zeromismatch.ops.gdn.recurrent import recurrent_train


def inputs(b=2, t=150, h=2, hv=4, dk=32, dv=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(b, t, h, dk, generator=g), torch.randn(b, t, h, dk, generator=g)
    v = torch.randn(b, t, hv, dv, generator=g)
    gate = -torch.rand(b, t, hv, generator=g) * 2  # log decays in (-2, 0]
    beta = torch.rand(b, t, hv, generator=g)
    s0 = torch.randn(b, hv, dk, dv, generator=g) * 0.1
    return q, k, v, gate, beta, s0


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def test_recurrent_and_chunked_agree():
    q, k, v, g, beta, s0 = inputs()
    o1, f1 = recurrent_gated_delta_rule(q, k, v, g, beta, s0)
    o2, f2 = chunk_gated_delta_rule(q, k, v, g, beta, s0)
    assert rel(o2, o1) < 1e-5 and rel(f2, f1) < 1e-5


def test_against_float64_loop():
    q, k, v, g, beta, s0 = inputs(b=1, t=70)
    o64, _ = recurrent_gated_delta_rule(*(x.double() for x in (q, k, v, g, beta, s0)))
    o, _ = chunk_gated_delta_rule(q, k, v, g, beta, s0)
    assert rel(o, o64) < 1e-5


def test_gradients_recurrent_vs_chunked_and_bi_op():
    q, k, v, g, beta, s0 = inputs(b=2, t=80)
    qq, kk = prepare_qk(q, k, v.shape[2])
    vv, gg, bb = (x.transpose(1, 2).contiguous() for x in (v, g, beta))
    leaves = [x.clone().requires_grad_() for x in (qq, kk, vv, gg, bb)]
    w = torch.randn(2, 4, 80, 32)

    def grads(fn):
        ls = [x.detach().clone().requires_grad_() for x in leaves]
        (fn(*ls) * w).sum().backward()
        return [x.grad for x in ls]

    pad = lambda x: F.pad(x, (0, 0, 0, 48) if x.dim() == 4 else (0, 48))
    g_rec = grads(lambda *a: recurrent_fwd(*a, s0)[0])
    g_chunk = grads(lambda *a: chunk_fwd(*(pad(x) for x in a), s0)[0][:, :, :80])
    g_bi = grads(lambda *a: recurrent_train(*a, s0))
    for a, b, c in zip(g_rec, g_chunk, g_bi):
        assert rel(b, a) < 1e-5
        assert torch.equal(c, b)  # the bi op's backward IS the chunked backward
    # and its forward IS the recurrent forward
    assert torch.equal(recurrent_train(*leaves, s0), recurrent_fwd(*leaves, s0)[0])


@pytest.mark.parametrize("fn", [recurrent_gated_delta_rule, chunk_gated_delta_rule])
def test_packed_equals_alone_no_state_leak(fn):
    q, k, v, g, beta, _ = inputs(b=1, t=300)
    cu = torch.tensor([0, 40, 170, 300])
    o, final = fn(q, k, v, g, beta, None, cu)
    for i in range(3):
        sl = slice(int(cu[i]), int(cu[i + 1]))
        oa, fa = fn(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl])
        assert torch.equal(o[:, sl], oa) and torch.equal(final[i], fa[0])


def test_chunk_prefix_stable_and_batch_invariant():
    """Row t of a chunk computed with the later rows missing (zero-padded) equals the full pass: a decode
    step through the chunked form from the boundary state reproduces the trainer bit for bit."""
    q, k, v, g, beta, s0 = inputs(b=3, t=128)
    qq, kk = prepare_qk(q, k, 4)
    vv, gg, bb = (x.transpose(1, 2).contiguous() for x in (v, g, beta))
    o_full, states = chunk_fwd(qq, kk, vv, gg, bb, s0)
    for t in (64, 65, 100, 127):
        n = t - 63
        cut = lambda x: F.pad(x[:, :, 64 : t + 1], (0, 0, 0, CHUNK - n) if x.dim() == 4 else (0, CHUNK - n))
        o, _ = chunk_fwd(*(cut(x) for x in (qq, kk, vv, gg, bb)), states[:, :, 1])
        assert torch.equal(o[:, :, n - 1], o_full[:, :, t])
        o1, _ = chunk_fwd(*(cut(x)[2:3] for x in (qq, kk, vv, gg, bb)), states[2:3, :, 1])
        assert torch.equal(o1[0, :, n - 1], o_full[2, :, t])


def test_recurrent_rows_independent():
    q, k, v, g, beta, s0 = inputs(b=4, t=20)
    qq, kk = prepare_qk(q, k, 4)
    vv, gg, bb = (x.transpose(1, 2).contiguous() for x in (v, g, beta))
    o, s = recurrent_fwd(qq, kk, vv, gg, bb, s0)
    o1, s1 = recurrent_fwd(qq[2:3], kk[2:3], vv[2:3], gg[2:3], bb[2:3], s0[2:3])
    assert torch.equal(o[2:3], o1) and torch.equal(s[2:3], s1)


def test_zero_padded_positions_leave_the_recurrent_state_unchanged():
    """Zero-padded positions after a row's last token are inert in the recurrent step: running it over one token
    or over the token plus zero padding gives the same output and final state bits. Stock's mixed steps rely on
    it (ops/gdn/chunk.py steps a decode row over its one token, not the batch's padded length)."""
    q, k, v, g, beta, s0 = inputs(b=3, t=1)
    qq, kk = prepare_qk(q, k, 4)
    vv, gg, bb = (x.transpose(1, 2).contiguous() for x in (v, g, beta))
    o1, s1 = recurrent_fwd(qq, kk, vv, gg, bb, s0)
    padded = [F.pad(x, (0, 0, 0, 40)) if x.dim() == 4 else F.pad(x, (0, 40)) for x in (qq, kk, vv, gg, bb)]
    o, s = recurrent_fwd(*padded, s0)
    assert torch.equal(o[:, :, :1], o1) and torch.equal(s, s1)


def test_chunk_final_states_equal_each_row_run_alone():
    """chunk_final_states (stock's prefill state): the state after each row's last valid token, from the batch's
    boundary states, equals the chunked form run over that row alone, cut at its length (bitwise)."""
    torch.manual_seed(3)
    b, h, t, d = 2, 2, 100, 16
    q = torch.nn.functional.normalize(torch.randn(b, h, t, d), dim=-1) * d**-0.5
    k = torch.nn.functional.normalize(torch.randn(b, h, t, d), dim=-1)
    v, g, beta = torch.randn(b, h, t, d), -torch.rand(b, h, t) * 0.3, torch.rand(b, h, t)
    padded = to_chunks(q, k, v, g, beta)
    _, states = chunk_fwd(*padded, torch.zeros(b, h, d, d))
    lengths = torch.tensor([100, 37])
    finals = chunk_final_states(*padded, states, lengths)
    for i, n in enumerate(lengths.tolist()):
        alone = to_chunks(*(x[i : i + 1, :, :n] for x in (q, k, v, g, beta)))
        _, st = chunk_fwd(*alone, torch.zeros(1, h, d, d))
        assert torch.equal(finals[i], st[0, :, -1]), i


def test_chunk_agrees_with_cache_and_attention_blocks():
    """A prefix-cache hit (whole cache blocks) lands on a GDN chunk boundary, and a query's cache blocks cover its
    attention key block."""
    assert BLOCK_SIZE % CHUNK == 0 and BLOCK_SIZE % BLOCK == 0


@pytest.fixture(scope="module")
def chunk_triton():
    """ops/gdn/chunk_triton.py with its kernels interpreted and the GPU's fp32 dot emulated (a sequential
    multiply-add chain over K, the same for every tile: ops/interpreter.py). Under that emulation the two
    arithmetics compute the same products, so only the kernels' logic differs between them."""
    yield from interpreted_kernels("zeromismatch.ops.gdn.chunk_triton")


def test_chunk_kernels_substitutions_agree_and_rows_are_prefix_stable_interpreted(chunk_triton, monkeypatch):
    """The chunked forward's two forward substitutions for (I + A)^-1 (row i of the whole-tile product at step i,
    or one padded row at a time as the decode step runs it) give the same bits, so either way the trainer's rows
    are the decode step's; a zero-padded open chunk gives the same rows; float64 agrees."""
    g = torch.Generator().manual_seed(12)
    b, h, t, dk, dv = 2, 2, 128, 16, 32
    q = F.normalize(torch.randn(b, h, t, dk, generator=g), dim=-1) * dk**-0.5
    k = F.normalize(torch.randn(b, h, t, dk, generator=g), dim=-1)
    v = torch.randn(b, h, t, dv, generator=g)
    gate, beta = -torch.rand(b, h, t, generator=g) * 0.3, torch.rand(b, h, t, generator=g)
    s0 = torch.randn(b, h, dk, dv, generator=g) * 0.1
    ieee = chunk_triton.chunk_fwd_triton(q, k, v, gate, beta, s0, return_rows=True, dots="ieee")
    for whole in (False, True):
        monkeypatch.setattr(chunk_triton, "WHOLE_TILE_SUBSTITUTION", whole)
        tf32 = chunk_triton.chunk_fwd_triton(q, k, v, gate, beta, s0, return_rows=True, dots="tf32")
        for a, c in zip(tf32, ieee):  # o, states, (I + A)^-1 per chunk, u
            assert torch.equal(a, c), whole
    o64, st64 = chunk_fwd(*(x.double() for x in (q, k, v, gate, beta, s0)))
    assert rel(tf32[0].double(), o64) < 1e-5 and rel(tf32[1].double(), st64) < 1e-5
    r = 23  # an open chunk of 23 rows, zero-padded, from the boundary state
    pad = lambda x: F.pad(x[:, :, 64 : 64 + r], (0, 0, 0, 64 - r) if x.dim() == 4 else (0, 64 - r))  # noqa: E731
    o_open, _ = chunk_triton.chunk_fwd_triton(*(pad(x) for x in (q, k, v, gate, beta)), tf32[1][:, :, 1])
    assert torch.equal(o_open[:, :, :r], tf32[0][:, :, 64 : 64 + r])


@pytest.mark.parametrize("kernel,vsplit", [("split", None), ("dot", 1), ("dot", 2)])
def test_chunk_decode_kernel_equals_the_chunked_rows_interpreted(chunk_triton, monkeypatch, kernel, vsplit):
    """The tf32 decode kernels' logic (the rows + values pair; the one-program kernel, its value columns in one
    program or split over two): sequences prefilled
    into cache slots (boundary state and open-chunk rows from the chunked forward, as the generator stores them),
    then decoded together token by token across a chunk close, give the chunked forward's rows and final state
    bit for bit (under the sequential-dot emulation; on the GPU, tests/gpu checks the tensor cores' bits); other
    slots untouched."""
    monkeypatch.setattr(chunk_triton, "DECODE_VSPLIT", vsplit)
    g = torch.Generator().manual_seed(3)
    b, h, dk, dv, total, prefill = 2, 2, 16, 32, 70, (5, 60)
    q = F.normalize(torch.randn(b, h, 128, dk, generator=g), dim=-1) * dk**-0.5
    k = F.normalize(torch.randn(b, h, 128, dk, generator=g), dim=-1)
    v = torch.randn(b, h, 128, dv, generator=g)
    gate, beta = -torch.rand(b, h, 128, generator=g) * 0.3, torch.rand(b, h, 128, generator=g)
    for x in (q, k, v, gate, beta):
        x[:, :, total:] = 0
    o_ref, st_ref = chunk_triton.chunk_fwd_triton(q, k, v, gate, beta, torch.zeros(b, h, dk, dv))
    shapes = {"ssm": (dk, dv), "ck": (CHUNK, dk), "cv": (CHUNK, dv), "cg": (CHUNK,), "cb": (CHUNK,),
              "ct": (CHUNK, CHUNK), "cu": (CHUNK, dv)}
    cache = {n: torch.randn(4, h, *s, generator=g) for n, s in shapes.items()}
    slots, untouched = torch.tensor([3, 1]), {n: c[[0, 2]].clone() for n, c in cache.items()}
    for i, p in enumerate(prefill):  # one chunk boundary at most before p here: the open chunk is rows 0..63
        xs = [x[i : i + 1, :, :CHUNK].clone() for x in (q, k, v, gate, beta)]
        for x in xs:
            x[:, :, p:] = 0
        _, st, tm, u = chunk_triton.chunk_fwd_triton(*xs, torch.zeros(1, h, dk, dv), return_rows=True)
        s = slots[i]
        cache["ssm"][s], cache["ct"][s], cache["cu"][s] = st[0, :, 0], tm[0, :, 0], u[0]
        cache["ck"][s], cache["cv"][s], cache["cg"][s], cache["cb"][s] = xs[1][0], xs[2][0], xs[3][0], xs[4][0]
    for t in range(prefill[0], total):
        live = [i for i, p in enumerate(prefill) if p <= t]
        rows = [x[live, :, t] for x in (q, k, v, gate, beta)]
        o = chunk_triton.chunk_decode_triton(*rows, slots[live], torch.full((len(live),), t % CHUNK), cache,
                                             kernel=kernel)
        assert torch.equal(o, o_ref[live, :, t]), (kernel, vsplit, t)
    assert torch.equal(cache["ssm"][slots], st_ref[:, :, 1])  # the state after the chunk that closed at 63
    for n, c in untouched.items():
        assert torch.equal(cache[n][[0, 2]], c), n
