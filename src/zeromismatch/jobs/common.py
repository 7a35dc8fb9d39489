"""Helpers shared by jobs: resolve the tokenizer, the task and the model from a run.py config, hash configs
for caches, and build a generator engine sized for a set of prompts.

    tok = get_tokenizer(cfg)                       # model.tokenizer / the checkpoint's / cached tiny BPE
    task = build_task(cfg, tok)                    # cfg.task.name -> Task (math)
    model = load_model(cfg)                        # model.checkpoint, else random init of the preset
    engine = make_engine(model, [p.prompt_ids for p in items], max_new_tokens, cfg.generator)
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from zeromismatch.tasks.base import Task
from zeromismatch.tasks.math.task import _get, _plain, get_tokenizer, has_tokenizer, tokenizer_fingerprint

REPO_ROOT = Path(__file__).resolve().parents[3]
CONF_DIR = REPO_ROOT / "conf"

__all__ = [
    "CONF_DIR",
    "build_task",
    "config_hash",
    "file_sha256",
    "get_tokenizer",
    "has_tokenizer",
    "load_model",
    "make_engine",
    "model_overrides",
    "plain",
    "tokenizer_fingerprint",
    "torch_dtype",
]

plain = _plain


def config_hash(obj: Any, n: int = 16) -> str:
    """First ``n`` hex digits of sha256 over canonical JSON (sorted keys) of ``obj``."""
    text = json.dumps(_plain(obj), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def model_overrides(cfg: Any) -> dict:
    """cfg.model.overrides as a plain dict ({} when unset)."""
    return dict(_plain(_get(_get(cfg, "model"), "overrides", {})) or {})


def torch_dtype(name: str | None):
    import torch

    return None if name is None else getattr(torch, str(name))


def build_task(cfg: Any, tokenizer=None, seed: int | None = None) -> Task:
    """The RL task cfg.task names, over ``tokenizer`` (default ``get_tokenizer(cfg)``); prompt order from
    ``seed`` (default cfg.seed)."""
    name = _get(_get(cfg, "task"), "name")
    tokenizer = tokenizer if tokenizer is not None else get_tokenizer(cfg)
    seed = int(_get(cfg, "seed", 0)) if seed is None else int(seed)
    if name == "math":
        from zeromismatch.tasks.math.task import MathTask

        return MathTask(cfg.task, tokenizer, seed=seed)
    raise NotImplementedError(f"task {name!r} has no Task implementation yet (only 'math')")


def load_model(cfg: Any, checkpoint: str | Path | None = None, numerics: str | None = None, device=None, dtype=None):
    """``checkpoint`` (default cfg.model.checkpoint) loaded, else a random init of cfg.model.preset +
    overrides from cfg.seed. Numerics default cfg.numerics.name, device cfg.device, dtype cfg.trainer.dtype."""
    import torch

    from zeromismatch.models.qwen3_5 import build_model, load_checkpoint

    numerics = numerics or _get(_get(cfg, "numerics"), "name", "stock")
    device = torch.device(device or _get(cfg, "device", "cpu"))
    dtype = dtype if dtype is not None else torch_dtype(_get(_get(cfg, "trainer"), "dtype", "float32"))
    checkpoint = checkpoint or _get(_get(cfg, "model"), "checkpoint")
    if checkpoint:
        if model_overrides(cfg):
            raise ValueError("model.overrides only apply to a random init; a checkpoint's config.json is used as is")
        return load_checkpoint(checkpoint, numerics=numerics, device=device, dtype=dtype)
    preset = _get(_get(cfg, "model"), "preset")
    return build_model(preset, numerics, seed=int(_get(cfg, "seed", 0)), device=device, dtype=dtype, **model_overrides(cfg))


def make_engine(model, prompts: list[list[int]], max_new_tokens: int, cfg_generator: Any = None):
    """An Engine for ``prompts``: max_model_len = longest prompt + max_new_tokens (unless
    cfg.generator.max_model_len is set), slots min(max_slots, #prompts), other knobs from cfg.generator."""
    from zeromismatch.generator import Engine

    longest = max((len(p) for p in prompts), default=1)
    max_model_len = int(_get(cfg_generator, "max_model_len", longest + max_new_tokens))
    return Engine(
        model,
        max_slots=max(1, min(int(_get(cfg_generator, "max_slots", 64)), len(prompts))),
        max_batched_tokens=int(_get(cfg_generator, "max_batched_tokens", 2048)),
        max_model_len=max_model_len,
        prefix_caching=bool(_get(cfg_generator, "prefix_caching", True)),
    )
