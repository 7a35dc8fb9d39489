#!/usr/bin/env python
"""THE device script for the H200 (one call builds, checks and times everything; results -> $OUT/*.json).

    PYTHONPATH=src python experiments/gpu/h200_suite.py --out $OUT [--sections a,b,...] [--deadline 540]

Sections (in priority order; each is isolated: an exception is recorded and the next section runs; a section
that would start after --deadline seconds is skipped and recorded as such):
  env           versions, GPU, command
  reduce        row reductions: ours invariant over row count (and torch's .mean, for contrast)
  gemm_check    Triton GEMM vs float64 (rel. error), every config
  gemm_inv      row invariance over M for model + training shapes, both policies; torch F.linear for contrast
  gemm_cfg      config independence: are the bits the same for every tile config / TMA vs pointer loads?
                (decides whether the "adaptive" policy is valid); also Triton vs cuBLAS bits
  bmm           batched matmul invariance over batch count (ours; torch for contrast)
  gdn           recurrent kernel: vs float64 reference, alone == batched, split with carried state, slots
  gdn_chunk     chunked forward on CUDA: vs float64 torch reference, batch invariance, prefix stability; the
                fused bi_chunk decode step == the chunked forward's rows, bit for bit
  chunk_time    bi_chunk decode step vs the fp32 state floor; chunked forward vs the recurrent kernel; the
                experimental loop-chain decode variants: bits vs the dot decode, and time
  parity_chain  bi_chunk parity with the loop-chain decode variant that matched (if any)
  parity        trainer vs generator logprobs, bf16 models (tiny, tiny_moe, qwen3_5_mid) x (stock, bi, bi_chunk)
  gemm_time     invariant GEMM vs default cuBLAS at training and decode shapes
  gdn_time      recurrent kernel configs: 8 x 4096 tokens, 32 heads, K=V=128; decode 64 seqs vs the state floor
  model_time    trainer forward (no grad) tokens/s for qwen3_5_mid, per mode
  cublaslt      a subprocess with cuBLASLt preferred and its workspace starved: invariance + timing + bits
  pytest        tests/gpu under pytest (output in $OUT/pytest_gpu.txt)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEV = "cuda"
T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


def bench(fn, warmup=10, rep=40):
    """Median ms with CUDA events (do_bench's median)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def bench_graph(fns, reps=8):
    """GPU time per call (ms): the calls fns[0..n-1] (rotating over distinct inputs, more bytes than the 60 MB
    L2) captured `reps` times in one CUDA graph and replayed, so host launch overhead is excluded."""
    for f in fns:
        f()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            for f in fns:
                f()
    ms = bench(lambda: g.replay(), warmup=10, rep=50)
    return ms / (reps * len(fns))


def rand(*shape, dtype=torch.bfloat16, seed=0, scale=1.0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return (torch.randn(*shape, device=DEV, generator=g) * scale).to(dtype)


def relerr(a, ref):
    a, ref = a.double(), ref.double()
    return float((a - ref).norm() / ref.norm().clamp_min(1e-300))


# ----------------------------------------------------------------------------------------------- sections


def sec_env(res, args):
    import triton

    p = torch.cuda.get_device_properties(0)
    return {
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0),
        "sm_count": p.multi_processor_count,
        "gemm_policy_default": __import__("zeromismatch.ops.linear.policy", fromlist=["DEFAULT_GEMM_POLICY"]).DEFAULT_GEMM_POLICY,
        "env": {k: os.environ.get(k) for k in ("CUBLASLT_WORKSPACE_SIZE", "CUBLAS_WORKSPACE_CONFIG")},
    }


def sec_ceilings(res, args):
    a = rand(8192, 8192, seed=1)
    t = time.time()
    while time.time() - t < 3.0:  # bring the clocks up before anything is timed
        a @ a
    torch.cuda.synchronize()
    x = torch.empty(2 * 1024**3 // 4, device=DEV, dtype=torch.float32).normal_()
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    a, b = rand(8192, 8192, seed=1), rand(8192, 8192, seed=2)
    mm = bench(lambda: a @ b)
    return {"copy_TBps": 2 * x.numel() * 4 / ms / 1e9, "bf16_8192_matmul_TFLOPs": 2 * 8192**3 / mm / 1e9}


def sec_reduce(res, args):
    from zeromismatch.ops.reduce import mean_sq_last

    out = {}
    for d in (128, 1024, 4096):
        x = rand(8192, d, dtype=torch.float32, seed=d)
        full = mean_sq_last(x)
        tfull = x.pow(2).mean(-1, keepdim=True)
        ours, theirs = True, True
        for m in (1, 2, 3, 8, 31, 64, 100, 1000, 4096):
            ours &= torch.equal(mean_sq_last(x[:m]), full[:m])
            theirs &= torch.equal(x[:m].pow(2).mean(-1, keepdim=True), tfull[:m])
        out[f"D{d}"] = {"ours_invariant": ours, "torch_mean_invariant": theirs,
                        "ours_relerr_vs_f64": relerr(full, x.double().pow(2).mean(-1, keepdim=True))}
    return out


TRAIN_KN = [(4096, 4096), (4096, 12352), (4096, 12288), (12288, 4096)]
MODEL_KN = [(256, 512), (256, 256), (256, 4), (768, 256), (256, 768), (256, 2048), (256, 192), (192, 256), (256, 1),
            (256, 8), (1024, 8192), (1024, 4096), (1024, 32), (4096, 1024), (1024, 1024)]


def sec_gemm_check(res, args):
    from zeromismatch.ops.linear.triton import CONFIGS, linear_raw

    out = {}
    for (m, k, n) in [(1000, 1024, 4096), (3, 4096, 12352), (5000, 256, 4)]:
        x, w = rand(m, k, seed=3), rand(n, k, seed=4, scale=0.02)
        ref = x.double() @ w.double().t()
        for name, c in CONFIGS.items():
            if name.startswith("f32"):
                continue
            try:
                y = linear_raw(x, w, name)
                out[f"{m}x{k}x{n}:{name}"] = relerr(y, ref)
            except Exception as e:  # e.g. TMA on an unaligned shape
                out[f"{m}x{k}x{n}:{name}"] = f"error: {type(e).__name__}: {str(e)[:200]}"
        xf, wf = x.float(), w.float()
        base = linear_raw(xf, wf, "f32")
        for name in ("f32", "f32_s", "f32_l", "f32_m"):
            y = linear_raw(xf, wf, name)
            out[f"{m}x{k}x{n}:{name}"] = relerr(y, ref)
            out[f"{m}x{k}x{n}:{name}_bits_equal_f32"] = bool(torch.equal(y, base))
        out[f"{m}x{k}x{n}:torch_fp32"] = relerr(xf @ wf.t(), ref)
    return out


def _inv_check(fn, x, ms):
    full = fn(x)
    bad = []
    for m in ms:
        if not torch.equal(fn(x[:m]), full[:m]):
            bad.append(m)
        # a row from the middle, alone
        i = m // 2
        if not torch.equal(fn(x[i : i + 1]), full[i : i + 1]):
            bad.append(f"row{i}")
    return bad


def sec_gemm_inv(res, args):
    import torch.nn.functional as F

    from zeromismatch.ops.linear.triton import linear_raw

    out = {}
    ms_small = [1, 2, 3, 7, 16, 17, 63, 64, 65, 128, 255, 256, 300, 513, 1000, 2047, 2048]
    for (k, n) in MODEL_KN + TRAIN_KN:
        mmax = 16384 if (k, n) in TRAIN_KN else 4096
        ms = ms_small + ([4096, 8191] if mmax > 4096 else [])
        x, w = rand(mmax, k, seed=5), rand(n, k, seed=6, scale=0.02)
        r = {}
        for pol in ("fixed", "adaptive"):
            r[pol] = _inv_check(lambda t: linear_raw(t, w, policy=pol), x, ms)
        r["torch_default"] = _inv_check(lambda t: F.linear(t, w), x, ms)
        if k <= 1024:
            xf, wf = x[:4096].float(), w.float()
            r["fp32_ours"] = _inv_check(lambda t: linear_raw(t, wf), xf, ms_small)
            r["fp32_torch"] = _inv_check(lambda t: F.linear(t, wf), xf, ms_small)
        out[f"K{k}_N{n}"] = {a: (True if not b else b[:8]) for a, b in r.items()}
        torch.cuda.empty_cache()
    summary = {pol: all(v[pol] is True for v in out.values()) for pol in ("fixed", "adaptive")}
    summary["fp32_ours"] = all(v.get("fp32_ours", True) is True for v in out.values())
    summary["torch_default"] = all(v["torch_default"] is True for v in out.values())
    return {"summary": summary, "per_shape": out}


def sec_gemm_cfg(res, args):
    import torch.nn.functional as F

    from zeromismatch.ops.linear.triton import CONFIGS, linear_raw

    out, all_same = {}, True
    for (m, k, n) in [(512, 1024, 8192), (4096, 4096, 12352), (64, 4096, 4096), (300, 256, 512), (4096, 12288, 4096)]:
        x, w = rand(m, k, seed=7), rand(n, k, seed=8, scale=0.02)
        base = linear_raw(x, w, "s64")
        same = {}
        for name in CONFIGS:
            if name.startswith("f32"):
                continue
            try:
                same[name] = bool(torch.equal(linear_raw(x, w, name), base))
            except Exception as e:
                same[name] = f"error: {type(e).__name__}"
            all_same &= same[name] is True
        y = F.linear(x, w)
        same["cublas_default_equal"] = bool(torch.equal(y, base))
        same["cublas_default_frac_equal"] = float((y == base).float().mean())
        out[f"{m}x{k}x{n}"] = same
    return {"all_configs_bitwise_equal": all_same, "per_shape": out}


def sec_bmm(res, args):
    from zeromismatch.ops.linear.bmm_triton import bmm

    out = {}
    shapes = [("attn_qk_d256", (64, 256, 320), torch.bfloat16), ("attn_pv_d256", (64, 320, 256), torch.bfloat16),
              ("attn_qk_d64", (64, 64, 192), torch.bfloat16), ("attn_pv_L2048", (64, 2048, 256), torch.bfloat16),
              ("chunk_64x128x128", (64, 128, 128), torch.float32), ("chunk_64x64x128", (64, 64, 128), torch.float32)]
    for name, (m, k, n), dt in shapes:
        nbmax = 1024 if k < 2048 else 256
        a, b = rand(nbmax, m, k, dtype=dt, seed=9), rand(nbmax, k, n, dtype=dt, seed=10)
        full, tfull = bmm(a, b), torch.matmul(a, b)
        ours, theirs = True, True
        for nb in (1, 2, 3, 8, 16, 33, 128, nbmax):
            ours &= torch.equal(bmm(a[:nb], b[:nb]), full[:nb])
            theirs &= torch.equal(torch.matmul(a[:nb], b[:nb]), tfull[:nb])
        out[name] = {"ours_invariant": ours, "torch_invariant": theirs, "relerr": relerr(full, a.double() @ b.double())}
    return out


def _gdn_inputs(n, h=16, hv=32, dk=128, dv=128, seed=0, dtype=torch.bfloat16):
    g = torch.Generator(device=DEV).manual_seed(seed)
    mixed = torch.randn(n, 2 * h * dk + hv * dv, device=DEV, generator=g).to(dtype)
    q = mixed[:, : h * dk].view(n, h, dk)
    k = mixed[:, h * dk : 2 * h * dk].view(n, h, dk)
    v = mixed[:, 2 * h * dk :].view(n, hv, dv)
    gg = -torch.rand(n, hv, device=DEV, generator=g) * 0.3
    beta = torch.rand(n, hv, device=DEV, generator=g)
    return q, k, v, gg, beta


def _cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device=DEV, dtype=torch.int32)


def sec_gdn(res, args):
    from zeromismatch.ops.gdn.recurrent_triton import recurrent_fwd_triton as gdn_recurrent_fwd
    from zeromismatch.ops.gdn.naive import recurrent_fwd

    out = {}
    lens = [300, 1, 64, 1000, 17]
    cu = _cu(lens)
    q, k, v, g, beta = _gdn_inputs(int(cu[-1]), h=4, hv=8)
    hv, dk, dv = 8, 128, 128
    state = torch.zeros(len(lens), hv, dk, dv, device=DEV)
    o = gdn_recurrent_fwd(q, k, v, g, beta, cu, state)
    errs, alone, split = [], True, True
    for i in range(len(lens)):
        s, e = int(cu[i]), int(cu[i + 1])
        qd, kd = q[s:e].double(), k[s:e].double()
        qd = qd * torch.rsqrt((qd * qd).sum(-1, keepdim=True) + 1e-6) * dk**-0.5
        kd = kd * torch.rsqrt((kd * kd).sum(-1, keepdim=True) + 1e-6)
        rep = hv // qd.shape[1]
        qd, kd = (x.repeat_interleave(rep, 1).transpose(0, 1)[None] for x in (qd, kd))
        oref, sref = recurrent_fwd(qd, kd, v[s:e].double().transpose(0, 1)[None], g[s:e].double().t()[None],
                                   beta[s:e].double().t()[None], torch.zeros(1, hv, dk, dv, device=DEV, dtype=torch.float64))
        errs.append(max(relerr(o[s:e], oref[0].transpose(0, 1)), relerr(state[i], sref[0])))
        st1 = torch.zeros(1, hv, dk, dv, device=DEV)
        o1 = gdn_recurrent_fwd(q[s:e], k[s:e], v[s:e], g[s:e], beta[s:e], _cu([e - s]), st1)
        alone &= bool(torch.equal(o1, o[s:e]) and torch.equal(st1[0], state[i]))
        if e - s > 2:  # split in 3 pieces through cache slots, fp32 state carried
            cache = torch.randn(6, hv, dk, dv, device=DEV)
            cache[4] = 0
            cuts = [s, s + (e - s) // 3, s + (e - s) // 3 + 1, e]
            parts = [gdn_recurrent_fwd(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], _cu([b - a]), cache,
                                       torch.tensor([4], device=DEV)) for a, b in zip(cuts[:-1], cuts[1:])]
            split &= bool(torch.equal(torch.cat(parts), o[s:e]) and torch.equal(cache[4], state[i]))
    out["max_relerr_vs_f64"] = max(errs)
    out["alone_equals_batched"] = alone
    out["split_with_state_exact"] = split
    # decode-style: many sequences of 1 token each, slots scattered in a cache, vs each alone
    n = 64
    q, k, v, g, beta = _gdn_inputs(n, h=4, hv=8, seed=3)
    cache = torch.randn(100, hv, dk, dv, device=DEV) * 0.1
    snap = cache.clone()
    slots = torch.randperm(100, device=DEV)[:n]
    od = gdn_recurrent_fwd(q, k, v, g, beta, _cu([1] * n), cache, slots)
    ok = True
    for i in (0, 5, 63):
        c2 = snap.clone()
        oi = gdn_recurrent_fwd(q[i : i + 1], k[i : i + 1], v[i : i + 1], g[i : i + 1], beta[i : i + 1], _cu([1]), c2,
                               slots[i : i + 1])
        ok &= bool(torch.equal(oi, od[i : i + 1]) and torch.equal(c2[slots[i]], cache[slots[i]]))
    untouched = torch.ones(100, dtype=torch.bool, device=DEV)
    untouched[slots] = False
    out["decode_slots_exact"] = ok
    out["decode_other_slots_untouched"] = bool(torch.equal(cache[untouched], snap[untouched]))
    return out


def _prepared(b, h, t, dk=128, dv=128, seed=11):
    """Prepared-layout GDN inputs [B, HV, T, D] fp32 (q, k l2-normalized, q scaled)."""
    import torch.nn.functional as F

    g = torch.Generator(device=DEV).manual_seed(seed)
    q = F.normalize(torch.randn(b, h, t, dk, device=DEV, generator=g), dim=-1) * dk**-0.5
    k = F.normalize(torch.randn(b, h, t, dk, device=DEV, generator=g), dim=-1)
    v = torch.randn(b, h, t, dv, device=DEV, generator=g)
    gg = -torch.rand(b, h, t, device=DEV, generator=g) * 0.3
    beta = torch.rand(b, h, t, device=DEV, generator=g)
    return q, k, v, gg, beta


def _open_chunk_cache(n_slots, h, dk=128, dv=128, seed=0):
    from zeromismatch.ops.gdn import CHUNK

    g = torch.Generator(device=DEV).manual_seed(seed)
    f = lambda *s: torch.randn(*s, device=DEV, generator=g) * 0.1  # noqa: E731
    return {"ssm": f(n_slots, h, dk, dv), "ck": f(n_slots, h, CHUNK, dk), "cv": f(n_slots, h, CHUNK, dv),
            "cg": -f(n_slots, h, CHUNK).abs(), "cb": f(n_slots, h, CHUNK).abs(), "ct": f(n_slots, h, CHUNK, CHUNK),
            "cu": f(n_slots, h, CHUNK, dv)}


def sec_gdn_chunk(res, args):
    """The chunked forward (ops/gdn/chunk_triton.py) vs float64, alone == batched, prefix stability, and the fused
    bi_chunk decode step == the chunked forward's rows (every open-chunk position, chunk closes included)."""
    from zeromismatch.ops.gdn import CHUNK
    from zeromismatch.ops.gdn.chunk_triton import chunk_decode_triton as chunk_decode
    from zeromismatch.ops.gdn.chunk_triton import chunk_fwd_triton as chunk_fwd
    from zeromismatch.ops.gdn.naive import chunk_fwd as chunk_fwd_torch

    b, h, t, dk, dv = 4, 8, 256, 128, 128
    q, k, v, gg, beta = _prepared(b, h, t)
    s0 = torch.randn(b, h, dk, dv, device=DEV, generator=torch.Generator(device=DEV).manual_seed(3)) * 0.1
    o, st = chunk_fwd(q, k, v, gg, beta, s0)
    o64, st64 = chunk_fwd_torch(*(x.double() for x in (q, k, v, gg, beta, s0)))
    o1, st1 = chunk_fwd(q[2:3], k[2:3], v[2:3], gg[2:3], beta[2:3], s0[2:3])
    prefix = True
    for r in (1, 2, 31, 63):
        def pad(x):
            y = torch.zeros_like(x[:, :, 128:192])
            y[:, :, :r] = x[:, :, 128 : 128 + r]
            return y

        op, _ = chunk_fwd(pad(q), pad(k), pad(v), pad(gg), pad(beta), st[:, :, 2])
        prefix &= bool(torch.equal(op[:, :, :r], o[:, :, 128 : 128 + r]))
    # decode all 4 sequences from token 0 to 255 together (slots 3, 0, 6, 1 of 8), vs the chunked rows
    cache = _open_chunk_cache(8, h)
    slots = torch.tensor([3, 0, 6, 1], device=DEV)
    cache["ssm"][slots] = s0
    od = torch.empty_like(o)
    for i in range(t):
        od[:, :, i] = chunk_decode(q[:, :, i], k[:, :, i], v[:, :, i], gg[:, :, i], beta[:, :, i], slots,
                                   torch.full((b,), i % CHUNK, device=DEV), cache)
    return {
        "relerr_o_vs_f64": relerr(o, o64),
        "relerr_state_vs_f64": relerr(st, st64),
        "relerr_torch_fp32_vs_f64": relerr(chunk_fwd_torch(q, k, v, gg, beta, s0)[0], o64),
        "alone_equals_batched": bool(torch.equal(o1, o[2:3]) and torch.equal(st1, st[2:3])),
        "prefix_stable_zero_padded": prefix,
        "decode_equals_chunked_rows": bool(torch.equal(od, o)),
        "decode_max_abs_diff": float((od - o).abs().max()),
        "decode_final_state_equal": bool(torch.equal(cache["ssm"][slots], st[:, :, -1])),
    }


DEFAULT_CHUNK_SWEEP = ",".join([f"decode:{w}:{bv}" for w in (2, 4, 8) for bv in (16, 32, 64)] +
                               ["prep:4:64", "prep:16:64", "scan:4:64", "scan:4:32", "scan:8:32", "scan:4:16", "scan:8:16"])


def _chain_variants(q, k, v, gg, beta, slots, caches, floor_ms):
    """The experimental decode kernels with the chains written out as loops (fused multiply-add, or multiply
    then add): same bits as the verified `dot` decode (output and every cache tensor) at open-chunk positions
    0, 1, 31, 62, 63? and their time."""
    from zeromismatch.ops.gdn.chunk_triton import chunk_decode_triton as chunk_decode

    clone = lambda c: {n: x.clone() for n, x in c.items()}  # noqa: E731
    out = {}
    for variant in ("chain", "chain_mul_add"):
        r = {}
        try:
            for t in (0, 1, 31, 62, 63):
                pos = torch.full((q.shape[0],), t, device=DEV)
                ca, cb = clone(caches[0]), clone(caches[0])
                oa = chunk_decode(q, k, v, gg, beta, slots, pos, ca, variant="dot")
                ob = chunk_decode(q, k, v, gg, beta, slots, pos, cb, variant=variant)
                r[f"t{t}_equal"] = bool(torch.equal(oa, ob)) and all(torch.equal(ca[n], cb[n]) for n in ca)
                r[f"t{t}_max_abs_diff"] = float((oa - ob).abs().max())
            for t in (31, 63):
                pos = torch.full((q.shape[0],), t, device=DEV)
                r[f"t{t}_ms"] = bench_graph([lambda c=c: chunk_decode(q, k, v, gg, beta, slots, pos, c, variant=variant)
                                             for c in caches])
                r[f"t{t}_over_floor"] = r[f"t{t}_ms"] / floor_ms
        except Exception:
            r["error"] = traceback.format_exc()[-1500:]
        out[variant] = r
        log("decode variant", variant, r)
    return out


def _chunk_sweep(q, k, v, gg, beta, slots, caches, floor_ms, spec=DEFAULT_CHUNK_SWEEP):
    """Launch settings of the chunked kernels (spec: kernel:warps:widest value block, comma-separated): time,
    and bits vs the module defaults."""
    from zeromismatch.ops.gdn import chunk_triton as G

    warps0, bv0, st0 = dict(G.NUM_WARPS), dict(G.BV_MAX), dict(G.NUM_STAGES)
    pos = torch.full((q.shape[0],), 31, device=DEV)
    clone = lambda c: {n: x.clone() for n, x in c.items()}  # noqa: E731
    ref_c = clone(caches[0])
    ref = G.chunk_decode_triton(q, k, v, gg, beta, slots, pos, ref_c, variant="dot")
    out = {"decode": {}, "train": {}}
    entries = []
    for e in spec.split(","):
        f = e.split(":")
        entries.append((f[0], int(f[1]), int(f[2]), int(f[3]) if len(f) > 3 else G.NUM_STAGES[f[0]]))
    for name, w, bv, st in [e for e in entries if e[0] in ("decode", "chain")]:
        G.NUM_WARPS[name], G.BV_MAX[name], G.NUM_STAGES[name] = w, bv, st
        variant = "dot" if name == "decode" else "chain"
        key = f"{name}_w{w}_bv{bv}_s{st}"
        try:
            c = clone(caches[0])
            same = bool(torch.equal(G.chunk_decode_triton(q, k, v, gg, beta, slots, pos, c, variant=variant), ref))
            ms = bench_graph([lambda c=c: G.chunk_decode_triton(q, k, v, gg, beta, slots, pos, c, variant=variant)
                              for c in caches])
            out["decode"][key] = {"ms": ms, "over_floor": ms / floor_ms, "bits_equal_dot": same}
        except Exception as e:
            out["decode"][key] = {"error": repr(e)[-300:]}
        G.NUM_WARPS.update(warps0), G.BV_MAX.update(bv0), G.NUM_STAGES.update(st0)
    if not any(e[0] in ("prep", "scan") for e in entries):
        log("chunk sweep", out)
        return out
    tq, tk, tv, tg, tb = _prepared(2, q.shape[1], 4096, seed=8)
    s0 = torch.zeros(2, q.shape[1], 128, 128, device=DEV)
    ref = G.chunk_fwd_triton(tq, tk, tv, tg, tb, s0)[0]
    for name, settings in [(n, (w, bv)) for n, w, bv, _ in entries if n in ("prep", "scan")]:
        G.NUM_WARPS[name], G.BV_MAX[name] = settings
        try:
            same = bool(torch.equal(G.chunk_fwd_triton(tq, tk, tv, tg, tb, s0)[0], ref))
            ms = bench(lambda: G.chunk_fwd_triton(tq, tk, tv, tg, tb, s0), warmup=1, rep=5)
            out["train"][f"{name}_w{settings[0]}_bv{settings[1]}"] = {"ms_2x4096": ms, "bits_equal_default": same}
        except Exception as e:
            out["train"][f"{name}_w{settings[0]}_bv{settings[1]}"] = {"error": repr(e)[-300:]}
        G.NUM_WARPS.update(warps0), G.BV_MAX.update(bv0)
    out["train"]["default_ms_2x4096"] = bench(lambda: G.chunk_fwd_triton(tq, tk, tv, tg, tb, s0), warmup=1, rep=5)
    log("chunk sweep", out)
    return out


def sec_chunk_time(res, args):
    """bi_chunk's costs. Decode: one token for 64 sequences x 32 heads (K = V = 128) by the fused kernel, per
    open-chunk position (t = 63 also writes the state), vs the fp32 state read + write floor (a copy of all 64
    states) and vs the previous decode (the chunked forward over the zero-padded open chunk). CUDA-graph replay
    over 4 rotating caches. Trainer: the chunked forward for 8 x 4096 tokens x 32 heads vs the recurrent
    kernel (bi's forward) and the torch chunked form."""
    from zeromismatch.ops.gdn import recurrent_triton as R
    from zeromismatch.ops.gdn import CHUNK
    from zeromismatch.ops.gdn.chunk_triton import chunk_decode_triton as chunk_decode
    from zeromismatch.ops.gdn.chunk_triton import chunk_fwd_triton as chunk_fwd
    from zeromismatch.ops.gdn.naive import chunk_fwd as chunk_fwd_torch

    out = {}
    n, h, dk, dv = 64, 32, 128, 128
    q, k, v, gg, beta = (x[:, :, 0].contiguous() for x in _prepared(n, h, 1, seed=5))
    caches = [_open_chunk_cache(n, h, seed=i) for i in range(4)]
    slots = torch.arange(n, device=DEV)
    dec = {}
    for t in (0, 31, 63):
        pos = torch.full((n,), t, device=DEV)
        dec[f"t{t}_ms"] = bench_graph([lambda c=c: chunk_decode(q, k, v, gg, beta, slots, pos, c) for c in caches])
    srcs = [c["ssm"] for c in caches]
    dsts = [torch.empty_like(x) for x in srcs]
    dec["state_floor_ms"] = bench_graph([lambda i=i: dsts[i].copy_(srcs[i]) for i in range(4)])
    dec["mean_ms"] = sum(dec[f"t{t}_ms"] for t in (0, 31, 63)) / 3
    dec["over_floor_t31"] = dec["t31_ms"] / dec["state_floor_ms"]
    dec["over_floor_worst"] = max(dec[f"t{t}_ms"] for t in (0, 31, 63)) / dec["state_floor_ms"]
    pq, pk, pv, pg, pb = _prepared(n, h, CHUNK, seed=6)
    st0 = caches[0]["ssm"]
    dec["recompute_open_chunk_ms"] = bench_graph([lambda: chunk_fwd(pq, pk, pv, pg, pb, st0)])
    dec["recompute_over_fused"] = dec["recompute_open_chunk_ms"] / dec["t31_ms"]
    out["decode_64seq_h32"] = dec
    log("chunk decode", dec)

    out["decode_chain_variants"] = _chain_variants(q, k, v, gg, beta, slots, caches, dec["state_floor_ms"])
    if args.chunk_sweep:
        spec = DEFAULT_CHUNK_SWEEP if args.chunk_sweep == "default" else args.chunk_sweep
        out["sweep"] = _chunk_sweep(q, k, v, gg, beta, slots, caches, dec["state_floor_ms"], spec)
    b, t = 8, 4096
    q, k, v, gg, beta = _prepared(b, h, t, seed=7)
    s0 = torch.zeros(b, h, dk, dv, device=DEV)
    tr = {"chunk_fwd_ms": bench(lambda: chunk_fwd(q, k, v, gg, beta, s0), warmup=2, rep=10)}
    tr["torch_chunk_fp32_ms"] = bench(lambda: chunk_fwd_torch(q, k, v, gg, beta, s0), warmup=1, rep=3)
    rq, rk, rv, rg, rb = _gdn_inputs(b * t, h=h, hv=h, seed=21)
    cu = _cu([t] * b)
    o = torch.empty(b * t, h, dv, device=DEV, dtype=torch.bfloat16)
    state = torch.zeros(b, h, dk, dv, device=DEV)
    tr["recurrent_ms"] = bench(lambda: R.recurrent_fwd_triton(rq, rk, rv, rg, rb, cu, state, out=o), warmup=2, rep=10)
    tr["chunk_over_recurrent"] = tr["chunk_fwd_ms"] / tr["recurrent_ms"]
    out["train_8x4096_h32"] = tr
    return out


def build_gpu_model(preset):
    from zeromismatch.models.qwen3_5 import build_model

    return build_model(preset, "stock", seed=1).to(device=DEV, dtype=torch.bfloat16)


def parity_run(m, mode, n_prompts=16, max_slots=8, max_batched_tokens=256, grad_check=False):
    """Generate with the engine (continuous batching), rescore with the trainer's packed forward, compare."""
    from zeromismatch.generator import Engine, SamplingParams
    from zeromismatch.ops.logprob import token_logprobs

    m.set_numerics(mode)
    m.zero_grad(set_to_none=True)
    vocab = m.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, vocab, (int(n),), generator=g).tolist() for n in torch.randint(3, 150, (n_prompts,), generator=g)]
    eng = Engine(m, max_slots=max_slots, max_batched_tokens=max_batched_tokens)
    torch.cuda.synchronize()
    t = time.perf_counter()
    outs = eng.generate(prompts, [SamplingParams(max_new_tokens=int(20 + 7 * i % 50), seed=i) for i in range(n_prompts)])
    torch.cuda.synchronize()
    gen_s = time.perf_counter() - t
    seqs = [o.all_tokens for o in outs]
    cu = [0]
    for s in seqs:
        cu.append(cu[-1] + len(s))
    ids = torch.tensor([x for s in seqs for x in s], device=DEV)
    t = time.perf_counter()
    with torch.no_grad():
        logits = m(ids, cu)
    torch.cuda.synchronize()
    score_s = time.perf_counter() - t

    def compare(lg):
        maxd, tot, n, eq = 0.0, 0.0, 0, 0
        for i, o in enumerate(outs):
            p, L = len(o.prompt_ids), len(o.tokens)
            rows = torch.arange(cu[i] + p - 1, cu[i] + p - 1 + L, device=DEV)
            lp = token_logprobs(lg[rows], torch.tensor(o.tokens, device=DEV))
            ref = o.logprob_tensor.to(DEV)
            d = (lp - ref).abs()
            maxd, tot, n = max(maxd, d.max().item()), tot + d.sum().item(), n + L
            eq += int(torch.equal(lp, ref))
        return maxd, tot / max(n, 1), n, eq

    maxd, mean_d, n, eq = compare(logits)
    r = {"max_abs_diff": maxd, "abs_mean_diff": mean_d, "tokens": n, "seqs_equal": eq, "seqs": len(outs),
         "gen_s": gen_s, "score_s": score_s, "gen_tokens_per_s": n / gen_s, "total_tokens": len(ids)}
    if grad_check:  # the trainer's forward with autograd on (what RL training runs), then a backward
        with torch.enable_grad():
            lg = m(ids, cu)
            r["grad_forward_max_abs_diff"] = compare(lg.detach())[0]
            lg.float().logsumexp(-1).mean().backward()
        gn = [p.grad.float().norm().item() for p in m.parameters() if p.grad is not None]
        r["backward_ok"] = bool(len(gn) > 0 and all(x == x for x in gn))
        m.zero_grad(set_to_none=True)
    del eng
    torch.cuda.empty_cache()
    return r


