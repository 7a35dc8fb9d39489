"""Evaluate a model on a task's held-out set with the generator engine.

    python run.py job=eval model=tiny                          # the SFT checkpoint of this config (cached)
    python run.py job=eval model.checkpoint=<dir> job.temperature=0

``evaluate(model, task)`` is what the RL job calls every rl.eval_every steps and logs as
``validation_reward/_mean`` (greedy by default: temperature 0). ``main`` evaluates cfg.model.checkpoint,
or, without one, the SFT checkpoint of this config (``jobs.sft.ensure_sft_checkpoint``: loaded from the
cache, trained first on a miss), with cfg.job's temperature / samples_per_prompt / max_new_tokens.
"""

from __future__ import annotations

import time
from typing import Any

METRIC = "validation_reward/_mean"


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
    from zeromismatch.generator import SamplingParams
    from zeromismatch.jobs.common import make_engine

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


def main(cfg) -> dict:
    from zeromismatch.jobs.common import build_task, get_tokenizer, has_tokenizer, load_model
    from zeromismatch.logging import MetricsLogger
    from zeromismatch.tasks.tokenizer import load_tokenizer

    job = cfg.job
    checkpoint = cfg.model.get("checkpoint")
    if not checkpoint:
        from zeromismatch.jobs.sft import ensure_sft_checkpoint

        checkpoint = str(ensure_sft_checkpoint(cfg))
    tokenizer = load_tokenizer(checkpoint) if has_tokenizer(checkpoint) and not cfg.model.get("tokenizer") else get_tokenizer(cfg)
    model = load_model(cfg, checkpoint=checkpoint)
    temperature = float(job.get("temperature", 0.0))
    greedy = temperature == 0.0
    with build_task(cfg, tokenizer) as task:
        res = evaluate(
            model,
            task,
            n=job.get("n"),
            greedy=greedy,
            max_new_tokens=int(job.max_new_tokens),
            temperature=temperature,
            samples_per_prompt=int(job.get("samples_per_prompt", 1)),
            seed=int(cfg.seed),
            split=str(job.get("split", "eval")),
            cfg_generator=cfg.get("generator"),
        )
    mode = "greedy" if greedy else f"temperature {temperature}, {res['samples'] // max(res['n'], 1)} sample(s)/prompt"
    print(
        f"eval: accuracy {res['accuracy']:.3f} on {res['n']} {job.get('split', 'eval')} prompts ({mode}); "
        f"mean length {res['mean_len']:.1f} tokens; checkpoint {checkpoint}; numerics {cfg.numerics.name}",
        flush=True,
    )
    with MetricsLogger.from_cfg(cfg) as log:
        log.log({METRIC: res["accuracy"], "eval/mean_len": res["mean_len"], "eval/truncated": res["truncated"]}, step=0)
        log.summary({METRIC: res["accuracy"], "eval/n": res["n"]})
        run_dir = str(log.run_dir)
    return {**res, "checkpoint": str(checkpoint), "run_dir": run_dir}
