"""Data-parallel (FSDP2) trainer steps on a fixed synthetic batch, with an optional single-process check.

    torchrun --nproc_per_node=2 -m zeromismatch.trainer.fsdp_check --steps 2 --check
    torchrun --nproc_per_node=2 -m zeromismatch.trainer.fsdp_check --grad-clip 1e-3 --check     # clipping active

Every rank builds the same model (same seed), wraps it with FSDP2 (trainer.distributed.apply_fsdp) and runs
Trainer.train_step on the same full batches; the trainer shards the samples. With --check, rank 0 then
replays the steps on an unwrapped copy in one process and compares loss, every logged metric and the full
weights bitwise (docs/distributed.md says what is exact and what is a tolerance).

This is a torchrun entry point for the trainer side only: rollouts come from `synthetic_batches` (the
model's own logprobs plus noise as generator logprobs), not from the generator. It is not a Hydra job.
Also importable: the CPU test (tests/distributed/test_fsdp_cpu.py) spawns `spawn_worker`, which must be
importable in a child process.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from ..models.qwen3_5 import build_model
from ..rl.losses import DAPO
from ..rl.offpolicy import Batch
from ..rl.types import Group, Sample, Turn
from .distributed import apply_fsdp, destroy_distributed, init_distributed, reduce_metrics
from .scoring import next_token_logprobs
from .trainer import Trainer

DEFAULTS = dict(
    preset="tiny",
    numerics="bi",
    seed=1,
    steps=2,
    groups=2,
    samples_per_group=2,
    prompt_len=4,
    response_len=12,
    microbatch_tokens=32,  # 4 samples x 16 tokens -> exactly 2 single-process microbatches
    lr=1e-3,
    grad_clip=None,
    exact_grad_norm=True,
    activation_checkpointing=False,
    staleness_split=True,
)


@torch.no_grad()
def synthetic_batches(model, cfg: dict) -> list[Batch]:
    """cfg["steps"] fixed batches. Step s: groups of samples_per_group samples, prompt + response tokens;
    generator logprobs = the initial model's own logprobs + N(0, 0.05) noise (one token unscored: -inf);
    rewards with spread in every group. Tokens of step s > 0 come half from version s - 1, half from s, so the
    staleness split rescores under an older version."""
    g = torch.Generator().manual_seed(cfg["seed"] + 1000)
    vocab = model.config.vocab_size
    p, r = cfg["prompt_len"], cfg["response_len"]
    batches = []
    for step in range(cfg["steps"]):
        seqs = [
            torch.randint(0, vocab, (p + r,), generator=g).tolist()
            for _ in range(cfg["groups"] * cfg["samples_per_group"])
        ]
        lps = next_token_logprobs(model, seqs)
        groups, k = [], 0
        for gi in range(cfg["groups"]):
            samples = []
            for si in range(cfg["samples_per_group"]):
                ids = seqs[k]
                gen = torch.full((p + r,), float("nan"))
                gen[p:] = lps[k][p - 1 :].float() + 0.05 * torch.randn(r, generator=g)
                if k == 1:
                    gen[p + 2] = float("-inf")  # a token the generator could not score: leaves the loss
                old = max(step - 1, 0)
                vers = torch.full((p + r,), -1, dtype=torch.int64)
                vers[p:] = old
                vers[p + r // 2 :] = step
                mask = torch.zeros(p + r, dtype=torch.int64)
                mask[p:] = 1
                reward = float((si + gi) % 2) + 0.25 * si
                samples.append(Sample(ids[:p], ids, mask, gen, vers, reward, [Turn(ids[p:], old)]))
                k += 1
            groups.append(Group(f"p{step}_{gi}", samples))
        batches.append(Batch(step=step, groups=groups, stats={}))
    return batches


def make_trainer(model, cfg: dict) -> Trainer:
    return Trainer(
        model,
        lr=cfg["lr"],
        weight_decay=0.01,
        grad_clip=cfg["grad_clip"],
        loss=DAPO,
        microbatch_tokens=cfg["microbatch_tokens"],
        staleness_split=cfg["staleness_split"],
        history=4,
        exact_grad_norm=cfg["exact_grad_norm"],
    )


def _strip(m: dict) -> dict:
    return {k: v for k, v in m.items() if not k.startswith("perf/")}


def run_single(cfg: dict) -> dict:
    """The single-process reference: metrics per step and the final weights."""
    cfg = {**DEFAULTS, **cfg}
    model = build_model(cfg["preset"], cfg["numerics"], seed=cfg["seed"])
    model.activation_checkpointing = cfg["activation_checkpointing"]
    batches = synthetic_batches(model, cfg)
    trainer = make_trainer(model, cfg)
    metrics = [_strip(trainer.train_step(b)) for b in batches]
    return {"metrics": metrics, "weights": trainer.weights()}


def run_fsdp(cfg: dict) -> dict:
    """Inside an initialized process group: the same steps with an FSDP2-wrapped model. Every rank returns the
    metrics it logged and the gathered full weights."""
    cfg = {**DEFAULTS, **cfg}
    model = build_model(cfg["preset"], cfg["numerics"], seed=cfg["seed"])
    batches = synthetic_batches(model, cfg)  # before wrapping: identical on every rank, no collectives
    model.activation_checkpointing = cfg["activation_checkpointing"]
    apply_fsdp(model)
    trainer = make_trainer(model, cfg)
    metrics = [_strip(trainer.train_step(b)) for b in batches]
    return {"metrics": metrics, "weights": trainer.weights()}


def compare(ref: dict, got: dict) -> list[str]:
    """Differences between two run results ([] = bitwise equal metrics and weights)."""
    bad = []
    for s, (a, b) in enumerate(zip(ref["metrics"], got["metrics"], strict=True)):
        if a.keys() != b.keys():
            bad.append(f"step {s}: metric keys differ: {sorted(a.keys() ^ b.keys())}")
        for k in sorted(a.keys() & b.keys()):
            if a[k] != b[k] and not (a[k] != a[k] and b[k] != b[k]):
                bad.append(f"step {s}: {k} {a[k]!r} != {b[k]!r}")
    for k, v in ref["weights"].items():
        w = got["weights"][k]
        if not torch.equal(v, w):
            bad.append(f"weight {k}: max abs diff {float((v - w).abs().max()):.3e}")
    return bad


def spawn_worker(rank: int, world: int, port: int, configs: list[dict], out_dir: str) -> None:
    """torch.multiprocessing.spawn target: torchrun-like env, then run_fsdp for each config; results saved to
    out_dir/rank{rank}.pt. One thread per rank (2-core CPU machines; the reference runs with one thread too)."""
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    info = init_distributed("gloo", timeout_s=120)
    try:
        results = [run_fsdp(c) for c in configs]
        # reduce_metrics on the last step's metrics: every rank logged the same values, so SUM gives world x
        m = {k: v for k, v in results[0]["metrics"][-1].items() if k.startswith("bit_wise/logprob_diff/")}
        extra = {"reduced": reduce_metrics(m), "local": m}
        torch.save({"results": results, "extra": extra, "world": info.world_size}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        destroy_distributed()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default=DEFAULTS["preset"])
    ap.add_argument("--numerics", default=DEFAULTS["numerics"])
    ap.add_argument("--steps", type=int, default=DEFAULTS["steps"])
    ap.add_argument("--microbatch-tokens", type=int, default=DEFAULTS["microbatch_tokens"])
    ap.add_argument("--grad-clip", type=float, default=None)
    ap.add_argument("--fast-grad-norm", action="store_true", help="DTensor norm reduction (not bitwise)")
    ap.add_argument("--activation-checkpointing", action="store_true", help="recompute each layer in backward")
    ap.add_argument("--check", action="store_true",
                    help="rank 0 compares with a single-process replay (without activation checkpointing)")
    a = ap.parse_args(argv)
    cfg = {
        "preset": a.preset, "numerics": a.numerics, "steps": a.steps, "microbatch_tokens": a.microbatch_tokens,
        "grad_clip": a.grad_clip, "exact_grad_norm": not a.fast_grad_norm,
        "activation_checkpointing": a.activation_checkpointing,
    }
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    info = init_distributed()
    t0 = time.perf_counter()
    got = run_fsdp(cfg) if info.world_size > 1 else run_single(cfg)
    rc = 0
    if info.is_main:
        for s, m in enumerate(got["metrics"]):
            print(f"step {s}: loss {m['train/loss']!r} abs_mean {m['bit_wise/logprob_diff/abs_mean']!r}")
        print(f"world {info.world_size}: {time.perf_counter() - t0:.1f} s")
        if a.check:
            bad = compare(run_single({**cfg, "activation_checkpointing": False}), got)
            print("CHECK:", "bitwise equal" if not bad else "\n  ".join(["DIFFERENT"] + bad))
            rc = 1 if bad else 0
    destroy_distributed()
    return rc


if __name__ == "__main__":
    sys.exit(main())
