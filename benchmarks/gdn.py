"""GDN kernels' times -> $OUT/gdn.json (64 sequences x 32 value heads for decode, 8 x 4096 tokens for the
trainer; K = V = 128 unless named).

- recurrent (bi; ops/gdn/recurrent_triton.py): the 8 x 4096-token forward; one decode step (CUDA-graph replay
  over 4 rotating caches, and eager) vs the fp32 state read + write floor (a copy of the 64 states)
- chunk_decode (bi_chunk; ops/gdn/decode_triton.py): the decode step at open-chunk positions 0, 31, 63
  (63 closes the chunk and writes the state) vs the same floor, and its mean over the 64 positions of a chunk,
  for each arithmetic and kernel (tf32: the split pair, the one-program dot kernel; ieee: the chain kernel, and
  the dot kernel); the step at K = V = 96 (padded to 128 for the keys); recomputing the zero-padded open chunk
  with the chunked forward instead
- chunk_train: the chunked forward (tf32 and ieee) vs the recurrent kernel vs torch's fp32 chunked form (not
  invariant)
- chunk_grad: forward + backward of the chunked form the trainer differentiates (ops/gdn/autograd.py
  chunk_reference) with its scan over chunks as the torch loop vs the Triton kernel pair (scan_triton.py, tf32
  and ieee), one sequence of 4096 tokens and all 8 packed; the tf32 gradient's relative error against ieee
- decode_settings: the tf32 decode step's launch settings, at 64 sequences and at one (the dot kernel at its
  pick, with and without the value split; the split pair's rows / values warps and value block; its rows kernel
  alone)
- settings: the chunked forward's tf32 launch settings (prep substitution and warps, scan warps and value block)
"""

import torch
import torch.nn.functional as F
from common import DEV, bench, bench_graph, cu_seqlens, log, parse_args, write_json

N_SEQ, HEADS, B_TRAIN, T_TRAIN = 64, 32, 8, 4096


def raw_inputs(n, h, hv, dk=128, dv=128, seed=0):
    """Recurrent-kernel inputs (q, k raw bf16 [n, h, K]; v [n, hv, V]; g, beta fp32 [n, hv])."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    mixed = torch.randn(n, 2 * h * dk + hv * dv, device=DEV, generator=g).bfloat16()
    q, k = mixed[:, : h * dk].view(n, h, dk), mixed[:, h * dk : 2 * h * dk].view(n, h, dk)
    v = mixed[:, 2 * h * dk :].view(n, hv, dv)
    return q, k, v, -torch.rand(n, hv, device=DEV, generator=g) * 0.3, torch.rand(n, hv, device=DEV, generator=g)


def prepared_inputs(b, h, t, dk=128, dv=128, seed=0):
    """Chunked-form inputs [B, HV, T, D] fp32, q and k l2-normalized, q scaled."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    q = F.normalize(torch.randn(b, h, t, dk, device=DEV, generator=g), dim=-1) * dk**-0.5
    k = F.normalize(torch.randn(b, h, t, dk, device=DEV, generator=g), dim=-1)
    v = torch.randn(b, h, t, dv, device=DEV, generator=g)
    return q, k, v, -torch.rand(b, h, t, device=DEV, generator=g) * 0.3, torch.rand(b, h, t, device=DEV, generator=g)


def open_chunk_cache(n, h, dk=128, dv=128, seed=0):
    from zeromismatch.ops.gdn import CHUNK

    g = torch.Generator(device=DEV).manual_seed(seed)
    f = lambda *s: torch.randn(*s, device=DEV, generator=g) * 0.1  # noqa: E731
    return {"ssm": f(n, h, dk, dv), "ck": f(n, h, CHUNK, dk), "cv": f(n, h, CHUNK, dv), "cg": -f(n, h, CHUNK).abs(),
            "cb": f(n, h, CHUNK).abs(), "ct": f(n, h, CHUNK, CHUNK), "cu": f(n, h, CHUNK, dv)}


