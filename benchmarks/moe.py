"""Routed experts (ops/moe) at the 35B-A3B layer's shape -> $OUT/moe.json.

hidden 2048, 256 experts, top-8, expert width 512, 8 x 4096 = 32768 tokens (--tokens), bf16; routing from a
real softmax router (random weights) over random activations. Forward and forward+backward ms (eager do_bench
median) for:
- stock: torch._grouped_mm (ops/moe/grouped_mm.py), the speed to beat
- bi: the batch-invariant Triton grouped kernels (ops/moe/grouped_triton.py); ratio = bi / stock
- naive: the per-expert loop (a host sync per expert), at --naive-tokens tokens (it is slow), beside bi and
  stock at the same count
The FLOP floor is 2 * tokens * k * hidden * 3 * width (x3 with backward) at 759 TFLOP/s (H200 dense bf16).

    PYTHONPATH=src python benchmarks/moe.py --out DIR --commit SHA [--tokens 32768 --naive-tokens 4096]
"""

import torch
from common import bench, log, parse_args, rand, write_json

PEAK_TFLOPS = 759.0


def _args(ap):
    ap.add_argument("--tokens", type=int, default=8 * 4096)
    ap.add_argument("--naive-tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--width", type=int, default=512)


def problem(n, h, i, e, k):
    x = rand(n, h, seed=1)
    router = rand(e, h, seed=2, scale=h**-0.5)
    probs = torch.softmax((x @ router.t()).float(), dim=-1)
    top_w, top_i = torch.topk(probs, k, dim=-1)
    top_w = (top_w / top_w.sum(-1, keepdim=True)).bfloat16()
    gate_up, down = rand(e, 2 * i, h, seed=3, scale=h**-0.5), rand(e, h, i, seed=4, scale=i**-0.5)
    return x, top_w, top_i, gate_up, down


def timings(fn, args, reps):
    x, top_w, top_i, gate_up, down = args
    with torch.no_grad():
        fwd = bench(lambda: fn(x, top_w, top_i, gate_up, down), rep=reps)
    leaves = [t.detach().requires_grad_() for t in (x, top_w, gate_up, down)]
    dy = torch.randn_like(x)

    def step():
        y = fn(leaves[0], leaves[1], top_i, leaves[2], leaves[3])
        torch.autograd.grad(y, leaves, dy)

    return {"fwd_ms": fwd, "fwd_bwd_ms": bench(step, rep=reps),
            "peak_mem_GiB": torch.cuda.max_memory_allocated() / 2**30}


def floors(n, h, i, k):
    flops = 2 * n * k * h * 3 * i
    return {"fwd_ms": flops / PEAK_TFLOPS / 1e9, "fwd_bwd_ms": 3 * flops / PEAK_TFLOPS / 1e9, "fwd_TFLOP": flops / 1e12}


def section(n, a, forms, reps=40):
    args = problem(n, a.hidden, a.width, a.experts, a.top_k)
    counts = torch.bincount(args[2].reshape(-1), minlength=a.experts)
    out = {"tokens": n, "floor_at_759_TFLOPs": floors(n, a.hidden, a.width, a.top_k),
           "rows_per_expert": {"min": int(counts.min()), "max": int(counts.max()), "empty": int((counts == 0).sum())}}
    for name, fn in forms.items():
        torch.cuda.reset_peak_memory_stats()
        log("moe", n, name)
        out[name] = timings(fn, args, reps)
        out[name]["fwd_TFLOPs"] = out["floor_at_759_TFLOPs"]["fwd_TFLOP"] / out[name]["fwd_ms"] * 1e3
    for name in forms:
        if name != "stock":
            out[name]["ratio_to_grouped_mm"] = {p: out[name][p] / out["stock"][p] for p in ("fwd_ms", "fwd_bwd_ms")}
    return out


def main():
    a = parse_args(__doc__, _args)
    from zeromismatch.ops import moe
    from zeromismatch.ops.moe import grouped_triton, naive

    res = {"shape": {"hidden": a.hidden, "experts": a.experts, "top_k": a.top_k, "width": a.width,
                     "triton_cfg": grouped_triton.CFG[torch.bfloat16], "wgrad_cfg": grouped_triton.WGRAD_CFG[torch.bfloat16]}}
    forms = {"stock": moe.stock, "bi": grouped_triton.experts}
    res["full"] = section(a.tokens, a, forms)
    write_json(a, "moe", res)
    res["naive_tokens"] = section(a.naive_tokens, a, dict(forms, naive=naive.experts), reps=20)
    log("wrote", write_json(a, "moe", res))


if __name__ == "__main__":
    main()