def sec_parity(res, args):
    out = {}
    for preset in args.presets.split(","):
        try:
            m = build_gpu_model(preset)
        except Exception:
            out[preset] = {"error": traceback.format_exc()[-3000:]}
            continue
        runs = [(pol, mode) for pol in args.policies.split(",") for mode in ("bi", "bi_chunk")]
        if preset in args.stock_presets.split(","):
            runs.append(("default", "stock"))
        for pol, mode in runs:
            key = f"{preset}:{mode}:{pol}"
            if time.time() - T0 > args.deadline:
                out[key] = "skipped: deadline"
                continue
            numerics = mode if pol == "default" else {"name": mode, "gemm_policy": pol}
            try:
                out[key] = parity_run(m, numerics, grad_check=preset.startswith("tiny"))
            except Exception:
                out[key] = {"error": traceback.format_exc()[-3000:]}
            brief = {a: b for a, b in out[key].items() if a in ("max_abs_diff", "error", "gen_s", "grad_forward_max_abs_diff")}
            log("parity", key, str(brief)[-600:])
        del m
        torch.cuda.empty_cache()
    return out


def sec_parity_chain(res, args):
    """bi_chunk parity with the experimental loop-chain decode kernel, in whichever form (fused or multiply
    then add) matched the dot decode bit for bit in chunk_time's check (none matched: skipped)."""
    checks = (res.get("chunk_time") or {}).get("decode_chain_variants", {})
    ok = [v for v, r in checks.items() if isinstance(r, dict) and r and all(r.get(f"t{t}_equal") for t in (0, 1, 31, 62, 63))]
    if not ok:
        return {"skipped": "no loop-chain variant matched the dot decode"}
    out = {"variant": ok[0]}
    for preset in args.presets.split(","):
        m = build_gpu_model(preset)
        out[preset] = parity_run(m, {"name": "bi_chunk", "chunk_decode": ok[0]})
        log("parity_chain", preset, {a: b for a, b in out[preset].items() if a in ("max_abs_diff", "gen_s")})
        del m
        torch.cuda.empty_cache()
    return out


