"""The model a run starts from: cfg.model.checkpoint, else a random init of cfg.model.preset; for RL on
math, search and the agent task, the cached SFT warm start (sft/) unless a checkpoint is given.

    model = load_model(cfg)          # eval / smoke / parity: the checkpoint or a random init
    model = initial_model(cfg)       # RL: the SFT warm start where it applies, else load_model(cfg)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .config import cfg_get, model_overrides, numerics_spec
from .models.qwen3_5 import build_model, load_checkpoint
from .sft import ensure_sft_checkpoint
from .tasks.registry import SFT_TASKS


__all__ = ["initial_model", "load_model", "torch_dtype", "uses_sft_warm_start"]


def torch_dtype(name: str | None) -> torch.dtype | None:
    """A dtype named in a config ("float32", "bfloat16")."""
    return None if name is None else getattr(torch, str(name))


def _placement(cfg: Any, numerics, device, dtype) -> dict:
    """numerics / device / dtype arguments, defaulting to the run's (numerics_spec, cfg.device,
    cfg.trainer.dtype)."""
    return {
        "numerics": numerics or numerics_spec(cfg),
        "device": torch.device(device or cfg_get(cfg, "device", "cpu")),
        "dtype": dtype if dtype is not None else torch_dtype(cfg_get(cfg_get(cfg, "trainer"), "dtype", "float32")),
    }


def load_model(cfg: Any, checkpoint: str | Path | None = None, numerics=None, device=None, dtype=None,
               seed: int | None = None):
    """``checkpoint`` (default cfg.model.checkpoint) loaded, else a random init of cfg.model.preset +
    overrides from ``seed`` (default cfg.seed). Numerics default ``numerics_spec(cfg)``, device cfg.device,
    dtype cfg.trainer.dtype."""
    kw = _placement(cfg, numerics, device, dtype)
    checkpoint = checkpoint or cfg_get(cfg_get(cfg, "model"), "checkpoint")
    if checkpoint:
        if model_overrides(cfg):
            raise ValueError("model.overrides only apply to a random init; a checkpoint's config.json is used as is")
        return load_checkpoint(checkpoint, **kw)
    preset = cfg_get(cfg_get(cfg, "model"), "preset")
    seed = int(cfg_get(cfg, "seed", 0)) if seed is None else int(seed)
    return build_model(preset, kw["numerics"], seed=seed, device=kw["device"], dtype=kw["dtype"], **model_overrides(cfg))


def uses_sft_warm_start(cfg: Any) -> bool:
    """RL on a task with demonstrations (math, search, agent) from a random-init preset starts from the SFT checkpoint
    (rl.sft_warm_start)."""
    return not cfg.model.get("checkpoint") and cfg.task.name in SFT_TASKS and cfg.rl.get("sft_warm_start", True)


def initial_model(cfg: Any):
    """The RL policy's starting weights: the SFT warm start (cached; trained on first use) where
    ``uses_sft_warm_start``, else ``load_model(cfg)``."""
    if uses_sft_warm_start(cfg):  # trained with cfg.model.overrides: its config.json already holds them
        return load_checkpoint(ensure_sft_checkpoint(cfg), **_placement(cfg, None, None, None))
    return load_model(cfg)
