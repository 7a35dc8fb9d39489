"""Invariant GEMM (ops/linear/triton.py, the policy's pick) vs default cuBLAS -> $OUT/gemm.json.

- ceilings: device copy TB/s (read + write) and a bf16 8192^3 matmul's TFLOP/s (clocks warmed first)
- train: M 4096 / 16384 at the 9B-class shapes, eager do_bench (launch overhead negligible)
- decode: M 1-256, GPU time from CUDA-graph replay over 4 rotating weight copies (eager timing of a ~20 us
  kernel measures the Python launch path: `decode_eager` shows it), plus alternative configs (same bits)
- lm_head_fp32: fp32 lm_head shapes (qwen3_5_mid's and the 9B's vocab), our FMA kernel's configs and
  candidates (wider tiles; tf32x3: accuracy, same bits across configs) vs torch fp32
- lm_head: the head as it runs now (ops/linear/head.py: bf16 operands, fp32 accumulator and logits) at the same
  shapes: ours (the policy's pick, fp32 output) and cuBLAS with an fp32 output (stock), against the fp32 forms
  (our FMA kernel f32, cuBLAS SGEMM), with the relative error to float64 and alternative tiles for training rows
(--sections picks parts)
Ratios are ours / cuBLAS.
"""

import time

import torch
import torch.nn.functional as F
from common import bench, bench_graph, log, parse_args, rand, write_json

TRAIN_KN = [(4096, 4096), (4096, 12352), (4096, 12288), (12288, 4096)]
DECODE_ALTERNATIVES = ["d16", "d16w", "pd16", "pd32", "d32", "d64", "s64_tma", "m128_tma"]