def sec_gemm_time(res, args):
    """Invariant GEMM (policy pick + alternatives) vs default cuBLAS. Decode shapes: GPU time from CUDA-graph
    replay over 4 rotating weight copies (eager timing of a ~20 us kernel measures the Python launch path);
    training shapes: eager do_bench (launch overhead negligible). Ratios = ours / cuBLAS."""
    import torch.nn.functional as F

    from zeromismatch.ops.linear.triton import _tma_ok, linear_raw, pick

    out = {"train": {}, "decode": {}, "decode_eager": {}, "lm_head_fp32": {}}
    for (k, n) in TRAIN_KN:
        w = rand(n, k, seed=12, scale=0.02)
        for m in (4096, 16384):
            x = rand(m, k, seed=13)
            name = pick(m, n, k, x.dtype, _tma_ok(x, w, n), "adaptive")
            r = {"cublas_ms": bench(lambda: F.linear(x, w)), "policy_cfg": name}
            r["ours_ms"] = bench(lambda: linear_raw(x, w, name))
            r["l256_tma_ms"] = bench(lambda: linear_raw(x, w, "l256_tma"))
            r["ratio"] = r["ours_ms"] / r["cublas_ms"]
            r["ours_tflops"] = 2 * m * n * k / r["ours_ms"] / 1e9
            out["train"][f"M{m}_K{k}_N{n}"] = r
    alts = ["d32", "d64", "s64_tma", "m128_tma"]
    for (k, n) in TRAIN_KN:
        ws = [rand(n, k, seed=20 + i, scale=0.02) for i in range(4)]
        for m in (1, 16, 64, 256):
            if time.time() - T0 > args.deadline:
                out["decode"][f"M{m}_K{k}_N{n}"] = "skipped: deadline"
                continue
            xs = [rand(m, k, seed=30 + i) for i in range(4)]
            name = pick(m, n, k, xs[0].dtype, _tma_ok(xs[0], ws[0], n), "adaptive")
            r = {"policy_cfg": name,
                 "cublas_ms": bench_graph([lambda i=i: F.linear(xs[i], ws[i]) for i in range(4)]),
                 "ours_ms": bench_graph([lambda i=i: linear_raw(xs[i], ws[i], name) for i in range(4)])}
            for c in alts:
                if c != name:
                    r[c + "_ms"] = bench_graph([lambda i=i, c=c: linear_raw(xs[i], ws[i], c) for i in range(4)])
            r["ratio"] = r["ours_ms"] / r["cublas_ms"]
            cands = {c: r[c + "_ms"] for c in alts if c + "_ms" in r}
            cands[name] = r["ours_ms"]
            r["best_cfg"] = min(cands, key=cands.get)
            r["best_ratio"] = cands[r["best_cfg"]] / r["cublas_ms"]
            r["bytes_floor_ms"] = (n * k * 2 + m * k * 2 + m * n * 2) / (4.25e12) * 1e3
            out["decode"][f"M{m}_K{k}_N{n}"] = r
            x, w = xs[0], ws[0]
            out["decode_eager"][f"M{m}_K{k}_N{n}"] = {"cublas_ms": bench(lambda: F.linear(x, w)),
                                                      "ours_ms": bench(lambda: linear_raw(x, w, name))}
    for kind in ("train", "decode"):
        vals = [v["ratio"] for v in out[kind].values() if isinstance(v, dict)]
        out[f"{kind}_ratio_geomean"] = float(torch.tensor(vals).log().mean().exp()) if vals else None
        out[f"{kind}_ratio_max"] = max(vals) if vals else None
    for m in (1, 64, 2048):
        x, w = rand(m, 1024, dtype=torch.float32, seed=14), rand(32768, 1024, dtype=torch.float32, seed=15, scale=0.02)
        r = {"torch_fp32_ms": bench(lambda: F.linear(x, w))}
        for c in ("f32", "f32_s", "f32_l", "f32_m"):
            r[c] = bench(lambda: linear_raw(x, w, c))
        r["ratio_f32"] = r["f32"] / r["torch_fp32_ms"]
        out["lm_head_fp32"][f"M{m}_K1024_N32768"] = r
    return out


