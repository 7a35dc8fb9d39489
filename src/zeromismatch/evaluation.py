"""Accuracy of a model on a task's prompts, generated with the engine and scored by the task's reward.

    res = evaluate(model, task)                       # greedy on the held-out set: res["accuracy"]
    res = evaluate(model, task, n=64, greedy=False, split="train")   # sampled train reward

The RL job logs ``evaluate(...)["accuracy"]`` as VALIDATION_METRIC every rl.eval_every steps; the SFT warm
start measures its train reward and held-out accuracy with it; `job=eval` runs it on a checkpoint.

Multi-turn tasks (``task.max_turns > 1``) run each prompt as an episode (tasks/base.Episode): after each model
turn the episode answers tokens to append (a tool's output) and generation continues on the kept cache, up to
task.max_turns turns of at most task.max_tokens_per_turn tokens, ``max_new_tokens`` generated tokens in all and
the engine's context; an episode stopped by a cap is scored as it stands (no answer: 0).
"""

from __future__ import annotations

import time
from dataclasses import replace
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


def tool_allowance(task) -> int:
    """Context a multi-turn task's tool output may add to a rollout: (max_turns - 1) x task.max_tool_tokens."""
    return max(int(getattr(task, "max_turns", 1)) - 1, 0) * int(getattr(task, "max_tool_tokens", 0))


def run_episodes(engine: Engine, task, items: list, k: int, params: list[SamplingParams]) -> tuple[list, list[float]]:
    """``k`` episodes per item on ``engine`` (params[i]: request i's sampling, its max_new_tokens the episode's
    generated-token budget): model turn, ``episode.step``, tool tokens appended with ``continue_request``, until
    done or a cap. Returns the last GenerationOutput and the reward of each episode, in request order."""
    budget = [int(p.max_new_tokens) for p in params]
    per_turn = int(getattr(task, "max_tokens_per_turn", max(budget)))
    episodes, turns, outputs = {}, {}, {}
    for i, sp in enumerate(params):
        first = replace(sp, keep_cache=True, max_new_tokens=min(per_turn, budget[i]))
        rid = engine.add_request(items[i // k].prompt_ids, first)
        episodes[rid] = (i, task.start_episode(items[i // k], i % k))
        turns[rid] = 0
    try:
        while engine.has_work():
            for out in engine.step():
                i, ep = episodes[out.request_id]
                turns[out.request_id] += 1
                done_tokens = len(out.tokens)
                turn = out.tokens[done_tokens - len(out.logprob_tensor):]
                result = ep.step(turn, out.finish_reason)
                left = budget[i] - done_tokens
                fits = len(out.all_tokens) + len(result.append_ids) + min(per_turn, max(left, 1)) <= engine.max_model_len
                if result.done or turns[out.request_id] >= task.max_turns or left < 1 or not fits:
                    engine.release(out.request_id)
                    outputs[i] = out
                    continue
                engine.continue_request(out.request_id, list(result.append_ids),
                                        replace(params[i], keep_cache=True, max_new_tokens=min(per_turn, left)))  # fmt: skip
        rewards = [0.0] * len(params)
        for i, ep in episodes.values():
            rewards[i] = float(ep.reward())
    finally:
        for _, ep in episodes.values():
            ep.close()
    return [outputs[i] for i in range(len(params))], rewards


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
        engine = make_engine(model, prompts, int(max_new_tokens) + tool_allowance(task), cfg_generator)
        if int(getattr(task, "max_turns", 1)) > 1:
            outputs, rewards = run_episodes(engine, task, items, k, params)
        else:
            outputs = engine.generate(prompts, params)
            rewards = [task.reward(o.tokens, g) for o, g in zip(outputs, golds)]
    finally:
        model.train(was_training)
    return {
        "accuracy": sum(rewards) / len(rewards),
        "n": len(items),
        "samples": len(rewards),
        "mean_len": sum(len(o.tokens) for o in outputs) / len(outputs),
        "truncated": sum(o.finish_reason == "length" for o in outputs) / len(outputs),
        "seconds": time.perf_counter() - t0,
    }
