"""Accuracy of a model on a task's prompts: each sample an episode (generator/episodes.py: the task's turns and
limits, as in RL rollouts) over the engine, scored by the episode's reward.

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
from .generator.backends import build_engine
from .generator.episodes import EpisodeLimits, EpisodeRunner

VALIDATION_METRIC = "validation_reward/_mean"

__all__ = ["VALIDATION_METRIC", "evaluate", "make_engine"]


def make_engine(model, prompts: list[list[int]], max_new_tokens: int, cfg_generator: Any = None,
                max_context_tokens: int | None = None) -> Engine:
    """An Engine for ``prompts``: max_model_len = longest prompt + max_new_tokens, or ``max_context_tokens`` if
    larger (unless cfg.generator.max_model_len is set), one slot per prompt (all decode at once), other knobs
    from cfg.generator."""
    longest = max((len(p) for p in prompts), default=1)
    default_len = max(longest + max_new_tokens, max_context_tokens or 0)
    max_model_len = int(cfg_get(cfg_generator, "max_model_len", None) or default_len)
    # eager: an evaluation runs beside the rollout engine's thread, where a graph capture must not
    # (ModelRunner.capture_all says why)
    return build_engine(model, cfg_generator, max_model_len=max_model_len, max_slots=len(prompts), cuda_graphs=False)


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
    """Run the first ``n`` (default all) prompts of ``task.eval_prompts()`` (``split="train"``: the first ``n``
    of ``task.train_prompts()``) as episodes and score them with their reward (single-turn: ``task.reward``).

    Greedy (temperature 0) unless ``greedy=False``, then ``temperature`` with per-request seeds
    ``seed + request index`` and ``samples_per_prompt`` samples each. ``max_new_tokens``: tokens per model turn
    (the task's max_tokens_per_turn overrides it). Returns ``accuracy`` (mean reward over all samples), ``n``
    (prompts), ``samples``, ``mean_len`` (generated tokens of all turns, stop tokens included), ``truncated``
    (fraction whose last turn hit its token cap), ``episodes_truncated`` (fraction cut by the turn limit or the
    context cap, scored 0), ``turns_mean`` and ``seconds``.
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
        return {"accuracy": 0.0, "n": 0, "samples": 0, "mean_len": 0.0, "truncated": 0.0, "episodes_truncated": 0.0,
                "turns_mean": 0.0, "seconds": 0.0}
    k = 1 if greedy else int(samples_per_prompt)
    requests = [(it, j) for it in items for j in range(k)]
    per_turn = int(task.max_tokens_per_turn or max_new_tokens)
    stop = tuple(task.stop_token_ids)
    params = [
        SamplingParams(temperature=0.0 if greedy else float(temperature), max_new_tokens=per_turn, stop_token_ids=stop,
                       seed=int(seed) + i)
        for i in range(len(requests))
    ]
    t0 = time.perf_counter()
    was_training = model.training
    model.eval()
    engine = make_engine(model, [it.prompt_ids for it, _ in requests], per_turn, cfg_generator, task.max_context_tokens)
    runner = EpisodeRunner(engine, task, EpisodeLimits(int(task.max_turns), task.max_context_tokens), int(task.env_workers))
    try:
        rids = [runner.start(it, j, p) for (it, j), p in zip(requests, params)]
        done: dict = {}
        while runner.has_work():
            done.update(runner.step())
    finally:
        runner.close()
        model.train(was_training)
    samples = [done[r] for r in rids]
    generated = [[t for turn in s.turns for t in turn.tokens] for s in samples]
    return {
        "accuracy": sum(s.reward for s in samples) / len(samples),
        "n": len(items),
        "samples": len(samples),
        "mean_len": sum(len(g) for g in generated) / len(samples),
        # the engine ends a turn with 'stop' iff its last token is a stop token, else it hit its token cap
        "truncated": sum(s.turns[-1].tokens[-1] not in stop for s in samples) / len(samples),
        "episodes_truncated": sum(s.finish != "done" for s in samples) / len(samples),
        "turns_mean": sum(len(s.turns) for s in samples) / len(samples),
        "seconds": time.perf_counter() - t0,
    }