def state_floor(caches):
    srcs = [c["ssm"] if isinstance(c, dict) else c for c in caches]
    dsts = [torch.empty_like(x) for x in srcs]
    return bench_graph([lambda i=i: dsts[i].copy_(srcs[i]) for i in range(len(srcs))])


def recurrent():
    from zeromismatch.ops.gdn.recurrent_triton import recurrent_fwd_triton

    q, k, v, g, beta = raw_inputs(B_TRAIN * T_TRAIN, HEADS // 2, HEADS, seed=21)
    cu = cu_seqlens([T_TRAIN] * B_TRAIN)
    o = torch.empty(B_TRAIN * T_TRAIN, HEADS, 128, device=DEV, dtype=torch.bfloat16)
    state = torch.zeros(B_TRAIN, HEADS, 128, 128, device=DEV)
    r = {"prefill_8x4096_ms": bench(lambda: recurrent_fwd_triton(q, k, v, g, beta, cu, state, out=o), warmup=5, rep=40)}
    r["prefill_tokens_per_s"] = B_TRAIN * T_TRAIN / r["prefill_8x4096_ms"] * 1e3
    q, k, v, g, beta = raw_inputs(N_SEQ, HEADS // 2, HEADS, seed=22)
    caches = [torch.randn(N_SEQ, HEADS, 128, 128, device=DEV) * 0.01 for _ in range(4)]
    slots, cu1 = torch.arange(N_SEQ, device=DEV), cu_seqlens([1] * N_SEQ)
    od = torch.empty(N_SEQ, HEADS, 128, device=DEV, dtype=torch.bfloat16)
    step = lambda c: recurrent_fwd_triton(q, k, v, g, beta, cu1, c, slots, out=od)  # noqa: E731
    r["decode_ms_graph"] = bench_graph([lambda c=c: step(c) for c in caches])
    r["decode_ms_eager"] = bench(lambda: step(caches[0]), warmup=20, rep=100)
    r["state_floor_ms_graph"] = state_floor(caches)
    r["decode_over_floor"] = r["decode_ms_graph"] / r["state_floor_ms_graph"]
    return r


def chunk_decode():
    from zeromismatch.ops.gdn import CHUNK
    from zeromismatch.ops.gdn.chunk_triton import chunk_decode_triton, chunk_fwd_triton

    r = {}
    kernels = (("tf32", "split"), ("tf32", "dot"), ("ieee", "chain"), ("ieee", "dot"))
    for dk, dv, variants, positions in ((128, 128, kernels, (0, 31, 63)), (96, 96, kernels[:3:2], (31,))):
        q, k, v, gg, beta = (x[:, :, 0].contiguous() for x in prepared_inputs(N_SEQ, HEADS, 1, dk, dv, seed=5))
        caches = [open_chunk_cache(N_SEQ, HEADS, dk, dv, seed=i) for i in range(4)]
        slots, tag = torch.arange(N_SEQ, device=DEV), f"K{dk}_V{dv}"
        r[f"{tag}_state_floor_ms"] = floor = state_floor(caches)
        for dots, kernel in variants:
            name = f"{tag}_{dots}_{kernel}"
            for t in positions:
                pos = torch.full((N_SEQ,), t, device=DEV)
                ms = bench_graph([lambda c=c: chunk_decode_triton(q, k, v, gg, beta, slots, pos, c, dots=dots,
                                                                  kernel=kernel) for c in caches])
                r[f"{name}_t{t}_ms"], r[f"{name}_t{t}_over_floor"] = ms, ms / floor
            if dk == 128:
                # a whole chunk: 64 graph-captured steps at positions 0..63 (the state written once, at 63)
                steps = [torch.full((N_SEQ,), t, device=DEV) for t in range(CHUNK)]
                ms = bench_graph([lambda c=c: [chunk_decode_triton(q, k, v, gg, beta, slots, p, c, dots=dots,
                                                                   kernel=kernel) for p in steps] for c in caches])
                r[f"{name}_chunk_mean_ms"] = ms / CHUNK
                r[f"{name}_chunk_mean_over_floor"] = ms / CHUNK / floor
    pq, pk, pv, pg, pb = prepared_inputs(N_SEQ, HEADS, CHUNK, seed=6)
    st0 = open_chunk_cache(N_SEQ, HEADS)["ssm"]
    r["recompute_open_chunk_ms"] = bench_graph([lambda: chunk_fwd_triton(pq, pk, pv, pg, pb, st0)])
    r["recompute_over_tf32_t31"] = r["recompute_open_chunk_ms"] / r["K128_V128_tf32_split_t31_ms"]
    return r


def chunk_train():
    from zeromismatch.ops.gdn.chunk_triton import chunk_fwd_triton
    from zeromismatch.ops.gdn.naive import chunk_fwd
    from zeromismatch.ops.gdn.recurrent_triton import recurrent_fwd_triton

    q, k, v, gg, beta = prepared_inputs(B_TRAIN, HEADS, T_TRAIN, seed=7)
    s0 = torch.zeros(B_TRAIN, HEADS, 128, 128, device=DEV)
    r = {f"chunk_fwd_{dots}_ms": bench(lambda d=dots: chunk_fwd_triton(q, k, v, gg, beta, s0, dots=d), warmup=2, rep=10)
         for dots in ("tf32", "ieee")}
    r["torch_chunk_fp32_ms"] = bench(lambda: chunk_fwd(q, k, v, gg, beta, s0), warmup=1, rep=3)
    rq, rk, rv, rg, rb = raw_inputs(B_TRAIN * T_TRAIN, HEADS, HEADS, seed=21)
    cu = cu_seqlens([T_TRAIN] * B_TRAIN)
    o = torch.empty(B_TRAIN * T_TRAIN, HEADS, 128, device=DEV, dtype=torch.bfloat16)
    r["recurrent_ms"] = bench(lambda: recurrent_fwd_triton(rq, rk, rv, rg, rb, cu, s0, out=o), warmup=2, rep=10)
    r["chunk_tf32_over_recurrent"] = r["chunk_fwd_tf32_ms"] / r["recurrent_ms"]
    o64 = chunk_fwd(*(x[:1, :4].double() for x in (q, k, v, gg, beta)), s0[:1, :4].double())[0]
    for dots in ("tf32", "ieee"):  # accuracy against float64 (one sequence, 4 heads)
        o = chunk_fwd_triton(q[:1, :4], k[:1, :4], v[:1, :4], gg[:1, :4], beta[:1, :4], s0[:1, :4], dots=dots)[0]
        r[f"chunk_fwd_{dots}_rel_err_fp64"] = float((o.double() - o64).norm() / o64.norm())
    return r


def chunk_grad():
    import zeromismatch.ops.gdn.scan_triton as scan
    from zeromismatch.ops.gdn.naive import chunk_fwd, chunk_scan

    def fwd_bwd(b, scan_fn):
        xs = [x.requires_grad_() for x in prepared_inputs(b, HEADS, T_TRAIN, seed=7)]
        s0 = torch.zeros(b, HEADS, 128, 128, device=DEV)
        w = torch.randn(b, HEADS, T_TRAIN, 128, device=DEV, generator=torch.Generator(device=DEV).manual_seed(3))

        def run():
            o = chunk_fwd(*xs, s0, scan=scan_fn)[0]
            return torch.autograd.grad((o * w).sum(), xs)
        return run

    r = {}
    for b in (1, B_TRAIN):
        r[f"torch_loop_b{b}_ms"] = bench(fwd_bwd(b, chunk_scan), warmup=1, rep=3)
        for prec in ("tf32", "ieee"):
            scan.PRECISION = prec
            r[f"triton_{prec}_b{b}_ms"] = bench(fwd_bwd(b, scan.chunk_scan_triton), warmup=2, rep=10)
        scan.PRECISION = "tf32"
        r[f"speedup_tf32_b{b}"] = r[f"torch_loop_b{b}_ms"] / r[f"triton_tf32_b{b}_ms"]
    grads = {}
    for prec in ("tf32", "ieee"):
        scan.PRECISION = prec
        grads[prec] = fwd_bwd(1, scan.chunk_scan_triton)()
    scan.PRECISION = "tf32"
    r["tf32_grad_rel_err"] = max(float((a - b).norm() / b.norm()) for a, b in zip(grads["tf32"], grads["ieee"]))
    return r


def decode_settings():
    """The tf32 decode step's launch settings (any gives the same bits: tests/gpu), mean over a chunk's 64
    positions at 64 sequences and at one: the one-program kernel at its pick (one sequence: without and with the
    value split), the split pair by rows / values warps and values block; and the split pair's rows kernel alone
    (its values kernel's launch stubbed out), so the two kernels' shares are known."""
    from unittest import mock

    from zeromismatch.ops.gdn import CHUNK
    from zeromismatch.ops.gdn import chunk_triton as ct

    r, saved = {}, (dict(ct.NUM_WARPS), dict(ct.BV_MAX), ct.DECODE_VSPLIT)
    q, k, v, gg, beta = (x[:, :, 0].contiguous() for x in prepared_inputs(N_SEQ, HEADS, 1, seed=5))
    caches = [open_chunk_cache(N_SEQ, HEADS, seed=i) for i in range(4)]
    slots = torch.arange(N_SEQ, device=DEV)
    steps = [torch.full((N_SEQ,), t, device=DEV) for t in range(CHUNK)]
    floor = state_floor(caches)
    pristine = {name: t.clone() for name, t in caches[0].items()}  # the timed steps below update caches[0]

    def one_chunk(kernel=None):  # a chunk of decode steps from the same cache: (outputs, final cache) to compare bits
        c = {name: t.clone() for name, t in pristine.items()}
        return [ct.chunk_decode_triton(q, k, v, gg, beta, slots, p, c, kernel=kernel) for p in steps], c

    def chunk_mean(n, cs, kernel):  # ms per step over a chunk of steps, n sequences
        xs, sl = [x[:n] for x in (q, k, v, gg, beta)], slots[:n]
        return bench_graph([lambda c=c: [ct.chunk_decode_triton(*xs, sl, p[:n], c, kernel=kernel) for p in steps]
                            for c in cs], reps=2) / CHUNK

    ref_o, ref_c = one_chunk()
    caches1 = [{name: t[:1].clone() for name, t in c.items()} for c in caches]
    floor1 = state_floor(caches1)
    # (kernel, warps, widest value block): the one-program kernel at its pick; the split pair's rows x values
    # warps and values block
    combos = [("dot", {"decode": 4}, {"decode": 32})] + [
        ("split", {"rows": rw, "values": vw}, {"values": vb})
        for rw, vw, vb in ((2, 4, 32), (1, 4, 32), (4, 4, 32), (8, 4, 32), (2, 2, 32), (2, 8, 32), (2, 4, 64),
                           (2, 8, 64), (1, 8, 64), (2, 4, 16), (2, 4, 128))]
    try:
        for kernel, warps, bv in combos:
            ct.NUM_WARPS.update(warps)
            ct.BV_MAX.update(bv)
            tag = "_".join([f"decode_{kernel}"] + [f"{n}_w{w}" for n, w in warps.items()] +
                           [f"{n}_bv{b}" for n, b in bv.items()])
            ct.DECODE_VSPLIT = None
            o, c = one_chunk(kernel)
            r[f"{tag}_same_bits"] = all(torch.equal(a, b) for a, b in zip(o, ref_o)) and \
                all(torch.equal(c[n], ref_c[n]) for n in c)
            ms = chunk_mean(N_SEQ, caches, kernel)
            r[f"{tag}_chunk_mean_ms"], r[f"{tag}_chunk_mean_over_floor"] = ms, ms / floor
            # one sequence; the dot kernel without the value split and with the one that fills the GPU (4)
            for vs in ((1, None) if kernel == "dot" else (None,)):
                ct.DECODE_VSPLIT = vs
                ms = chunk_mean(1, caches1, kernel)
                split = "" if kernel == "split" else f"_vs{'fill' if vs is None else vs}"
                r[f"{tag}_1seq{split}_chunk_mean_ms"], r[f"{tag}_1seq{split}_chunk_mean_over_floor"] = \
                    ms, ms / floor1
            if kernel == "split" and bv["values"] == 32 and warps["values"] == 4:  # rows kernel alone (values stubbed)
                with mock.patch.object(ct, "_launch", lambda *a, **kw: None):
                    r[f"{tag}_rows_only_chunk_mean_ms"] = chunk_mean(N_SEQ, caches, kernel)
                    r[f"{tag}_1seq_rows_only_chunk_mean_ms"] = chunk_mean(1, caches1, kernel)
            ct.NUM_WARPS.update(saved[0])
            ct.BV_MAX.update(saved[1])
            log("gdn decode settings", tag, {k_: v_ for k_, v_ in r.items() if k_.startswith(tag)})
    except KeyboardInterrupt:  # the time limit (SIGINT): keep what was measured
        r["interrupted"] = True
    finally:
        ct.NUM_WARPS.update(saved[0])
        ct.BV_MAX.update(saved[1])
        ct.DECODE_VSPLIT = saved[2]
    return r


def settings():
    """The chunked forward's tf32 launch settings (any gives the same bits: tests/gpu), one sequence and two: the
    prep kernel's substitution (row / whole tile) and warps, the scan kernel's warps and value block."""
    from zeromismatch.ops.gdn import chunk_triton as ct

    r, saved = {}, (dict(ct.NUM_WARPS), dict(ct.BV_MAX), ct.WHOLE_TILE_SUBSTITUTION)
    try:
        # one sequence (the trainer's microbatch; the scan has (V / value block) x 32 programs) and two
        combos = [(whole, prep_w, 8, 16) for whole in (False, True) for prep_w in (8, 16)]
        combos += [(True, 8, scan_w, scan_bv) for scan_w, scan_bv in ((4, 32), (8, 64), (4, 128))]
        for b in (1, 2):
            pq, pk, pv, pg, pb = prepared_inputs(b, HEADS, T_TRAIN, seed=7)
            s0 = torch.zeros(b, HEADS, 128, 128, device=DEV)
            ref = ct.chunk_fwd_triton(pq, pk, pv, pg, pb, s0)
            for whole, prep_w, scan_w, scan_bv in combos:
                ct.WHOLE_TILE_SUBSTITUTION = whole
                ct.NUM_WARPS["prep"], ct.NUM_WARPS["scan"], ct.BV_MAX["scan"] = prep_w, scan_w, scan_bv
                tag = f"fwd_{b}x4096_{'tile' if whole else 'row'}_prep_w{prep_w}_scan_w{scan_w}_bv{scan_bv}"
                got = ct.chunk_fwd_triton(pq, pk, pv, pg, pb, s0)
                r[tag + "_same_bits"] = all(torch.equal(x, y) for x, y in zip(got, ref))
                r[tag + "_ms"] = bench(lambda: ct.chunk_fwd_triton(pq, pk, pv, pg, pb, s0), warmup=2, rep=10)
    except KeyboardInterrupt:  # the time limit (SIGINT): keep what was measured
        r["interrupted"] = True
    finally:
        ct.WHOLE_TILE_SUBSTITUTION = saved[2]
        ct.NUM_WARPS.update(saved[0])
        ct.BV_MAX.update(saved[1])
    return r


def main():
    args = parse_args(__doc__, lambda ap: ap.add_argument(
        "--sections", default="recurrent,chunk_decode,chunk_train,chunk_grad,decode_settings,settings"))
    res = {}
    only = set(args.sections.split(","))
    for name, fn in (("recurrent", recurrent), ("chunk_decode", chunk_decode), ("chunk_train", chunk_train),
                     ("chunk_grad", chunk_grad), ("decode_settings", decode_settings), ("settings", settings)):
        if name not in only:
            continue
        log("gdn", name)
        res[name] = fn()
        write_json(args, "gdn", res)
    log("wrote", write_json(args, "gdn", res))


if __name__ == "__main__":
    main()
