"""`python run.py job=rl ...` (the default job): async off-policy RL.

    task prompts -> RolloutWorker (Engine on the generator's copy of the model, rewards) -> RunAheadBuffer
    -> Trainer (packed varlen forward, policy loss, AdamW) -> weights -> RolloutWorker (hot swap)

Logs every step to JSONL + W&B (offline unless a key is set): the NOTES 4 metrics plus the precision /
staleness split. Checkpoints every `rl.checkpoint_every` steps into the run dir; `job.resume=<checkpoint
.pt>` continues the run (bit for bit with `rl.deterministic=true`).
"""

from __future__ import annotations

import copy
import random
import time
from pathlib import Path

import torch
from tqdm import tqdm

from ..generator import Engine, SamplingParams
from ..logging import MetricsLogger
from ..rl.controller import RolloutWorker, run_async, run_lockstep
from ..rl.disaggregated import make_groups, run_trainer, serve_generator
from ..rl.losses import loss_config
from ..rl.offpolicy import RunAheadBuffer
from ..trainer.trainer import Trainer
from .common import build_task as build_tokenized_task
from .common import get_tokenizer, load_model, torch_dtype


def build_task(cfg, vocab_size: int):
    """(task, tokenizer or None). The toy task needs no tokenizer."""
    name = cfg.task.name
    if not cfg.task.get("implemented", True):
        raise NotImplementedError(f"task {name!r} is configured but not implemented yet (conf/task/{name}.yaml)")
    if name == "toy":
        from ..tasks.toy import ToyTask

        return ToyTask(vocab_size, seed=cfg.seed), None
    tok = get_tokenizer(cfg)
    return build_tokenized_task(cfg, tok), tok


def _uses_sft_warm_start(cfg) -> bool:
    return not cfg.model.get("checkpoint") and cfg.task.name == "math" and cfg.rl.get("sft_warm_start", True)


def initial_model(cfg):
    """The SFT warm start for the math task (cached; built on first use) unless a checkpoint is given, else
    jobs.common.load_model (the checkpoint, or a random init)."""
    if _uses_sft_warm_start(cfg):
        from ..models.qwen3_5.checkpoint import load_checkpoint
        from .sft import ensure_sft_checkpoint

        return load_checkpoint(ensure_sft_checkpoint(cfg), numerics=cfg.numerics.name, device=cfg.device,
                               dtype=torch_dtype(cfg.trainer.dtype))
    return load_model(cfg)