def sec_gdn_time(res, args):
    """Recurrent kernel at its module config (the one every call uses) and v1 for comparison."""
    from zeromismatch.ops.gdn import recurrent_triton as R

    out = {"config": {"BV": R.BV, "num_warps": R.NUM_WARPS, "num_stages": R.NUM_STAGES}}
    b, t, h, hv, dk, dv = 8, 4096, 16, 32, 128, 128
    q, k, v, g, beta = _gdn_inputs(b * t, h=h, hv=hv, seed=21)
    cu = _cu([t] * b)
    o = torch.empty(b * t, hv, dv, device=DEV, dtype=torch.bfloat16)
    state = torch.zeros(b, hv, dk, dv, device=DEV)
    out["prefill_8x4096_h32_ms"] = bench(lambda: R.recurrent_fwd_triton(q, k, v, g, beta, cu, state, out=o), warmup=5, rep=40)
    out["prefill_tokens_per_s"] = b * t / out["prefill_8x4096_h32_ms"] * 1e3
    n = 64
    q, k, v, g, beta = _gdn_inputs(n, h=h, hv=hv, seed=22)
    caches = [torch.randn(n, hv, dk, dv, device=DEV) * 0.01 for _ in range(4)]
    slots = torch.arange(n, device=DEV)
    cu1 = _cu([1] * n)
    od = torch.empty(n, hv, dv, device=DEV, dtype=torch.bfloat16)
    out["decode_64seq_ms_graph"] = bench_graph([lambda c=c: R.recurrent_fwd_triton(q, k, v, g, beta, cu1, c, slots, out=od)
                                                for c in caches])
    out["decode_64seq_ms_eager"] = bench(lambda: R.recurrent_fwd_triton(q, k, v, g, beta, cu1, caches[0], slots, out=od),
                                         warmup=20, rep=100)
    dsts = [torch.empty_like(c) for c in caches]
    out["decode_state_floor_ms_graph"] = bench_graph([lambda i=i: dsts[i].copy_(caches[i]) for i in range(4)])
    out["decode_over_floor"] = out["decode_64seq_ms_graph"] / out["decode_state_floor_ms_graph"]
    return out


