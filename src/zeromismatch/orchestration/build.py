"""The pieces of an RL run, from its config: the trainer, and the generator side (engine, run-ahead buffer,
rollout worker). Each role of a run builds only its own pieces."""

from __future__ import annotations

import copy

from ..generator import SamplingParams
from ..generator.backends import build_engine
from ..rl.losses import loss_config
from ..rl.offpolicy import RunAheadBuffer, window_groups
from ..trainer.trainer import Trainer
from ..generator.episodes import EpisodeLimits
from .rollouts import RolloutWorker


def loss_overrides(rl) -> dict:
    """cfg.rl's loss knobs as loss_config overrides."""
    out = {"clip_low": float(rl.clip_low), "clip_high": float(rl.clip_high), "log_ratio_clamp": float(rl.log_ratio_clamp)}
    if rl.loss == "dppo":
        out = {"dppo_delta": float(rl.dppo_delta), "log_ratio_clamp": float(rl.log_ratio_clamp)}
    if rl.get("tis_cap"):
        out["tis_cap"] = float(rl.tis_cap)
    if rl.get("icepop"):
        out["icepop"] = tuple(float(x) for x in rl.icepop)
    return out


def build_trainer(cfg, model) -> Trainer:
    rl, tr = cfg.rl, cfg.trainer
    model.activation_checkpointing = bool(tr.get("activation_checkpointing", False))
    return Trainer(
        model,
        lr=float(tr.lr),
        betas=tuple(tr.betas),
        weight_decay=float(tr.weight_decay),
        grad_clip=tr.get("grad_clip"),
        loss=loss_config(rl.loss, **loss_overrides(rl)),
        microbatch_tokens=int(tr.microbatch_tokens),
        normalize_adv_std=bool(rl.adv_std_norm),
        drop_zero_spread=bool(rl.get("drop_uniform_groups", True)),
        staleness_split=bool(rl.get("staleness_split", True)),
        history=int(rl.offpolicy) + 2,
        logprob_temperature=float(rl.temperature),
    )


def generator_copy(model):
    """The generator's own copy of the trainer's model (one process: the trainer keeps training its own)."""
    gen_model = copy.deepcopy(model)
    return for_generation(gen_model)


def for_generation(model):
    """``model`` in eval mode without gradients: what the engine runs."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _has_spread(group) -> bool:
    r = group.rewards
    return bool(r.max() > r.min())


def episode_settings(cfg, task) -> tuple[EpisodeLimits, int]:
    """(turn and context limits, per-turn token cap) of ``task``'s rollouts: the Task's attributes
    (tasks/base.py), the per-turn cap rl.max_new_tokens unless the task sets max_tokens_per_turn."""
    limits = EpisodeLimits(max_turns=int(task.max_turns), max_context_tokens=task.max_context_tokens)
    return limits, int(task.max_tokens_per_turn or cfg.rl.max_new_tokens)


def build_rollout_engine(cfg, model, task, *, version: int):
    """The engine over ``model`` at weight ``version``, sized for ``task``'s rollouts."""
    rl, gen = cfg.rl, cfg.generator
    limits, per_turn = episode_settings(cfg, task)
    max_prompt = int(rl.get("max_prompt_len", 512))
    window = window_groups(int(rl.offpolicy), int(rl.prompts_per_step)) * int(rl.samples_per_prompt)
    engine = build_engine(model, gen, swap_policy=rl.swap_policy, seed=int(cfg.seed), window_rollouts=window,
                          max_model_len=int(gen.max_model_len or max(max_prompt + per_turn, limits.max_context_tokens or 0)))
    engine.version = version
    engine.capture_graphs()  # before the run's threads start
    return engine


def build_buffer(cfg, *, version: int, resume: dict | None = None) -> RunAheadBuffer:
    """The run-ahead buffer: the checkpoint's when resuming (its slots of the step whose weights the
    generator now runs released), else a fresh one starting at ``version``."""
    rl = cfg.rl
    if resume:
        buffer = resume["buffer"]
        if buffer.generator_version < version:
            # an async checkpoint can precede the generator's taking the step's weights; they are live now
            buffer.release_after_weights_reached_generator(version - 1)
        return buffer
    group_filter = _has_spread if rl.get("dynamic_sampling", False) else None
    order = "admission" if rl.deterministic else "completion"
    return RunAheadBuffer(int(rl.offpolicy), int(rl.prompts_per_step), initial_version=version,
                          group_filter=group_filter, order=order)


def build_worker(cfg, engine: Engine, task, buffer, *, prompts_consumed: int = 0) -> RolloutWorker:
    """The RolloutWorker over ``engine`` feeding ``buffer`` (a RunAheadBuffer, or any object with
    ``complete(ticket, group)`` for a worker whose groups are admitted elsewhere)."""
    rl = cfg.rl
    limits, per_turn = episode_settings(cfg, task)
    # tempered logprobs: the loss's old-policy side is the distribution sampled (the trainer's, at rl.temperature)
    params = SamplingParams(temperature=float(rl.temperature), max_new_tokens=per_turn,
                            stop_token_ids=tuple(task.stop_token_ids), tempered_logprobs=True)
    return RolloutWorker(engine, task, buffer, int(rl.samples_per_prompt), params, seed=int(cfg.seed),
                         swap_policy=rl.swap_policy, prompts_consumed=prompts_consumed,
                         limits=limits, env_workers=int(task.env_workers))


def build_rollout_worker(cfg, model, task, *, version: int, resume: dict | None = None) -> RolloutWorker:
    """Engine over ``model`` (at weight ``version``), the run-ahead buffer (the checkpoint's, when resuming)
    and the worker that feeds it with ``task``'s prompts from the checkpoint's data position, its in-flight
    groups restarted under ``version``."""
    engine = build_rollout_engine(cfg, model, task, version=version)
    buffer = build_buffer(cfg, version=version, resume=resume)
    worker = build_worker(cfg, engine, task, buffer, prompts_consumed=resume["prompts_consumed"] if resume else 0)
    if resume:
        worker.restore_in_flight(resume.get("in_flight", []))
    return worker
