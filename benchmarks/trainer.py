"""Trainer step per numerics mode -> $OUT/h200_trainer.json (+ .png): forward + backward of the trainer's loss
input (packed varlen forward, fp32 lm_head, next-token logprobs: trainer/scoring.py) over 8 sequences of
4096 tokens in bf16, --microbatch_seqs sequences per packed microbatch (default 1; the trainer's default
trainer.microbatch_tokens=16384 packs 4 of them), gradients accumulated over the microbatches. For
qwen3_5_mid and a 9B-shaped model (Qwen3.5-9B's width, --layers_9b of its layers, random weights). Reports
step ms (median of --reps after one warmup step), its forward / backward split, tokens/s, model FLOPs
utilization (6 x parameters x tokens, embeddings excluded, lm_head included; `mfu` against --peak_tflops, the
bf16 matmul rate measured on the H200, and `mfu_vs_measured` against the rate an 8192^3 bf16 matmul reaches
on this GPU in the same run; the recomputed forward of --activation_checkpointing is not counted) and peak GPU
memory. The optimizer step is not timed (AdamW: one pass over the parameters, the same in every mode)."""

import contextlib
import statistics
import time
from unittest import mock

import torch
from common import DEV, kernel_profile, log, matmul_tflops, parse_args, write_json
from generator import build

MODES = ("stock", "bi", "bi_chunk")


def extra_args(ap):
    ap.add_argument("--models", default="qwen3_5_mid,qwen3_5_9b_shaped")
    ap.add_argument("--layers_9b", type=int, default=8)
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--seq_len", type=int, default=4096)
    ap.add_argument("--microbatch_seqs", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--peak_tflops", type=float, default=759.0)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--torch_scan", action="store_true",
                    help="also time stock with the GDN scan over chunks as the torch loop (ops/gdn/naive.py "
                         "chunk_scan) instead of the Triton kernels: 'stock_torch_scan'")
    ap.add_argument("--fp32_head", action="store_true",
                    help="also time every mode with numerics lm_head=fp32 (the fp32 GEMM of the casts; "
                         "default: tensor_core, ops/linear/head.py): '<mode>_fp32_head'")
    ap.add_argument("--activation_checkpointing", action="store_true",
                    help="also time every mode with each layer recomputed in backward "
                         "(trainer.activation_checkpointing): '<mode>_ac'")
    ap.add_argument("--profile", action="store_true",
                    help="profile one microbatch per mode on the first model -> h200_trainer_profile.txt")


@contextlib.contextmanager
def switches(mode: str):
    """The module switch a row's name turns on while it is built and timed (restored after): '_torch_scan' the
    trainer's GDN scan over chunks as the torch loop (naive.chunk_scan) instead of the Triton scan
    (ops/gdn/autograd.py TRITON_SCAN); so either form is timed in one run."""
    import zeromismatch.ops.gdn.autograd as ag

    with mock.patch.object(ag, "TRITON_SCAN", not mode.endswith("_torch_scan")):
        yield


def step(model, microbatches: list[list[list[int]]]) -> tuple[float, float]:
    """One accumulated forward + backward over the microbatches; (forward ms, backward ms) by CUDA events."""
    from zeromismatch.trainer.scoring import next_token_logprobs

    fwd = bwd = 0.0
    for mb in microbatches:
        e = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        e[0].record()
        loss = -torch.cat(next_token_logprobs(model, mb)).mean()
        e[1].record()
        loss.backward()
        e[2].record()
        torch.cuda.synchronize()
        fwd, bwd = fwd + e[0].elapsed_time(e[1]), bwd + e[1].elapsed_time(e[2])
    return fwd, bwd