def _sweep_cfgs():
    from zeromismatch.ops.linear.triton import Cfg

    dec = {}
    for bn in (32, 64):
        for bk in (64, 128):
            for st in (4, 8):
                st = st if (64 * bk + bn * bk) * 2 * st <= 200 * 1024 else 6
                dec[f"n_bn{bn}_bk{bk}_s{st}"] = Cfg(64, bn, bk, 4, st, tma=True)
    for bm in (16, 64):
        for bn in (64, 128):
            for bk in (128, 256):
                for st in (4, 8):
                    if (bm * bk + bn * bk) * 2 * st <= 200 * 1024:
                        dec[f"swap_bm{bm}_bn{bn}_bk{bk}_s{st}"] = Cfg(bm, bn, bk, 4, st, tma=True, swap=True)
    dec["swap_bm16_bn64_bk64_s8"] = Cfg(16, 64, 64, 4, 8, tma=True, swap=True)
    train = {
        "l256_tma": Cfg(128, 256, 64, 8, 3, tma=True),
        "n_256x128_s3": Cfg(256, 128, 64, 8, 3, tma=True),
        "n_128x256_bk128_s2": Cfg(128, 256, 128, 8, 2, tma=True),
        "p_128x256_s3": Cfg(128, 256, 64, 8, 3, tma=True, persistent=True),
        "p_128x256_s3_epi": Cfg(128, 256, 64, 8, 3, tma=True, persistent=True, epi_split=True),
        "p_128x256_s4_epi": Cfg(128, 256, 64, 8, 4, tma=True, persistent=True, epi_split=True),
        "p_128x256_s3_ws": Cfg(128, 256, 64, 8, 3, tma=True, persistent=True, ws=True),
        "p_128x128_s4": Cfg(128, 128, 64, 8, 4, tma=True, persistent=True),
        "p_128x128_s4_w4": Cfg(128, 128, 64, 4, 4, tma=True, persistent=True),
        "p_256x128_s3": Cfg(256, 128, 64, 8, 3, tma=True, persistent=True),
        "p_128x256_s3_g16": Cfg(128, 256, 64, 8, 3, group_m=16, tma=True, persistent=True),
    }
    return dec, train


