"""The SFT training loop: mean NLL of the solution tokens, AdamW, warm-up then cosine decay."""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .data import SFTBatches
from .settings import SFTSettings


def lr_factor(step: int, progress: float, s: SFTSettings) -> float:
    """Linear warm-up over warmup_steps, then cosine from 1 to min_lr_ratio over progress in [0, 1]."""
    if s.warmup_steps and step < s.warmup_steps:
        return (step + 1) / s.warmup_steps
    p = min(max(progress, 0.0), 1.0)
    return s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p))


def train_sft(
    model,
    batches: SFTBatches,
    s: SFTSettings,
    log_fn: Callable[[dict, int], None] | None = None,
    eval_fn: Callable[[Any], dict] | None = None,
) -> dict:
    """Train ``model`` in place until s.steps or s.time_budget_s (training seconds: time spent in
    ``eval_fn(model)``, called every s.eval_every steps, does not count). Progress for the lr schedule is
    max(step / steps, seconds / time_budget_s), so the schedule completes whichever budget ends the run.
    Returns stats."""
    device = next(model.parameters()).device
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, betas=tuple(s.betas), eps=s.eps, weight_decay=s.weight_decay)
    max_norm = s.grad_clip if s.grad_clip else math.inf
    losses, tokens, step = [], 0, 0
    stopped_by = "steps"
    bar = tqdm(total=s.steps, desc="sft", unit="step", disable=not s.progress, dynamic_ncols=True, mininterval=1.0)
    t0 = time.perf_counter()
    while step < s.steps:
        elapsed = time.perf_counter() - t0
        if s.time_budget_s and elapsed >= s.time_budget_s:
            stopped_by = "time"
            break
        progress = max(step / s.steps, elapsed / s.time_budget_s if s.time_budget_s else 0.0)
        lr = s.lr * lr_factor(step, progress, s)
        for group in opt.param_groups:
            group["lr"] = lr
        ids, cu, rows, targets, n = batches.next_batch()
        ids, rows, targets = ids.to(device), rows.to(device), targets.to(device)
        logits = model(ids, cu, logits_rows=rows)
        loss = F.cross_entropy(logits, targets, reduction="sum") / n
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        loss_v = loss.item()
        if not math.isfinite(loss_v):
            raise RuntimeError(f"SFT: non-finite loss {loss_v} at step {step}")
        losses.append(loss_v)
        tokens += ids.numel()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss_v:.3f}", lr=f"{lr:.2e}", refresh=False)
        metrics = {"sft/loss": loss_v, "sft/lr": lr, "sft/grad_norm": float(grad_norm)}
        if eval_fn is not None and s.eval_every and step % s.eval_every == 0 and step < s.steps:
            t_eval = time.perf_counter()
            res = eval_fn(model)
            t0 += time.perf_counter() - t_eval  # the clock stops during evals
            metrics["sft/heldout_accuracy"] = res["accuracy"]
            bar.write(f"sft step {step}: held-out greedy accuracy {res['accuracy']:.3f}")
        if log_fn is not None:
            log_fn(metrics, step)
    bar.close()
    seconds = time.perf_counter() - t0
    tail = losses[-10:] or [float("nan")]
    return {
        "steps": step,
        "stopped_by": stopped_by,
        "train_seconds": round(seconds, 2),
        "examples": step * s.batch_size,
        "tokens": tokens,
        "tokens_per_second": round(tokens / seconds, 1) if seconds > 0 else None,
        "loss_first": losses[0] if losses else None,
        "loss_last10": sum(tail) / len(tail),
        "loss_curve": [round(x, 4) for x in losses[:: max(1, len(losses) // 50)]],
    }