def measure(model, seqs, reps: int, flops: float, peak: float) -> dict:
    model.zero_grad(set_to_none=True)
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    step(model, seqs)  # warmup: Triton compiles, autotuning, allocator
    warmup_s = time.perf_counter() - t0
    times = []
    for _ in range(reps):
        model.zero_grad(set_to_none=True)
        times.append(step(model, seqs))
    f, b = statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)
    ms = statistics.median(t[0] + t[1] for t in times)
    tokens = sum(len(s) for mb in seqs for s in mb)
    return {"step_ms": ms, "fwd_ms": f, "bwd_ms": b, "tokens_per_s": tokens / ms * 1e3,
            "mfu": flops / (ms * 1e-3) / (peak * 1e12), "peak_mem_gb": torch.cuda.max_memory_allocated() / 1e9,
            "reps_ms": [t[0] + t[1] for t in times], "warmup_s": warmup_s}


def plot(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = [m for m in res if isinstance(res[m], dict) and "stock" in res[m]]
    fig, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models), 3.6), squeeze=False)
    for ax, m in zip(axes[0], models):
        modes = [k for k in MODES if k in res[m]]
        ax.bar(modes, [res[m][k]["mfu"] * 100 for k in modes], color=["#777", "#1f77b4", "#2ca02c"][: len(modes)])
        for i, k in enumerate(modes):
            ax.text(i, res[m][k]["mfu"] * 100, f"{res[m][k]['step_ms']:.0f} ms", ha="center", va="bottom")
        ax.set_title(f"{m} ({res[m]['params'] / 1e9:.2f}B, {res[m]['tokens']} tokens)")
        ax.set_ylabel("MFU % (fwd + bwd)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    args = parse_args(__doc__, extra_args)
    res = {"setup": {k: getattr(args, k) for k in ("seqs", "seq_len", "microbatch_seqs", "reps", "layers_9b",
                                                    "peak_tflops")}}
    res["setup"]["matmul_tflops_measured"] = measured = matmul_tflops()
    for name in args.models.split(","):
        model = build(name, args.layers_9b).train()
        for p in model.parameters():
            p.requires_grad_(True)
        n = sum(p.numel() for pn, p in model.named_parameters() if "embed_tokens" not in pn)
        g = torch.Generator(device=DEV).manual_seed(0)
        seqs = [torch.randint(0, model.config.vocab_size, (args.seq_len,), device=DEV, generator=g).tolist()
                for _ in range(args.seqs)]
        seqs = [seqs[i : i + args.microbatch_seqs] for i in range(0, len(seqs), args.microbatch_seqs)]
        tokens = args.seqs * (args.seq_len - 1)
        res[name] = {"params": n, "tokens": args.seqs * args.seq_len, "model_tflop": 6 * n * tokens / 1e12}
        modes = args.modes.split(",") + (["stock_torch_scan"] if args.torch_scan else [])
        modes += [f"{m}_fp32_head" for m in args.modes.split(",")] if args.fp32_head else []
        modes += [f"{m}_ac" for m in args.modes.split(",")] if args.activation_checkpointing else []
        for mode in modes:
            base = mode
            for suffix in ("_ac", "_torch_scan", "_fp32_head"):
                base = base.removesuffix(suffix)
            with switches(mode):
                model.set_numerics({"name": base, "lm_head": "fp32"} if mode.endswith("_fp32_head") else base)
                model.activation_checkpointing = mode.endswith("_ac")
                res[name][mode] = measure(model, seqs, args.reps, 6 * n * tokens, args.peak_tflops)
                if args.profile and name == args.models.split(",")[0] and not mode.endswith("_torch_scan"):
                    with open(f"{args.out}/h200_trainer_profile.txt", "a") as f:
                        f.write(kernel_profile(lambda: step(model, [seqs[0]]), mode) + "\n")
            res[name][mode]["mfu_vs_measured"] = res[name][mode]["mfu"] * args.peak_tflops / measured
            if "stock" in res[name]:
                res[name][mode]["vs_stock"] = res[name][mode]["step_ms"] / res[name]["stock"]["step_ms"]
            log(name, mode, {k: round(v, 3) for k, v in res[name][mode].items() if isinstance(v, float)})
            write_json(args, "h200_trainer", res)
        del model
        torch.cuda.empty_cache()
    log("wrote", write_json(args, "h200_trainer", res))
    try:
        plot(res, f"{args.out}/h200_trainer.png")
    except ImportError as e:
        log("no figure:", e)


if __name__ == "__main__":
    main()
