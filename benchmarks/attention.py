"""Attention times -> $OUT/attention.json, at Qwen3.5-9B's attention shape (16 query / 4 KV heads, head dim 256,
bf16): the bi modes' invariant kernel (ops/attention/flash_triton.py) against torch SDPA (stock's form; causal,
flash backend) and the previous invariant CUDA form (reference.blocked_attention over the invariant bmm).

- train: 8 x 4096 tokens (and 1 x 4096), forward, and forward + backward (the kernel trains through causal
  SDPA, recomputed); TFLOP/s of the causal FLOPs
- decode: one query for each of 64 sequences at context 1024 and 4096 (CUDA-graph replay), against the floor of
  reading their keys and values once (bytes / --bw_tbs)
"""

import torch
from common import DEV, bench, bench_graph, log, parse_args, write_json

HQ, HKV, D = 16, 4, 256


def qkv(b, t, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return tuple(torch.randn(b, h, t, D, device=DEV, generator=g).bfloat16() for h in (HQ, HKV, HKV))


def sdpa_causal(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=D**-0.5, enable_gqa=True)


def train(args):
    from zeromismatch.ops.attention import blocked_attention, sdpa_attention
    from zeromismatch.ops.attention.flash_triton import attention, attention_fwd
    from zeromismatch.ops.linear import bmm

    r = {}
    for b in (1, 8):
        q, k, v = qkv(b, 4096, seed=b)
        pos = torch.arange(4096, device=DEV).expand(b, -1).contiguous()
        flops = 4 * b * HQ * D * 4096 * 4097 / 2
        tag = f"b{b}x4096"
        fwd = {"flash_triton": lambda: attention_fwd(q, k, v, pos, D**-0.5),
               "flash_triton_rows64_w4": lambda: attention_fwd(q, k, v, pos, D**-0.5, rows=64, num_warps=4),
               "flash_triton_rows128_w8_s1": lambda: attention_fwd(q, k, v, pos, D**-0.5, num_stages=1),
               "sdpa_causal": lambda: sdpa_causal(q, k, v),
               "sdpa_masked": lambda: sdpa_attention(q, k, v, pos, D**-0.5)}
        if b == 1:
            fwd["blocked_bmm"] = lambda: blocked_attention(q, k, v, pos, D**-0.5, matmul=bmm)
        for name, fn in fwd.items():
            ms = bench(fn, warmup=20, rep=100)
            r[f"{tag}_fwd_{name}_ms"] = ms
            r[f"{tag}_fwd_{name}_tflops"] = flops / ms / 1e9
            log("attention", tag, name, f"{ms:.3f} ms")
        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
        w = torch.randn_like(q)

        def fb(fn):
            return lambda: torch.autograd.grad((fn() * w).sum(), (qg, kg, vg))

        for name, fn in (("flash_triton", lambda: attention(qg, kg, vg, pos, D**-0.5, causal=True)),
                         ("sdpa_causal", lambda: sdpa_causal(qg, kg, vg)),
                         ("sdpa_masked", lambda: sdpa_attention(qg, kg, vg, pos, D**-0.5))):
            r[f"{tag}_fwd_bwd_{name}_ms"] = bench(fb(fn), warmup=20, rep=60)
        r[f"{tag}_fwd_flash_over_sdpa_causal"] = r[f"{tag}_fwd_flash_triton_ms"] / r[f"{tag}_fwd_sdpa_causal_ms"]
        r[f"{tag}_fwd_bwd_flash_over_sdpa_causal"] = (r[f"{tag}_fwd_bwd_flash_triton_ms"]
                                                      / r[f"{tag}_fwd_bwd_sdpa_causal_ms"])
    return r


def decode(args):
    from zeromismatch.ops.attention.flash_triton import attention_fwd

    r, n = {}, 64
    for ctx in (1024, 4096):
        sets = [qkv(n, ctx, seed=10 + i) for i in range(3)]
        pos = torch.full((n, 1), ctx - 1, device=DEV)
        floor = 2 * n * HKV * ctx * D * 2 / (args.bw_tbs * 1e12) * 1e3
        r[f"ctx{ctx}_floor_ms"] = floor
        for name, fn in (("flash_triton", lambda q, k, v: attention_fwd(q[:, :, -1:], k, v, pos, D**-0.5)),
                         ("sdpa", lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
                             q[:, :, -1:], k, v, scale=D**-0.5, enable_gqa=True))):
            ms = bench_graph([lambda s=s: fn(*s) for s in sets])
            r[f"ctx{ctx}_{name}_ms"], r[f"ctx{ctx}_{name}_over_floor"] = ms, ms / floor
            log("attention decode", ctx, name, f"{ms:.4f} ms, {ms / floor:.2f}x floor")
    return r


def main():
    args = parse_args(__doc__, lambda ap: ap.add_argument("--bw_tbs", type=float, default=4.28))
    res = {"shape": {"query_heads": HQ, "kv_heads": HKV, "head_dim": D, "dtype": "bfloat16"}}
    for name, fn in (("decode", decode), ("train", train)):
        res[name] = fn(args)
        write_json(args, "attention", res)
    log("wrote", write_json(args, "attention", res))


if __name__ == "__main__":
    main()