def sec_gemm_sweep(res, args):
    """Every candidate config: bits equal to the reference config (s64, pointer loads) and median ms, vs cuBLAS."""
    import torch.nn.functional as F

    from zeromismatch.ops.linear.triton import linear_raw

    dec, train = _sweep_cfgs()
    out = {"decode": {}, "train": {}, "bits_all_equal": True}
    for kind, ms, cfgs in (("decode", (1, 16, 64, 256), dec), ("train", (4096, 16384), train)):
        for (k, n) in TRAIN_KN:
            w = rand(n, k, seed=12, scale=0.02)
            for m in ms:
                if time.time() - T0 > args.deadline:
                    break
                x = rand(m, k, seed=13)
                ref = linear_raw(x, w, "s64")
                r = {"cublas_ms": bench(lambda: F.linear(x, w), warmup=5, rep=25)}
                bad = []
                for name, c in cfgs.items():
                    try:
                        y = linear_raw(x, w, c)
                        if not torch.equal(y, ref):
                            bad.append(name)
                        r[name] = bench(lambda: linear_raw(x, w, c), warmup=5, rep=25)
                    except Exception as e:
                        r[name] = f"error: {type(e).__name__}: {str(e)[:120]}"
                best = min((v, c) for c, v in r.items() if c in cfgs and isinstance(v, float) and c not in bad)
                r["best"], r["best_ms"], r["best_ratio"] = best[1], best[0], best[0] / r["cublas_ms"]
                r["bits_differ"] = bad
                out["bits_all_equal"] &= not bad
                out[kind][f"M{m}_K{k}_N{n}"] = r
    # per config: geometric-mean ratio to cuBLAS over the shapes of its kind
    for kind, cfgs in (("decode", dec), ("train", train)):
        gm = {}
        for name in cfgs:
            vals = [v[name] / v["cublas_ms"] for v in out[kind].values() if isinstance(v.get(name), float)]
            if vals:
                gm[name] = float(torch.tensor(vals).log().mean().exp())
        out[f"{kind}_geomean_ratio"] = dict(sorted(gm.items(), key=lambda kv: kv[1])[:12])
    return out


