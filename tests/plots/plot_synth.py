"""Synthetic run dirs in the layout MetricsLogger writes (config.json + metrics.jsonl). Test data only."""

from __future__ import annotations

import json
import math
from pathlib import Path

ARMS = {  # numerics, generator backend
    "bi": ("bi", "embedded"),
    "stock": ("stock", "embedded"),
    "vllm_native": ("stock", "vllm_native"),
}


def config(numerics: str, offpolicy: int, *, backend: str = "embedded", preset: str = "tiny", task: str = "math",
           job: str = "rl", run_name: str | None = None) -> dict:
    return {
        "job": {"name": job},
        "model": {"preset": preset},
        "numerics": {"name": numerics},
        "task": {"name": task, "source": "offline"},
        "rl": {"offpolicy": offpolicy},
        "generator": {"backend": backend},
        "run_name": run_name or f"{task}_op{offpolicy}_{numerics}",
        "seed": 0,
    }


def rows(arm: str, offpolicy: int, steps: int = 6, *, seed: int = 0, split: bool = True, eval_every: int = 2) -> list[dict]:
    """Per-step metrics shaped like jobs/rl.py's: bi has an exactly-zero mismatch at step 0 and a zero precision part."""
    out = []
    base = {"bi": 0.3, "stock": 0.25, "vllm_native": 0.2}[arm]
    tps = {"bi": 4000.0, "stock": 12000.0, "vllm_native": 11000.0}[arm]
    for s in range(steps):
        stale = 0.0 if s == 0 else 0.001 * offpolicy * (1 + 0.1 * math.sin(s + seed))
        precision = {"bi": 0.0, "stock": 0.004, "vllm_native": 0.009}[arm] * (1 + 0.05 * s)
        row = {
            "step": s,
            "_time": 1000.0 + s,
            "rollout_reward/avg_train_reward/mean": base + 0.05 * s + 0.01 * seed,
            "bit_wise/logprob_diff/abs_mean": precision + stale,
            "bit_wise/logprob_diff/mean": 0.0,
            "bit_wise/logprob_diff/max": 10 * (precision + stale),
            "bit_wise/ratio_tokens_different/mean": 0.0 if precision + stale == 0 else 0.9,
            "train_batch/policy_age": min(s, offpolicy),
            "train_batch/policy_age_max": min(s, offpolicy),
            "perf/trainer/tokens_per_second_full_step": tps * (1 + 0.01 * s),
            "perf/trainer/tokens_per_second_fwd_bwd": 2 * tps * (1 + 0.01 * s),
        }
        if split:
            row["bit_wise/logprob_diff/precision_abs_mean"] = precision
            row["bit_wise/logprob_diff/staleness_abs_mean"] = stale
        out.append(row)
        if eval_every and s % eval_every == 0:
            out.append({"step": s, "_time": 1000.5 + s, "validation_reward/_mean": base + 0.02 * s, "validation/n": 30.0})
    return out


def write_run(root: Path, arm: str, offpolicy: int, *, steps: int = 6, seed: int = 0, name: str | None = None,
              job: str = "rl", **kw) -> Path:
    numerics, backend = ARMS[arm]
    d = Path(root) / (name or f"2026-01-01_00-00-0{seed}_math_op{offpolicy}_{arm}")
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config(numerics, offpolicy, backend=backend, job=job), indent=2))
    with open(d / "metrics.jsonl", "w") as fh:
        for r in rows(arm, offpolicy, steps, seed=seed, **kw):
            fh.write(json.dumps(r) + "\n")
    return d


def write_matrix(root: Path, arms=("bi", "stock", "vllm_native"), offpolicies=(4, 12), seeds=(0,)) -> list[Path]:
    return [write_run(root, a, op, seed=s) for op in offpolicies for a in arms for s in seeds]
