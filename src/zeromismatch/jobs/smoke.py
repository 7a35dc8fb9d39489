"""Smoke job: real AdamW steps of cfg.model under cfg.numerics on one fixed batch of random tokens.

    python run.py job=smoke model=tiny numerics=bi job.steps=3

Checks that the model builds, runs forward and backward in the chosen numerics mode and learns (the loss on
the fixed batch falls), and measures trainer tokens/s. Knobs: cfg.job.{steps, batch_size, seq_len, lr};
optimizer betas / eps / weight decay / grad clip / dtype from cfg.trainer. The model is a random init of
cfg.model.preset (+ cfg.model.overrides), or the local checkpoint dir cfg.model.checkpoint when set.
"""

from __future__ import annotations

import math
import time

import torch

from ..logging import MetricsLogger
from ..model_init import load_model
from ..ops.logprob import token_logprobs


def main(cfg) -> dict:
    job, tr = cfg.job, cfg.trainer
    device = torch.device(cfg.device)
    model = load_model(cfg)
    model.train()
    n_params = model.num_parameters()
    opt = torch.optim.AdamW(
        model.parameters(), lr=job.lr, betas=tuple(tr.betas), eps=tr.eps, weight_decay=tr.weight_decay
    )
    gen = torch.Generator().manual_seed(cfg.seed)
    tokens = torch.randint(0, model.config.vocab_size, (job.batch_size, job.seq_len + 1), generator=gen).to(device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:].reshape(-1)
    n_tokens = inputs.numel()
    max_norm = float(tr.grad_clip) if tr.get("grad_clip") else math.inf

    what = cfg.model.get("checkpoint") or cfg.model.preset
    print(
        f"smoke: model {what}, numerics {cfg.numerics.name}, {tr.dtype} on {device}: {n_params:,} parameters; "
        f"batch {job.batch_size} x {job.seq_len} random tokens, AdamW lr {job.lr}",
        flush=True,
    )
    losses, tps = [], []
    with MetricsLogger.from_cfg(cfg) as log:
        for step in range(job.steps):
            t0 = time.perf_counter()
            logits = model(inputs)
            loss = -token_logprobs(logits, targets).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            opt.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            losses.append(loss.item())
            tps.append(n_tokens / dt)
            if not math.isfinite(losses[-1]):
                raise RuntimeError(f"smoke: non-finite loss {losses[-1]} at step {step}")
            print(
                f"step {step + 1}/{job.steps}  loss {losses[-1]:.4f}  grad_norm {grad_norm.item():.3f}  "
                f"tokens/s {tps[-1]:,.0f}",
                flush=True,
            )
            log.log(
                {
                    "train/loss": losses[-1],
                    "train/grad_norm": grad_norm,
                    "perf/trainer/tokens_per_second_fwd_bwd": tps[-1],
                    "perf/trainer/step_seconds": dt,
                },
                step=step,
            )
        result = {
            "parameters": n_params,
            "losses": losses,
            "tokens_per_second": tps,
            "tokens_per_second_median": sorted(tps)[len(tps) // 2],
            "loss_decreased": len(losses) > 1 and losses[-1] < losses[0],
            "run_dir": str(log.run_dir),
        }
        log.summary({k: v for k, v in result.items() if not isinstance(v, list)})
        wandb_state = f"W&B {log.wandb_mode} run in {log.run_dir / 'wandb'}" if log.wandb_run else "no W&B run"
    print(f"smoke: metrics in {log.jsonl_path}; {wandb_state}", flush=True)
    return result
