"""Randomized parity draws: model configs and workloads from a seeded RNG, for the parity sweeps on the CPU
(tests/parity/test_sweep.py) and on the GPU (tests/gpu/test_gpu_sweep.py, benchmarks/parity.py). A draw is a
model config (hidden size, layer count and pattern, GDN key / value heads and head dims, attention heads / kv
heads / head dim, dense or MoE with its expert widths and top-k, vocab, tied embeddings) and a workload (prompt
lengths around the 64-token block boundaries, prompts sharing a prefix, staggered arrivals and arrival order,
slot count, token budget, prefix caching on or off, a weight swap under `recompute`, torch threads of generator
and trainer: the last two are CPU knobs)."""

from __future__ import annotations

import dataclasses
import random

from ..generator import SamplingParams
from ..models.qwen3_5 import Qwen35Config, build_model
from .check import ParityCheck, check_parity, random_prompts

BOUNDARY_LENGTHS = (1, 2, 63, 64, 65, 127, 128, 129)  # block (and GDN chunk) size 64
MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size")


def draw_config(rng: random.Random) -> Qwen35Config:
    n_layers = rng.randint(1, 4)
    layer_types = [rng.choice(["linear_attention", "full_attention"]) for _ in range(n_layers)]
    key_heads, kv_heads = rng.choice([1, 2, 3]), rng.choice([1, 2])
    head_dim = rng.choice([16, 32, 48, 64, 96, 128])
    cfg = dict(
        vocab_size=rng.choice([97, 256, 512, 1000, 2048]),
        hidden_size=rng.choice([32, 48, 64, 96, 128, 160, 256, 384]),
        num_hidden_layers=n_layers,
        layer_types=layer_types,
        linear_num_key_heads=key_heads,
        linear_num_value_heads=key_heads * rng.choice([1, 2]),
        linear_key_head_dim=rng.choice([16, 32, 48, 64, 96]),
        linear_value_head_dim=rng.choice([16, 32, 48, 64, 96]),
        linear_conv_kernel_dim=rng.choice([2, 3, 4]),
        num_key_value_heads=kv_heads,
        num_attention_heads=kv_heads * rng.choice([1, 2, 3]),
        head_dim=head_dim,
        partial_rotary_factor=rng.choice([0.25, 0.5, 1.0]),
        rope_theta=rng.choice([1e4, 1e6]),
        tie_word_embeddings=rng.random() < 0.25,
    )
    if rng.random() < 0.4:
        experts = rng.choice([2, 4, 8])
        cfg.update(
            num_experts=experts,
            num_experts_per_tok=rng.randint(1, min(4, experts)),
            moe_intermediate_size=rng.choice([32, 64, 96, 160]),
            shared_expert_intermediate_size=rng.choice([32, 64, 160]),
        )
    else:
        cfg.update(intermediate_size=rng.choice([64, 96, 160, 192, 256, 1024]))
    return Qwen35Config(**cfg)


def draw_workload(rng: random.Random, vocab: int) -> dict:
    n = rng.randint(3, 8)
    seed = rng.randrange(1 << 30)
    lengths = [rng.choice(BOUNDARY_LENGTHS) if rng.random() < 0.6 else rng.randint(3, 200) for _ in range(n)]
    prompts = [random_prompts(1, vocab, seed + i, min_len=m, max_len=m)[0] for i, m in enumerate(lengths)]
    if rng.random() < 0.5:  # some prompts extend one shared prefix
        shared = random_prompts(1, vocab, seed - 1, min_len=rng.choice([64, 128, 129, 140]), max_len=140)[0]
        for i in rng.sample(range(n), rng.randint(2, n)):
            prompts[i] = shared[: rng.choice([len(shared), 64, 128])] + prompts[i][: rng.choice([0, 1, 5, 63, 64])]
    order = list(range(n))
    rng.shuffle(order)
    return dict(
        prompts=prompts,
        params=[SamplingParams(max_new_tokens=rng.randint(1, 12), seed=seed + i) for i in range(n)],
        max_slots=rng.choice([1, 2, 3, 5, 8]),
        max_batched_tokens=rng.choice([64, 96, 128, 200, 2048]),
        order=order,
        arrivals=sorted(rng.randint(0, 12) for _ in range(n)) if rng.random() < 0.5 else None,
        prefix_caching=rng.random() < 0.8,
        swap_step=rng.randint(1, 10) if rng.random() < 0.3 else None,
        gen_threads=rng.choice([1, 2]),
        score_threads=rng.choice([1, 2]),
    )



def check_draw(cfg: Qwen35Config, work: dict, mode: str, device="cpu", dtype=None) -> ParityCheck:
    """check_parity for one draw in one numerics mode: the draw's model (seed 1) on ``device`` / ``dtype``, its
    prompts, params and engine settings (the workload's weight swap and thread counts are not applied)."""
    model = build_model(cfg, mode, seed=1).to(device=device, dtype=dtype).eval()
    schedule = {k: work[k] for k in ("max_slots", "max_batched_tokens", "order", "arrivals", "prefix_caching")}
    return check_parity(model, work["prompts"], work["params"], **schedule)


def draw(index: int, seed: int = 0) -> tuple[Qwen35Config, dict]:
    """(config, workload) of draw `index` of the sweep seeded `seed`: the same stream on every machine."""
    rng = random.Random(f"{seed}-{index}")
    cfg = draw_config(rng)
    return cfg, draw_workload(rng, cfg.vocab_size)


def describe(cfg: Qwen35Config, work: dict) -> str:
    unused = {"eos_token_id", "pad_token_id", "rms_norm_eps"}
    unused |= {"intermediate_size"} if cfg.is_moe else set(MOE_FIELDS)
    keys = [f.name for f in dataclasses.fields(cfg) if f.name not in unused]
    model = ", ".join(f"{k}={getattr(cfg, k)}" for k in keys)
    load = {k: v for k, v in work.items() if k not in ("prompts", "params", "order")}
    return f"config({model}) workload(prompt lengths {[len(p) for p in work['prompts']]}, {load})"