def sec_gdn_sweep(res, args):
    from zeromismatch.ops.gdn.recurrent_triton import recurrent_fwd_triton as gdn_recurrent_fwd

    out = {}
    # checks: float64 reference, alone == batched, split with carried state
    lens = [300, 1, 1000, 17]
    cu = _cu(lens)
    q, k, v, g, beta = _gdn_inputs(int(cu[-1]), h=4, hv=8, seed=5)
    hv, dk, dv = 8, 128, 128
    st = torch.zeros(len(lens), hv, dk, dv, device=DEV)
    o = gdn_recurrent_fwd(q, k, v, g, beta, cu, st)
    errs, alone, split = [], True, True
    from zeromismatch.ops.gdn.naive import recurrent_fwd

    for i in range(len(lens)):
        s, e = int(cu[i]), int(cu[i + 1])
        qd, kd = q[s:e].double(), k[s:e].double()
        qd = qd * torch.rsqrt((qd * qd).sum(-1, keepdim=True) + 1e-6) * dk**-0.5
        kd = kd * torch.rsqrt((kd * kd).sum(-1, keepdim=True) + 1e-6)
        qd, kd = (x.repeat_interleave(hv // 4, 1).transpose(0, 1)[None] for x in (qd, kd))
        oref, _ = recurrent_fwd(qd, kd, v[s:e].double().transpose(0, 1)[None], g[s:e].double().t()[None],
                                beta[s:e].double().t()[None], torch.zeros(1, hv, dk, dv, device=DEV, dtype=torch.float64))
        errs.append(relerr(o[s:e], oref[0].transpose(0, 1)))
        st1 = torch.zeros(1, hv, dk, dv, device=DEV)
        o1 = gdn_recurrent_fwd(q[s:e], k[s:e], v[s:e], g[s:e], beta[s:e], _cu([e - s]), st1)
        alone &= bool(torch.equal(o1, o[s:e]) and torch.equal(st1[0], st[i]))
        if e - s > 2:
            cache = torch.randn(3, hv, dk, dv, device=DEV)
            cache[1] = 0
            cuts = [s, s + 1, s + (e - s) // 2, e]
            parts = [gdn_recurrent_fwd(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], _cu([b - a]), cache,
                                       torch.tensor([1], device=DEV)) for a, b in zip(cuts[:-1], cuts[1:])]
            split &= bool(torch.equal(torch.cat(parts), o[s:e]) and torch.equal(cache[1], st[i]))
    out["max_relerr_vs_f64"] = max(errs)
    out["alone_equals_batched"] = alone
    out["split_exact"] = split
    b, t, h, hv = 8, 4096, 16, 32
    q, k, v, g, beta = _gdn_inputs(b * t, h=h, hv=hv, seed=21)
    cu = _cu([t] * b)
    ob = torch.empty(b * t, hv, dv, device=DEV, dtype=torch.bfloat16)
    state = torch.zeros(b, hv, dk, dv, device=DEV)
    pre = {}
    for bv, warps in [(16, 1), (32, 1), (8, 1), (16, 2), (32, 2), (64, 4)]:
        key = f"BV{bv}_w{warps}"
        try:
            pre[key] = bench(lambda: gdn_recurrent_fwd(q, k, v, g, beta, cu, state, out=ob, block_v=bv, num_warps=warps),
                             warmup=3, rep=20)
        except Exception as e:
            pre[key] = f"error: {type(e).__name__}: {str(e)[:200]}"
    out["prefill_8x4096_h32_ms"] = pre
    n = 64
    q, k, v, g, beta = _gdn_inputs(n, h=h, hv=hv, seed=22)
    cache = torch.randn(n, hv, dk, dv, device=DEV) * 0.01
    slots = torch.arange(n, device=DEV)
    cu1 = _cu([1] * n)
    od = torch.empty(n, hv, dv, device=DEV, dtype=torch.bfloat16)
    dec = {}
    for bv, warps in [(16, 1), (32, 1), (64, 1), (32, 2), (64, 2), (64, 4), (128, 4), (128, 8)]:
        key = f"BV{bv}_w{warps}"
        try:
            dec[key] = bench(lambda: gdn_recurrent_fwd(q, k, v, g, beta, cu1, cache, slots, out=od, block_v=bv,
                                                       num_warps=warps), warmup=20, rep=100)
        except Exception as e:
            dec[key] = f"error: {type(e).__name__}: {str(e)[:200]}"
    dst = torch.empty_like(cache)
    out["decode_64seq_ms"] = dec
    out["decode_state_floor_ms"] = bench(lambda: dst.copy_(cache), warmup=20, rep=100)
    return out


def sec_model_time(res, args):
    from zeromismatch.models.qwen3_5 import build_model

    out = {}
    pol = "adaptive" if res.get("gemm_cfg", {}).get("all_configs_bitwise_equal") else "fixed"
    out["gemm_policy"] = pol
    m = build_model("qwen3_5_mid", "stock", seed=1).to(device=DEV, dtype=torch.bfloat16)
    cu = [i * 1024 for i in range(9)]
    ids = torch.randint(0, m.config.vocab_size, (cu[-1],), device=DEV)
    for mode in ("stock", "bi", "bi_chunk"):
        if time.time() - T0 > args.deadline:
            out[mode] = "skipped: deadline"
            continue
        m.set_numerics({"name": mode, "gemm_policy": pol})
        with torch.no_grad():
            ms = bench(lambda: m(ids, cu), warmup=1, rep=3)
        out[mode] = {"fwd_ms": ms, "tokens_per_s": cu[-1] / ms * 1e3}
    return out


def sec_cublaslt(res, args):
    env = dict(os.environ, CUBLASLT_WORKSPACE_SIZE="1", CUBLAS_WORKSPACE_CONFIG=":16:8")
    path = os.path.join(args.out, "cublaslt.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--cublaslt-worker", "--out", args.out, "--presets", args.hybrid_presets,
           "--hybrid-modes", args.hybrid_modes]
    if args.hybrid_parity:
        cmd.append("--hybrid-parity")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=max(30, args.deadline + 60 - (time.time() - T0)))
    r = json.load(open(path)) if os.path.exists(path) else {}
    r["rc"] = p.returncode
    r["stderr_tail"] = p.stderr[-2000:]
    return r


def cublaslt_worker(args):
    """Runs in a process whose env starves cuBLASLt's workspace (set before CUDA init)."""
    import torch.nn.functional as F

    from zeromismatch.ops.device import configure_cuda, enable_cublaslt_invariant

    enable_cublaslt_invariant()
    configure_cuda()
    from zeromismatch.ops.linear.triton import linear_raw

    out = {"env": {k: os.environ.get(k) for k in ("CUBLASLT_WORKSPACE_SIZE", "CUBLAS_WORKSPACE_CONFIG")}, "inv": {}, "time": {}, "bits_vs_triton": {}}
    ms_small = [1, 2, 3, 7, 16, 17, 63, 64, 65, 128, 255, 256, 300, 513, 1000, 2048]
    for (k, n) in MODEL_KN + TRAIN_KN:
        x, w = rand(8192, k, seed=5), rand(n, k, seed=6, scale=0.02)
        out["inv"][f"K{k}_N{n}"] = _inv_check(lambda t: F.linear(t, w), x, ms_small + [8192]) or True
        if (k, n) in TRAIN_KN or k == 1024:
            for m in (4096, 64):
                y = F.linear(x[:m], w)
                out["bits_vs_triton"][f"M{m}_K{k}_N{n}"] = {c: float((linear_raw(x[:m], w, c) == y).float().mean())
                                                          for c in ("s64", "m128_tma")}
    a, b = rand(512, 64, 256), rand(512, 256, 320)
    full = torch.matmul(a, b)
    out["bmm_inv"] = all(torch.equal(torch.matmul(a[:nb], b[:nb]), full[:nb]) for nb in (1, 2, 3, 16, 100))
    for (k, n) in TRAIN_KN:
        w = rand(n, k, seed=12, scale=0.02)
        for m in (1, 16, 64, 256, 4096, 16384):
            x = rand(m, k, seed=13)
            out["time"][f"M{m}_K{k}_N{n}"] = bench(lambda: F.linear(x, w))
    out["all_invariant"] = all(v is True for v in out["inv"].values())
    json.dump(out, open(os.path.join(args.out, "cublaslt.json"), "w"), indent=1)
    # fp32 (the lm_head): invariance under cuBLASLt, time vs our FMA kernel
    for (k, n) in ((1024, 32768), (256, 2048), (4096, 4096)):
        x, w = rand(4096, k, dtype=torch.float32, seed=5), rand(n, k, dtype=torch.float32, seed=6, scale=0.02)
        out.setdefault("fp32_inv", {})[f"K{k}_N{n}"] = _inv_check(lambda t: F.linear(t, w), x, ms_small + [4096]) or True
    for m in (1, 64, 2048):
        x, w = rand(m, 1024, dtype=torch.float32, seed=14), rand(32768, 1024, dtype=torch.float32, seed=15, scale=0.02)
        out.setdefault("fp32_time", {})[f"M{m}_K1024_N32768"] = bench(lambda: F.linear(x, w))
    json.dump(out, open(os.path.join(args.out, "cublaslt.json"), "w"), indent=1)
    # the hybrid policy: rows computed by Triton (M < HYBRID_MIN_M) == rows computed by cuBLASLt (M >= it)
    from zeromismatch.ops.linear import triton as gemm

    out["hybrid_ready"] = gemm.cublaslt_invariant_ready()
    hyb = {}
    for (k, n) in MODEL_KN + TRAIN_KN:
        x, w = rand(4096, k, seed=5), rand(n, k, seed=6, scale=0.02)
        hyb[f"K{k}_N{n}"] = _inv_check(lambda t: linear_raw(t, w, policy="hybrid"), x, [1, 7, 64, 300, 1023, 1024, 2048]) or True
    out["hybrid_inv"] = hyb
    out["hybrid_all_invariant"] = all(v is True for v in hyb.values())
    json.dump(out, open(os.path.join(args.out, "cublaslt.json"), "w"), indent=1)
    if args.hybrid_parity:
        par = {}
        for preset in args.presets.split(","):
            m = build_gpu_model(preset)
            for mode in args.hybrid_modes.split(","):
                try:
                    par[f"{preset}:{mode}:hybrid"] = parity_run(m, {"name": mode, "gemm_policy": "hybrid"})
                except Exception:
                    par[f"{preset}:{mode}:hybrid"] = {"error": traceback.format_exc()[-2000:]}
            del m
            torch.cuda.empty_cache()
        out["hybrid_parity"] = par
        json.dump(out, open(os.path.join(args.out, "cublaslt.json"), "w"), indent=1)


def sec_pytest(res, args):
    path = os.path.join(args.out, "pytest_gpu.txt")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/gpu", "-p", "no:cacheprovider"],
                       cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=max(30, args.deadline + 90 - (time.time() - T0)))
    open(path, "w").write(p.stdout + "\n" + p.stderr)
    tail = [line for line in p.stdout.splitlines() if line.strip()][-1:] if p.stdout else []
    return {"rc": p.returncode, "summary": tail[0] if tail else "", "log": "pytest_gpu.txt"}