def main(cfg, role: str | None = None) -> dict:
    """role: None = one process (generator thread + trainer, or lockstep); "trainer" / "generator" = one side of
    a disaggregated run (rl.disaggregated=true spawns both, rl/disaggregated.py)."""
    rl, tr, gen = cfg.rl, cfg.trainer, cfg.generator
    if not gen.get("implemented", True) or gen.backend != "embedded":
        raise NotImplementedError(f"generator backend {gen.backend!r} is not implemented yet; use generator=embedded")
    if role is None and rl.get("disaggregated", False):
        return _spawn_disaggregated(cfg)
    groups = make_groups() if role is not None else None
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    model = initial_model(cfg)  # may run the (cached) SFT warm start with all threads
    if not rl.deterministic:
        # generator and trainer threads share the cores: one intra-op thread each (oversubscribed OpenMP
        # spins badly). Numerics do not depend on the thread count (tests/ops), so parity is unaffected.
        torch.set_num_threads(1)
    task, tokenizer = build_task(cfg, model.config.vocab_size)
    stop = tuple(task.stop_token_ids)
    trainer = Trainer(
        model,
        lr=float(tr.lr),
        betas=tuple(tr.betas),
        weight_decay=float(tr.weight_decay),
        grad_clip=tr.get("grad_clip"),
        loss=loss_config(rl.loss, **_loss_overrides(rl)),
        microbatch_tokens=int(tr.microbatch_tokens),
        normalize_adv_std=bool(rl.adv_std_norm),
        staleness_split=bool(rl.get("staleness_split", True)),
        history=int(rl.offpolicy) + 2,
    )
    start, ckpt = 0, None
    if cfg.job.get("resume"):
        ckpt = torch.load(cfg.job.resume, weights_only=False)
        trainer.load_state_dict(ckpt["trainer"])
        start = ckpt["step"]

    gen_model = copy.deepcopy(model).eval()
    for p in gen_model.parameters():
        p.requires_grad_(False)
    max_prompt = int(rl.get("max_prompt_len", 512))
    engine = Engine(
        gen_model,
        max_slots=int(gen.max_slots),
        max_batched_tokens=int(gen.max_batched_tokens),
        max_model_len=int(gen.max_model_len or (max_prompt + int(rl.max_new_tokens))),
        prefix_caching=bool(gen.prefix_caching),
        swap_policy=rl.swap_policy,
    )
    engine.version = trainer.version
    group_filter = _has_spread if rl.get("dynamic_sampling", False) else None
    order = "admission" if rl.deterministic else "completion"
    if ckpt and not rl.deterministic:
        ckpt["buffer"].abandon_in_flight()  # async checkpoints do not hold in-flight rollouts
    buffer = ckpt["buffer"] if ckpt else RunAheadBuffer(int(rl.offpolicy), int(rl.prompts_per_step), initial_version=start,
                                                         group_filter=group_filter, order=order)
    params = SamplingParams(temperature=float(rl.temperature), max_new_tokens=int(rl.max_new_tokens), stop_token_ids=stop)
    worker = RolloutWorker(engine, task, buffer, int(rl.samples_per_prompt), params, seed=int(cfg.seed),
                           swap_policy=rl.swap_policy, prompts_consumed=ckpt["prompts_consumed"] if ckpt else 0)
    if role == "generator":
        serve_generator(worker, trainer_rank=0, groups=groups)
        return {}
    if ckpt:
        torch.set_rng_state(ckpt["torch_rng"])
        random.setstate(ckpt["py_rng"])

    logger = MetricsLogger.from_cfg(cfg)
    ckpt_every = int(rl.get("checkpoint_every", 0) or 0)
    eval_every = int(rl.eval_every or 0)
    bar = tqdm(total=int(rl.steps), initial=start, desc=f"rl {cfg.numerics.name} op{rl.offpolicy}", unit="step")
    history: list[dict] = []

    def on_step(step, batch, waited, gen_stats=None):
        t0 = time.perf_counter()
        m = trainer.train_step(batch)
        train_s = time.perf_counter() - t0
        m["perf/trainer/tokens_per_second_full_step"] = m.get("train_batch/response_tokens", 0.0) / max(waited + train_s, 1e-9)
        m["perf/trainer/wait_seconds"] = waited
        m["perf/generator/tokens_per_second"] = (gen_stats or engine.throughput())["generated_tokens_per_s"]
        m["train/version"] = trainer.version
        if eval_every and ((step + 1) % eval_every == 0 or step + 1 == int(rl.steps)):
            m.update(_evaluate(trainer.model, task, cfg))
        logger.log(m, step=step)
        history.append({"step": step, **m})
        bar.update(1)
        bar.set_postfix(reward=f"{m['rollout_reward/avg_train_reward/mean']:.2f}", diff=f"{m.get('bit_wise/logprob_diff/abs_mean', float('nan')):.1e}")

    def due(step):
        return ckpt_every and ((step + 1) % ckpt_every == 0 or step + 1 == int(rl.steps))

    def after_step(step):
        if due(step):
            with worker.lock:
                save(logger.run_dir / "checkpoint.pt", step + 1, trainer, buffer, worker.prompts_consumed)

    def after_step_disaggregated(step, generator_state):
        if due(step):
            state = generator_state()
            save(logger.run_dir / "checkpoint.pt", step + 1, trainer, state["buffer"], state["prompts_consumed"])

    if eval_every and start == 0:
        logger.log(_evaluate(trainer.model, task, cfg), step=0)
    t_run = time.perf_counter()
    if role == "trainer":
        run_trainer(trainer, start, int(rl.steps), on_step, generator_rank=1, groups=groups,
                    after_step=after_step_disaggregated)
    elif rl.deterministic:
        run_lockstep(worker, trainer, start, int(rl.steps), on_step, after_step)
    else:
        run_async(worker, trainer, start, int(rl.steps), on_step, after_step)
    bar.close()
    summary = _summarize(history, time.perf_counter() - t_run, logger)
    logger.summary(summary)
    logger.close()
    for k, v in summary.items():
        print(f"{k}: {v}")
    return {"history": history, "summary": summary, "run_dir": str(logger.run_dir)}


