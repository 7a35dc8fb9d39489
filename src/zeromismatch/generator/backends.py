"""The generator engine a config asks for (cfg.generator.backend): the embedded Engine, or vLLM running our
model (`vllm`) or its own Qwen3.5 implementation (`vllm_native`). All three answer the Engine's interface."""

from __future__ import annotations

from typing import Any

from .engine import Engine

BACKENDS = ("embedded", "vllm", "vllm_native")


def _get(cfg: Any, key: str, default):
    if cfg is None:
        return default
    value = cfg.get(key, default) if hasattr(cfg, "get") else getattr(cfg, key, default)
    return default if value is None else value


def build_engine(model, cfg_generator: Any, *, max_model_len: int, max_slots: int | None = None,
                 swap_policy: str = "keep", seed: int = 0, window_rollouts: int | None = None,
                 cuda_graphs: bool | None = None):
    """An engine over ``model``'s weights with cfg.generator's knobs (``max_slots`` caps cfg's slots).
    generator.max_slots 'window': a slot for every rollout the run-ahead window admits (``window_rollouts``,
    (offpolicy + 1) x prompts x samples), so that every admitted group decodes at once, as vLLM does."""
    backend = str(_get(cfg_generator, "backend", "embedded"))
    slots = _get(cfg_generator, "max_slots", 64)
    if slots == "window":
        slots = window_rollouts or max_slots
        if not slots:
            raise ValueError("generator.max_slots=window: only an RL run's engine has a window; set a number")
    slots = int(slots)
    slots = max(1, min(slots, max_slots)) if max_slots else slots
    batched = int(_get(cfg_generator, "max_batched_tokens", 2048))
    if backend == "embedded":
        return Engine(model, max_slots=slots, max_batched_tokens=batched, max_model_len=max_model_len,
                      prefix_caching=bool(_get(cfg_generator, "prefix_caching", True)), swap_policy=swap_policy,
                      cuda_graphs=cuda_graphs, piece_interval=int(_get(cfg_generator, "piece_interval", 1)))
    if backend in ("vllm", "vllm_native"):
        from .vllm_engine.engine import VLLMEngine

        return VLLMEngine(model, max_slots=slots, max_batched_tokens=batched, max_model_len=max_model_len,
                          swap_policy=swap_policy, seed=seed, native=backend == "vllm_native")
    raise ValueError(f"generator.backend={backend!r}: expected one of {', '.join(BACKENDS)}")