SECTIONS = ["env", "ceilings", "reduce", "gemm_cfg", "gemm_check", "gemm_inv", "bmm", "gdn", "gdn_chunk", "parity",
            "chunk_time", "parity_chain", "gemm_time", "gdn_time", "cublaslt", "pytest", "model_time"]
# also available: gemm_sweep, gdn_sweep (the tile / kernel-variant sweeps behind the defaults)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "results/gpu"))
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--presets", default="tiny,tiny_moe,qwen3_5_mid")
    ap.add_argument("--deadline", type=float, default=520.0, help="seconds after which sections are skipped")
    ap.add_argument("--tag", default="suite")
    ap.add_argument("--policies", default="adaptive", help="GEMM policies the parity section runs bi / bi_chunk under")
    ap.add_argument("--cublaslt-worker", action="store_true")
    ap.add_argument("--hybrid-parity", action="store_true", help="cublaslt worker: parity under gemm_policy=hybrid")
    ap.add_argument("--hybrid-presets", default="tiny,qwen3_5_mid")
    ap.add_argument("--hybrid-modes", default="bi,bi_chunk")
    ap.add_argument("--stock-presets", default="tiny,tiny_moe,qwen3_5_mid")
    ap.add_argument("--chunk-sweep", default="", help="chunk_time: also sweep the chunked kernels' launch settings "
                    "('default', or kernel:warps:bv,... with kernel in decode/prep/scan)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    sys.path.insert(0, os.path.join(ROOT, "src"))
    if args.cublaslt_worker:
        cublaslt_worker(args)
        return
    from zeromismatch.ops.device import configure_cuda

    configure_cuda()
    res: dict = {}
    path = os.path.join(args.out, f"h200_{args.tag}.json")
    for name in args.sections.split(","):
        if time.time() - T0 > args.deadline and name not in ("env",):
            res[name] = "skipped: deadline"
            continue
        log("section", name)
        t = time.time()
        try:
            res[name] = globals()[f"sec_{name}"](res, args)
        except Exception:
            res[name] = {"error": traceback.format_exc()[-4000:]}
        if isinstance(res[name], dict):
            res[name]["_section_s"] = round(time.time() - t, 1)
        json.dump(res, open(path, "w"), indent=1, default=str)
        brief = json.dumps(res[name], default=str)
        log(name, brief[:1500])
    log("done", path)


if __name__ == "__main__":
    main()