def ceilings():
    a, b = rand(8192, 8192, seed=1), rand(8192, 8192, seed=2)
    t = time.time()
    while time.time() - t < 3.0:  # bring the clocks up before anything is timed
        a @ b
    torch.cuda.synchronize()
    x = torch.empty(2 * 1024**3 // 4, device="cuda", dtype=torch.float32).normal_()
    y = torch.empty_like(x)
    copy_ms, mm_ms = bench(lambda: y.copy_(x)), bench(lambda: a @ b)
    return {"copy_TBps": 2 * x.numel() * 4 / copy_ms / 1e9, "bf16_8192_matmul_TFLOPs": 2 * 8192**3 / mm_ms / 1e9}


def train_shapes(linear_raw, pick, tma_ok):
    out = {}
    for k, n in TRAIN_KN:
        w = rand(n, k, seed=12, scale=0.02)
        for m in (4096, 16384):
            x = rand(m, k, seed=13)
            name = pick(m, n, k, x.dtype, tma_ok(x, w, n))
            r = {"policy_cfg": name, "cublas_ms": bench(lambda: F.linear(x, w)),
                 "ours_ms": bench(lambda: linear_raw(x, w, name))}
            r["ratio"], r["ours_tflops"] = r["ours_ms"] / r["cublas_ms"], 2 * m * n * k / r["ours_ms"] / 1e9
            out[f"M{m}_K{k}_N{n}"] = r
    return out


def decode_shapes(linear_raw, pick, tma_ok):
    out, eager = {}, {}
    for k, n in TRAIN_KN:
        ws = [rand(n, k, seed=20 + i, scale=0.02) for i in range(4)]
        for m in (1, 16, 64, 256):
            xs = [rand(m, k, seed=30 + i) for i in range(4)]
            name = pick(m, n, k, xs[0].dtype, tma_ok(xs[0], ws[0], n))
            r = {"policy_cfg": name,
                 "cublas_ms": bench_graph([lambda i=i: F.linear(xs[i], ws[i]) for i in range(4)]),
                 "ours_ms": bench_graph([lambda i=i: linear_raw(xs[i], ws[i], name) for i in range(4)])}
            for c in DECODE_ALTERNATIVES:
                if c != name:
                    r[c + "_ms"] = bench_graph([lambda i=i, c=c: linear_raw(xs[i], ws[i], c) for i in range(4)])
            r["ratio"] = r["ours_ms"] / r["cublas_ms"]
            r["bytes_floor_ms"] = (n * k + m * k + m * n) * 2 / 4.25e12 * 1e3  # at the measured 4.25 TB/s copy
            out[f"M{m}_K{k}_N{n}"] = r
            x, w = xs[0], ws[0]
            eager[f"M{m}_K{k}_N{n}"] = {"cublas_ms": bench(lambda: F.linear(x, w)),
                                        "ours_ms": bench(lambda: linear_raw(x, w, name))}
    return out, eager


def fp32_candidates():
    """fp32 configs beyond CONFIGS: wider ieee tiles, and tf32x3 (three tensor-core tf32 products per dot, about
    fp32 accurate) whose bits differ from ieee's but, like every tensor-core dot, should not differ between
    configs (checked here)."""
    from zeromismatch.ops.linear.triton import Cfg

    return {"ieee_128x128x16_w8": Cfg(128, 128, 16, 8, 4), "ieee_128x256x16_w8": Cfg(128, 256, 16, 8, 3),
            "ieee_64x128x32_w4": Cfg(64, 128, 32, 4, 3),
            "x3_128x128x32_w8": Cfg(128, 128, 32, 8, 3, prec="tf32x3"),
            "x3_128x64x32_w4": Cfg(128, 64, 32, 4, 3, prec="tf32x3"),
            "x3_64x64x32_w4": Cfg(64, 64, 32, 4, 3, prec="tf32x3"),
            "x3_16x64x32_w4": Cfg(16, 64, 32, 4, 4, prec="tf32x3")}


def lm_head_fp32(linear_raw):
    out, cands = {}, fp32_candidates()
    for m, k, n in ((1, 1024, 32768), (16, 1024, 32768), (2048, 1024, 32768), (4096, 1024, 32768), (1, 4096, 248320),
                    (4096, 4096, 248320)):
        x, w = rand(m, k, dtype=torch.float32, seed=14), rand(n, k, dtype=torch.float32, seed=15, scale=0.02)
        r = {"torch_fp32_ms": bench(lambda: F.linear(x, w))}
        ref = (x.double() @ w.double().t()) if m * n <= 2048 * 32768 else None
        x3_bits = None
        for c in ("f32", "f32_s", "f32_l", "f32_m", "f32_d", *cands):
            cfg = cands.get(c, c)
            if m > 16 and c in ("f32_d", "x3_16x64x32_w4"):
                continue
            r[c + "_ms"] = bench(lambda: linear_raw(x, w, cfg))
            y = linear_raw(x, w, cfg)
            if ref is not None:
                r[c + "_rel_err"] = float((y.double() - ref).norm() / ref.norm())
            if c.startswith("x3"):  # tf32x3: the same bits in every config, and for a row alone
                x3_bits = y if x3_bits is None else x3_bits
                r[c + "_same_bits"] = bool(torch.equal(y, x3_bits)) and bool(torch.equal(linear_raw(x[:1], w, cfg), y[:1]))
        r["ratio_f32"] = r["f32_ms"] / r["torch_fp32_ms"]
        out[f"M{m}_K{k}_N{n}"] = r
        log("lm_head_fp32", m, k, n, {a: round(v, 3) for a, v in r.items() if a.endswith("_ms")})
    return out


def lm_head(linear_raw, pick, tma_ok):
    from zeromismatch.ops.linear.triton import CONFIGS, Cfg, fit_smem

    out = {}
    alts = {"p256_s3": Cfg(128, 256, 64, 8, 3, tma=True, persistent=True, epi_split=True),
            "m128_tma": fit_smem(CONFIGS["m128_tma"], torch.float32), "m128": CONFIGS["m128"]}
    for m, k, n in ((1, 1024, 32768), (64, 1024, 32768), (4096, 1024, 32768), (1, 4096, 248320), (64, 4096, 248320),
                    (4096, 4096, 248320)):
        x, w = rand(m, k, seed=14), rand(n, k, seed=15, scale=0.02)
        xf, wf = x.float(), w.float()
        name = pick(m, n, k, x.dtype, tma_ok(x, w, n))
        timer = bench if m > 64 else (lambda f: bench_graph([f]))
        r = {"policy_cfg": name, "ours_ms": timer(lambda: linear_raw(x, w, out_dtype=torch.float32)),
             "cublas_fp32_out_ms": timer(lambda: torch.mm(x, w.t(), out_dtype=torch.float32)),
             "ours_fp32_fma_ms": timer(lambda: linear_raw(xf, wf)),
             "cublas_sgemm_ms": timer(lambda: F.linear(xf, wf))}
        if m <= 64:  # decode rows: the narrow-tile configs (fitted to the fp32 epilogue), same bits as the pick
            for a in ("d16", "d16w", "d32", "d64", "s64_tma", "s32"):
                if a != name:
                    r[a + "_ms"] = timer(lambda a=a: linear_raw(x, w, a, out_dtype=torch.float32))
        else:
            for a, cfg in alts.items():
                try:
                    r[a + "_ms"] = bench(lambda: linear_raw(x, w, cfg, out_dtype=torch.float32))
                except Exception as e:  # a config that does not compile here is recorded, not fatal
                    r[a + "_error"] = repr(e)[:200]
        rows = slice(0, min(m, 64))
        ref = x[rows].double() @ w.double().t()
        for key, y in (("ours", linear_raw(x, w, out_dtype=torch.float32)[rows]),
                       ("cublas_fp32_out", torch.mm(x, w.t(), out_dtype=torch.float32)[rows]),
                       ("fp32_sgemm", F.linear(xf, wf)[rows]), ("bf16_out", F.linear(x, w)[rows])):
            r[key + "_rel_err"] = float((y.double() - ref).norm() / ref.norm())
        r["ours_vs_fp32_fma"] = r["ours_fp32_fma_ms"] / r["ours_ms"]
        r["ours_vs_cublas_fp32_out"] = r["ours_ms"] / r["cublas_fp32_out_ms"]
        r["weight_read_floor_ms"] = n * k * 2 / 4.25e12 * 1e3
        r["tflops"] = 2 * m * n * k / r["ours_ms"] / 1e9
        out[f"M{m}_K{k}_N{n}"] = r
        log("lm_head", m, k, n, {a: round(v, 4) for a, v in r.items() if isinstance(v, float)})
    return out


def geomean(vals):
    return float(torch.tensor(vals).log().mean().exp()) if vals else None


def main():
    args = parse_args(__doc__, lambda ap: ap.add_argument("--sections", default="ceilings,train,decode,lm_head"))
    from zeromismatch.ops.linear.triton import _tma_ok, linear_raw, pick

    res, only = {}, set(args.sections.split(","))
    for name, fn in (("ceilings", ceilings), ("train", lambda: train_shapes(linear_raw, pick, _tma_ok)),
                     ("decode", lambda: decode_shapes(linear_raw, pick, _tma_ok)),
                     ("lm_head_fp32", lambda: lm_head_fp32(linear_raw)),
                     ("lm_head", lambda: lm_head(linear_raw, pick, _tma_ok))):
        if name not in only:
            continue
        log("gemm", name)
        r = fn()
        if name == "decode":
            r, res["decode_eager"] = r
        res[name] = r
        if name in ("train", "decode"):
            ratios = [v["ratio"] for v in r.values()]
            res[f"{name}_ratio_geomean"], res[f"{name}_ratio_max"] = geomean(ratios), max(ratios)
        write_json(args, "gemm", res)
    log("wrote", write_json(args, "gemm", res))


if __name__ == "__main__":
    main()