def _spawn_disaggregated(cfg) -> dict:
    """Two processes on this machine over gloo: rank 0 trains, rank 1 generates. Returns the trainer's result."""
    import os
    import socket
    import tempfile

    import torch.multiprocessing as mp
    from omegaconf import OmegaConf

    if cfg.rl.deterministic:
        raise ValueError("rl.disaggregated=true is asynchronous: set rl.deterministic=false")
    if _uses_sft_warm_start(cfg):  # built once, here, before both processes load it from the cache
        from .sft import ensure_sft_checkpoint

        ensure_sft_checkpoint(cfg)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = os.path.join(tempfile.mkdtemp(prefix="zm_disagg_"), "result.pt")
    mp.spawn(_disaggregated_process, args=(OmegaConf.to_container(cfg, resolve=True), port, out), nprocs=2, join=True)
    return torch.load(out, weights_only=False)


def _disaggregated_process(rank: int, cfg_dict: dict, port: int, out: str) -> None:
    import os

    import torch.distributed as dist
    from omegaconf import OmegaConf

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        res = main(OmegaConf.create(cfg_dict), role="trainer" if rank == 0 else "generator")
        if rank == 0:
            torch.save(res, out)
    finally:
        dist.destroy_process_group()


def save(path: Path, step: int, trainer, buffer, prompts_consumed: int) -> None:
    """Step-boundary checkpoint: model + optimizer + weight history, controller buffer, data position, RNG."""
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "step": step,
            "trainer": trainer.state_dict(),
            "buffer": buffer,
            "prompts_consumed": prompts_consumed,
            "torch_rng": torch.get_rng_state(),
            "py_rng": random.getstate(),
        },
        tmp,
    )
    tmp.replace(path)


def _has_spread(group) -> bool:
    r = group.rewards
    return bool(r.max() > r.min())


def _loss_overrides(rl) -> dict:
    out = {"clip_low": float(rl.clip_low), "clip_high": float(rl.clip_high), "log_ratio_clamp": float(rl.log_ratio_clamp)}
    if rl.loss == "dppo":
        out = {"dppo_delta": float(rl.dppo_delta), "log_ratio_clamp": float(rl.log_ratio_clamp)}
    if rl.get("tis_cap"):
        out["tis_cap"] = float(rl.tis_cap)
    if rl.get("icepop"):
        out["icepop"] = tuple(float(x) for x in rl.icepop)
    return out


def _evaluate(model, task, cfg) -> dict:
    """Greedy accuracy on the task's held-out prompts, logged as validation_reward/_mean."""
    from .eval import evaluate

    r = evaluate(model, task, greedy=True, max_new_tokens=int(cfg.rl.max_new_tokens), cfg_generator=cfg.generator)
    return {"validation_reward/_mean": r["accuracy"], "validation/n": float(r["n"])}


def _summarize(history, seconds, logger) -> dict:
    if not history:
        return {"steps": 0}
    first, last = history[0], history[-1]
    evals = [h["validation_reward/_mean"] for h in history if "validation_reward/_mean" in h]
    out = {
        "steps": len(history),
        "wall_seconds": round(seconds, 1),
        "step0_logprob_abs_mean": first.get("bit_wise/logprob_diff/abs_mean"),
        "train_reward_start": first["rollout_reward/avg_train_reward/mean"],
        "train_reward_end": last["rollout_reward/avg_train_reward/mean"],
        "policy_age_max": max(h.get("train_batch/policy_age_max", 0) for h in history),
        "heldout_accuracy_end": evals[-1] if evals else None,
        "metrics_jsonl": str(logger.jsonl_path),
        "run_dir": str(logger.run_dir),
    }
    return {k: v for k, v in out.items() if v is not None}
