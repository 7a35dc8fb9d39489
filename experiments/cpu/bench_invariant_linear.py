"""Cost of the CPU batch-invariant GEMM (ops/linear/cpu.py) against one padded GEMM (rows padded to a
multiple of 32, one MKL call: not row-count invariant at every shape) and plain F.linear, at every linear
shape of the presets, for a trainer-size row count and decode row counts, with 1 and 2 torch threads.

    PYTHONPATH=src python experiments/cpu/bench_invariant_linear.py --out results/bench/cpu_invariant_linear.json

Times are the minimum over repeats (the machine is shared: the minimum is the least disturbed run); "per
forward" sums a shape's time over its uses in one forward of the model (experts at their expected routed
row count M * top_k / num_experts). --end-to-end adds, per preset, the CPU seconds (process time, 1 thread:
robust to other jobs on the other core) of a `bi` trainer forward+backward over 8 x 128 tokens and of
generating 32 x 32 tokens, with the model's linear being the invariant GEMM or the padded GEMM.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from zeromismatch.generator import Engine, SamplingParams
from zeromismatch.parity import random_prompts
from zeromismatch.models.qwen3_5 import build_model, get_preset
from zeromismatch.ops.linear import cpu
from zeromismatch.ops.logprob import token_logprobs

PADDED_ROWS = 32


def padded_gemm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    m = x.shape[0]
    pad = (-m) % PADDED_ROWS
    return (F.pad(x, (0, 0, 0, pad)) @ w.t())[:m] if pad else x @ w.t()


VARIANTS = {"invariant_rows": cpu.linear, "padded_gemm": padded_gemm, "F.linear": F.linear}


def linear_shapes(preset: str) -> list[tuple[str, int, int, float]]:
    """(name, N, K, uses per forward at row fraction 1 or top_k / num_experts) for every linear of a preset."""
    c = get_preset(preset)
    n_gdn = c.layer_types.count("linear_attention")
    n_attn = c.layer_types.count("full_attention")
    kd, vd = c.linear_num_key_heads * c.linear_key_head_dim, c.linear_num_value_heads * c.linear_value_head_dim
    h = c.hidden_size
    out = [
        ("gdn.in_proj_qkv", 2 * kd + vd, h, n_gdn),
        ("gdn.in_proj_z", vd, h, n_gdn),
        ("gdn.in_proj_a/b", c.linear_num_value_heads, h, 2 * n_gdn),
        ("gdn.out_proj", h, vd, n_gdn),
        ("attn.q_proj", 2 * c.num_attention_heads * c.head_dim, h, n_attn),
        ("attn.k/v_proj", c.num_key_value_heads * c.head_dim, h, 2 * n_attn),
        ("attn.o_proj", h, c.num_attention_heads * c.head_dim, n_attn),
        ("lm_head", c.vocab_size, h, 1),
    ]
    layers = c.num_hidden_layers
    if c.is_moe:
        frac = c.num_experts_per_tok / c.num_experts
        out += [
            ("moe.router", c.num_experts, h, layers),
            ("moe.expert.gate_up", 2 * c.moe_intermediate_size, h, layers * c.num_experts * frac),
            ("moe.expert.down", h, c.moe_intermediate_size, layers * c.num_experts * frac),
            ("moe.shared.gate/up", c.shared_expert_intermediate_size, h, 2 * layers),
            ("moe.shared.down", h, c.shared_expert_intermediate_size, layers),
            ("moe.shared_gate", 1, h, layers),
        ]
    else:
        out += [("mlp.gate/up", c.intermediate_size, h, 2 * layers), ("mlp.down", h, c.intermediate_size, layers)]
    return out


def min_seconds(fn, budget_s: float, min_reps: int = 3) -> float:
    fn()
    best, reps, end = float("inf"), 0, time.perf_counter() + budget_s
    while reps < min_reps or time.perf_counter() < end:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        reps += 1
    return best


def bench(presets, row_counts, threads, budget_s) -> dict:
    out = {}
    for preset in presets:
        c = get_preset(preset)
        frac = c.num_experts_per_tok / c.num_experts if c.is_moe else 1.0
        rows = {}
        for th in threads:
            torch.set_num_threads(th)
            for m in row_counts:
                total = dict.fromkeys(VARIANTS, 0.0)
                shapes = {}
                for name, n, k, uses in linear_shapes(preset):
                    mm = max(1, round(m * frac)) if name.startswith("moe.expert") else m
                    g = torch.Generator().manual_seed(n * 31 + k)
                    w, x = torch.randn(n, k, generator=g), torch.randn(mm, k, generator=g)
                    t = {v: min_seconds(lambda f=f: f(x, w), budget_s) for v, f in VARIANTS.items()}
                    shapes[f"{name} [{n}x{k}] M={mm}"] = {v: round(s * 1e6, 1) for v, s in t.items()}
                    for v in VARIANTS:
                        total[v] += t[v] * (uses / frac if name.startswith("moe.expert") else uses)
                key = f"threads={th} M={m}"
                rows[key] = {
                    "per_forward_ms": {v: round(s * 1e3, 3) for v, s in total.items()},
                    "invariant_vs_padded": round(total["invariant_blocked"] / total["padded_gemm"], 2),
                    "invariant_vs_F.linear": round(total["invariant_blocked"] / total["F.linear"], 2),
                    "per_shape_us": shapes,
                }
                print(f"{preset:<12} {key:<18} " + "  ".join(f"{v} {s * 1e3:8.2f} ms" for v, s in total.items()), flush=True)
        out[preset] = rows
    return out


def end_to_end(presets, repeats: int = 3) -> dict:
    """CPU seconds (best of `repeats`) of a bi trainer step and a generation, per linear variant."""
    torch.set_num_threads(1)
    out = {}
    for preset in presets:
        model = build_model(preset, "bi", seed=0)
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, model.config.vocab_size, (1024,), generator=g)
        prompts = random_prompts(32, model.config.vocab_size, 0, min_len=16, max_len=96)

        def train_step():
            model.zero_grad(set_to_none=True)
            (-token_logprobs(model(ids, list(range(0, 1025, 128)))[:-1], ids[1:]).mean()).backward()

        def generate():
            Engine(model, max_slots=32, max_batched_tokens=4096).generate(prompts, SamplingParams(max_new_tokens=32))

        rows = {}
        invariant = cpu.linear
        for name, fn in (("invariant_blocked", invariant), ("padded_gemm", padded_gemm)):
            cpu.linear = fn  # the CPU linear of the bi / bi_chunk modes (ops/linear dispatches to cpu.linear)
            rows[name] = {"trainer_fwd_bwd_cpu_s": round(min_cpu_seconds(train_step, repeats), 3),
                          "generate_32x32_cpu_s": round(min_cpu_seconds(generate, max(1, repeats - 1)), 3)}
        cpu.linear = invariant
        out[preset] = rows
        print(preset, rows, flush=True)
    return out


def min_cpu_seconds(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--presets", default="tiny,tiny_moe,qwen3_5_mid")
    p.add_argument("--rows", default="1,8,32,64,1024", help="row counts M: decode 1..64, trainer 1024")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--budget", type=float, default=0.3, help="seconds of repeats per measurement")
    p.add_argument("--end-to-end", default="", help="presets for the trainer / generator measurement, e.g. tiny")
    p.add_argument("--out")
    a = p.parse_args()
    default_threads = torch.get_num_threads()
    res = bench(a.presets.split(","), [int(m) for m in a.rows.split(",")], [int(t) for t in a.threads.split(",")], a.budget)
    e2e = end_to_end(a.end_to_end.split(",")) if a.end_to_end else None
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), "?")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    record = {
        "command": "PYTHONPATH=src python " + " ".join(sys.argv),
        "commit": commit,
        "machine": f"{platform.machine()} {model}, {os.cpu_count()} cores, {default_threads} default torch threads",
        "load_average_1_5_15_min_at_end": os.getloadavg(),
        "torch": torch.__version__,
        "invariant_form": "one [1, K] x [K, N] problem per row (torch.bmm), K padded to 64 bytes",
        "sequential_gemm": cpu.SEQUENTIAL_GEMM,
        "timing": "minimum over repeats, microseconds per call; per_forward sums uses in one forward",
        "note": "the machine is shared: with 2 threads, a threaded GEMM (padded_gemm, F.linear) stalls whenever "
        "another job holds the second core (rows far above their 1-thread time); the invariant GEMM runs each "
        "row's problem on one thread and is not exposed to that",
        "results": res,
    }
    if e2e:
        record["end_to_end_1_thread"] = e2e
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
