"""The RL task a run's config names (cfg.task.name), built over the run's tokenizer.

    task = build_task(cfg)                                  # math: MathTask over get_tokenizer(cfg)
    task = build_task(cfg, vocab_size=model.config.vocab_size)   # toy: random tokens of that vocabulary
    task = build_task(cfg)                                  # agent: AgentTask over get_agent_tokenizer(cfg)
"""

from __future__ import annotations

from typing import Any

from ..config import cfg_get
from .agent.task import AgentTask, get_agent_tokenizer
from .base import Task
from .math.task import MathTask, get_tokenizer, model_vocab_size
from .toy import ToyTask


def build_task(cfg: Any, tokenizer=None, *, seed: int | None = None, vocab_size: int | None = None) -> Task:
    """cfg.task.name's Task. math: over ``tokenizer`` (default ``get_tokenizer(cfg)``); toy: over
    ``vocab_size`` token ids (default the model's vocabulary from cfg.model). The prompt order comes from
    ``seed`` (default cfg.seed). Tasks configured as not implemented (conf/task/*.yaml) raise."""
    task_cfg = cfg_get(cfg, "task")
    name = cfg_get(task_cfg, "name")
    if not cfg_get(task_cfg, "implemented", True):
        raise NotImplementedError(f"task {name!r} is configured but not implemented yet (conf/task/{name}.yaml)")
    seed = int(cfg_get(cfg, "seed", 0)) if seed is None else int(seed)
    if name == "toy":
        return ToyTask(int(vocab_size or model_vocab_size(cfg)), seed=seed)
    if name == "math":
        return MathTask(task_cfg, tokenizer if tokenizer is not None else get_tokenizer(cfg), seed=seed)
    if name == "agent":
        return AgentTask(task_cfg, tokenizer if tokenizer is not None else get_agent_tokenizer(cfg), seed=seed)
    raise NotImplementedError(f"task {name!r} has no Task implementation (tasks: math, toy, agent)")
