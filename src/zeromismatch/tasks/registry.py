"""The RL task a run's config names (cfg.task.name), built over the run's tokenizer.

    task = build_task(cfg)                                  # math / search / agent: over get_tokenizer(cfg)
    task = build_task(cfg, vocab_size=model.config.vocab_size)   # toy, toy_multiturn: random tokens of that vocabulary
    tok = get_tokenizer(cfg)                                # the run's tokenizer (the task's tiny BPE on tiny presets)
    prepare_task_data(cfg)                                  # the task's offline data (SFT file included), written once
"""

from __future__ import annotations

from typing import Any

from ..config import cfg_get, file_sha256
from .agent.task import AgentTask, ensure_agent_data, get_agent_tokenizer
from .base import Task
from .math.task import MathTask, ensure_offline_math, model_vocab_size
from .math.task import get_tokenizer as math_tokenizer
from .search.task import SearchTask, ensure_offline_search
from .search.task import get_tokenizer as search_tokenizer
from .toy import ToyTask
from .toy_multiturn import ToyMultiTurnTask

TOKENIZERS = {"math": math_tokenizer, "search": search_tokenizer, "agent": get_agent_tokenizer,
              "toy": math_tokenizer}  # toy: random ids, any will do
SFT_TASKS = ("math", "search", "agent")  # tasks with SFT demonstrations (Task.sft_example) for a warm start


def get_tokenizer(cfg: Any):
    """The tokenizer of cfg.task.name's task (model.tokenizer / the checkpoint's / the task's tiny BPE)."""
    name = cfg_get(cfg_get(cfg, "task"), "name")
    if name not in TOKENIZERS:
        raise NotImplementedError(f"task {name!r} has no tokenizer (tasks: {', '.join(TOKENIZERS)})")
    return TOKENIZERS[name](cfg)


def sft_render_key(cfg: Any) -> dict:
    """What, besides the SFT file and the tokenizer, decides the tokens of the task's SFT examples: empty for math
    (the file holds the whole user message); for search the format, the instruction, the tool-output cap and the
    corpus the demonstrations' passages come from."""
    task_cfg = cfg_get(cfg, "task")
    if cfg_get(task_cfg, "name") != "search":
        return {}
    corpus = ensure_offline_search(task_cfg)["corpus"] if cfg_get(task_cfg, "source", "offline") == "offline" else None
    corpus = corpus or cfg_get(cfg_get(task_cfg, "files"), "corpus")
    return {
        "format": cfg_get(task_cfg, "format"), "prompt_template": cfg_get(task_cfg, "prompt_template"),
        "max_tool_tokens": cfg_get(task_cfg, "max_tool_tokens"), "corpus_sha256": file_sha256(corpus) if corpus else None,
    }  # fmt: skip


def prepare_task_data(cfg: Any) -> None:
    """Write the task's offline data (train / held-out / SFT files) when the config uses it and it is missing."""
    task_cfg = cfg_get(cfg, "task")
    name = cfg_get(task_cfg, "name")
    if name == "math" and cfg_get(task_cfg, "offline"):
        ensure_offline_math(task_cfg)
    if name == "search" and cfg_get(task_cfg, "source", "offline") == "offline":
        ensure_offline_search(task_cfg)
    if name == "agent" and cfg_get(task_cfg, "source", "offline") == "offline":
        ensure_agent_data(task_cfg)


def build_task(cfg: Any, tokenizer=None, *, seed: int | None = None, vocab_size: int | None = None) -> Task:
    """cfg.task.name's Task. math: over ``tokenizer`` (default ``get_tokenizer(cfg)``); toy: over
    ``vocab_size`` token ids (default the model's vocabulary from cfg.model). The prompt order comes from
    ``seed`` (default cfg.seed). Tasks configured as not implemented (conf/task/*.yaml) raise."""
    task_cfg = cfg_get(cfg, "task")
    name = cfg_get(task_cfg, "name")
    if not cfg_get(task_cfg, "implemented", True):
        raise NotImplementedError(f"task {name!r} is configured but not implemented yet (conf/task/{name}.yaml)")
    seed = int(cfg_get(cfg, "seed", 0)) if seed is None else int(seed)
    task = _build(name, cfg, task_cfg, tokenizer, seed, vocab_size)
    task.configure_episodes(task_cfg)  # max_turns, max_tokens_per_turn, max_context_tokens, env_workers
    return task


def _build(name: str, cfg: Any, task_cfg: Any, tokenizer, seed: int, vocab_size: int | None) -> Task:
    if name == "toy":
        return ToyTask(int(vocab_size or model_vocab_size(cfg)), seed=seed)
    if name == "toy_multiturn":
        return ToyMultiTurnTask(int(vocab_size or model_vocab_size(cfg)), seed=seed,
                                tool_error_turn=cfg_get(task_cfg, "tool_error_turn", None))
    if name == "math":
        return MathTask(task_cfg, tokenizer if tokenizer is not None else get_tokenizer(cfg), seed=seed)
    if name == "search":
        return SearchTask(task_cfg, tokenizer if tokenizer is not None else get_tokenizer(cfg), seed=seed)
    if name == "agent":
        return AgentTask(task_cfg, tokenizer if tokenizer is not None else get_tokenizer(cfg), seed=seed)
    raise NotImplementedError(f"task {name!r} has no Task implementation (tasks: math, search, agent, toy, toy_multiturn)")
