"""The SFT training loop: mean NLL of the solution tokens, AdamW, warm-up then cosine decay over a fixed number
of steps, on a pinned number of threads: what is trained depends on the settings only, never on how long a
step takes."""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .data import SFTBatches
from .settings import SFTSettings


class SFTTimeLimitError(RuntimeError):
    """Training ran past job.time_limit_s (a guard; the steps decide what is trained, so nothing is cached)."""


def lr_factor(step: int, s: SFTSettings) -> float:
    """Linear warm-up over warmup_steps, then cosine from 1 to min_lr_ratio over the remaining steps."""
    if s.warmup_steps and step < s.warmup_steps:
        return (step + 1) / s.warmup_steps
    p = min(step / s.steps, 1.0)
    return s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p))


@contextlib.contextmanager
def pinned_threads(n: int):
    """torch (and its BLAS) on ``n`` intra-op threads for the block, the caller's count afterwards. The CPU
    kernels split reductions by thread count, so the count is part of what the weights are; pinning it keeps
    OMP_NUM_THREADS and the number of cores out of the result."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def train_sft(
    model,
    batches: SFTBatches,
    s: SFTSettings,
    log_fn: Callable[[dict, int], None] | None = None,
    eval_fn: Callable[[Any], dict] | None = None,
) -> dict:
    """Train ``model`` in place for s.steps steps on s.threads threads (``eval_fn(model)`` every s.eval_every
    steps). s.time_limit_s, when set, is a guard on training seconds (evals excluded): passing it raises
    SFTTimeLimitError, since a shortened run is not the model these settings mean. Returns stats."""
    with pinned_threads(s.threads):
        return _train(model, batches, s, log_fn, eval_fn)


def _train(model, batches: SFTBatches, s: SFTSettings, log_fn, eval_fn) -> dict:
    device = next(model.parameters()).device
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, betas=tuple(s.betas), eps=s.eps, weight_decay=s.weight_decay)
    max_norm = s.grad_clip if s.grad_clip else math.inf
    losses, tokens, step = [], 0, 0
    bar = tqdm(total=s.steps, desc="sft", unit="step", disable=not s.progress, dynamic_ncols=True, mininterval=1.0)
    t0 = time.perf_counter()
    while step < s.steps:
        elapsed = time.perf_counter() - t0
        if s.time_limit_s and elapsed >= s.time_limit_s:
            bar.close()
            raise SFTTimeLimitError(
                f"SFT passed job.time_limit_s={s.time_limit_s:g} after {step}/{s.steps} steps ({elapsed:.0f} s) and "
                "cached nothing: raise job.time_limit_s or set it to null (the steps alone decide what is trained)"
            )
        lr = s.lr * lr_factor(step, s)
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
        "threads": torch.get_num_threads(),
        "train_seconds": round(seconds, 2),
        "examples": step * s.batch_size,
        "tokens": tokens,
        "tokens_per_second": round(tokens / seconds, 1) if seconds > 0 else None,
        "loss_first": losses[0] if losses else None,
        "loss_last10": sum(tail) / len(tail),
        "loss_curve": [round(x, 4) for x in losses[:: max(1, len(losses) // 50)]],
    }
