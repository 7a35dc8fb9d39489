"""Accuracy of a model on a task's prompts, generated with the engine and scored by the task's reward.

    res = evaluate(model, task)                       # greedy on the held-out set: res["accuracy"]
    res = evaluate(model, task, n=64, greedy=False, split="train")   # sampled train reward

The RL job logs ``evaluate(...)["accuracy"]`` as VALIDATION_METRIC every rl.eval_every steps; the SFT warm
start measures its train reward and held-out accuracy with it; `job=eval` runs it on a checkpoint.
"""

from __future__ import annotations

import time
from typing import Any

from .config import cfg_get
from .generator import Engine, SamplingParams

VALIDATION_METRIC = "validation_reward/_mean"

__all__ = ["VALIDATION_METRIC", "evaluate", "make_engine"]


def make_engine(model, prompts: list[list[int]], max_new_tokens: int, cfg_generator: Any = None) -> Engine:
    """An Engine for ``prompts``: max_model_len = longest prompt + max_new_tokens (unless
    cfg.generator.max_model_len is set), slots min(max_slots, #prompts), other knobs from cfg.generator."""
    longest = max((len(p) for p in prompts), default=1)
    max_model_len = int(cfg_get(cfg_generator, "max_model_len", longest + max_new_tokens))
    return Engine(
        model,
        max_slots=max(1, min(int(cfg_get(cfg_generator, "max_slots", 64)), len(prompts))),
        max_batched_tokens=int(cfg_get(cfg_generator, "max_batched_tokens", 2048)),
        max_model_len=max_model_len,
        prefix_caching=bool(cfg_get(cfg_generator, "prefix_caching", True)),
    )


def evaluate(
    model,
    task,
    n: int | None = None,
    greedy: bool = True,
    max_new_tokens: int = 128,
    *,
    temperature: float = 1.0,
    samples_per_prompt: int = 1,
    seed: int = 0,
    split: str = "eval",
    cfg_generator: Any = None,
) -> dict:
    """Generate for the first ``n`` (default all) prompts of ``task.eval_prompts()`` (``split="train"``:
    the first ``n`` of ``task.train_prompts()``) and score them with ``task.reward``.

    Greedy (temperature 0) unless ``greedy=False``, then ``temperature`` with per-request seeds
    ``seed + request index`` and ``samples_per_prompt`` samples each. Returns ``accuracy`` (mean reward
    over all samples), ``n`` (prompts), ``samples``, ``mean_len`` (generated tokens, stop token included),
    ``truncated`` (fraction that hit max_new_tokens) and ``seconds``.
    """
    if split == "eval":
        items = task.eval_prompts()
        items = items if n is None else items[: int(n)]
    elif split == "train":
        if n is None:
            raise ValueError("split='train' needs n: the train iterator is infinite")
        it = task.train_prompts()
        items = [next(it) for _ in range(int(n))]
    else:
        raise ValueError(f"split must be 'eval' or 'train', got {split!r}")
    if not items:
        return {"accuracy": 0.0, "n": 0, "samples": 0, "mean_len": 0.0, "truncated": 0.0, "seconds": 0.0}
    k = 1 if greedy else int(samples_per_prompt)
    prompts = [it.prompt_ids for it in items for _ in range(k)]
    golds = [it.gold for it in items for _ in range(k)]
    params = [
        SamplingParams(
            temperature=0.0 if greedy else float(temperature),
            max_new_tokens=int(max_new_tokens),
            stop_token_ids=tuple(task.stop_token_ids),
            seed=int(seed) + i,
        )
        for i in range(len(prompts))
    ]
    t0 = time.perf_counter()
    was_training = model.training
    model.eval()
    try:
        outputs = make_engine(model, prompts, int(max_new_tokens), cfg_generator).generate(prompts, params)
    finally:
        model.train(was_training)
    rewards = [task.reward(o.tokens, g) for o, g in zip(outputs, golds)]
    return {
        "accuracy": sum(rewards) / len(rewards),
        "n": len(items),
        "samples": len(rewards),
        "mean_len": sum(len(o.tokens) for o in outputs) / len(outputs),
        "truncated": sum(o.finish_reason == "length" for o in outputs) / len(outputs),
        "seconds": time.perf_counter() - t0,
    }
