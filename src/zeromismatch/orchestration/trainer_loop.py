"""The trainer side of an RL run: one train step per batch, metrics to the logger, greedy held-out
accuracy every rl.eval_every steps, checkpoints every rl.checkpoint_every steps, a summary at the end.
The schedules (controller.py, ray_run.py) call ``on_step``; what happens at a step does not depend on
which schedule delivered the batch.

Besides the metrics, each step appends to <run_dir>/batches.jsonl which groups it trained on (prompt ids, ages
at consumption): the record that shows no group is lost or trained twice across a kill and a resume."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch
from tqdm import tqdm

from ..evaluation import VALIDATION_METRIC, evaluate
from ..logging import MetricsLogger
from .checkpoint import CHECKPOINT_NAME, save_rl_checkpoint

log = logging.getLogger(__name__)
BATCHES_NAME = "batches.jsonl"


def validation(model, task, cfg) -> dict:
    """Greedy accuracy on the task's held-out prompts, logged as validation_reward/_mean."""
    r = evaluate(model, task, greedy=True, max_new_tokens=int(cfg.rl.max_new_tokens), cfg_generator=cfg.generator)
    return {VALIDATION_METRIC: r["accuracy"], "validation/n": float(r["n"])}


def gpu_memory(model) -> dict:
    """This process's CUDA memory (GiB) on the trainer's device: the allocator's peak so far and what it holds
    now (reserved); the generator's engine is in the same process unless it runs on Ray. {} off CUDA."""
    dev = next(model.parameters()).device
    if dev.type != "cuda":
        return {}
    gib = float(1 << 30)
    return {"perf/gpu/max_allocated_gib": torch.cuda.max_memory_allocated(dev) / gib,
            "perf/gpu/reserved_gib": torch.cuda.memory_reserved(dev) / gib}


class TrainerLoop:
    """Per-step bookkeeping around ``trainer.train_step``. ``generator_stats()`` gives the generator's
    throughput when the schedule does not send it with the batch (one process: the engine is at hand)."""

    def __init__(self, cfg, trainer, task, start: int, generator_stats=None):
        self.cfg, self.trainer, self.task, self.start = cfg, trainer, task, start
        self.steps = int(cfg.rl.steps)
        self.generator_stats = generator_stats
        self.eval_every = int(cfg.rl.eval_every or 0)
        self.ckpt_every = int(cfg.rl.get("checkpoint_every", 0) or 0)
        self.logger = MetricsLogger.from_cfg(cfg, resume_step=start if cfg.job.get("resume") else None)
        self._batches = open(self.logger.run_dir / BATCHES_NAME, "a", encoding="utf-8")
        self.bar = tqdm(total=self.steps, initial=start, desc=f"rl {cfg.numerics.name} op{cfg.rl.offpolicy}", unit="step")
        self.history: list[dict] = []
        self._t_run = time.perf_counter()

    @property
    def checkpoint_path(self) -> Path:
        return self.logger.run_dir / CHECKPOINT_NAME

    def log_initial_validation(self) -> None:
        """The step-0 point of the held-out curve (fresh runs only)."""
        if self.eval_every and self.start == 0:
            self.logger.log(validation(self.trainer.model, self.task, self.cfg), step=0)
        self._t_run = time.perf_counter()

    def on_step(self, step: int, batch, waited: float, gen_stats: dict | None = None) -> None:
        t0 = time.perf_counter()
        m = self.trainer.train_step(batch)
        train_s = time.perf_counter() - t0
        m["perf/trainer/tokens_per_second_full_step"] = m.get("train_batch/response_tokens", 0.0) / max(waited + train_s, 1e-9)
        m["perf/trainer/wait_seconds"] = waited
        m["perf/generator/tokens_per_second"] = (gen_stats or self.generator_stats())["generated_tokens_per_s"]
        m["train/version"] = self.trainer.version
        m.update(gpu_memory(self.trainer.model))
        if self.eval_every and ((step + 1) % self.eval_every == 0 or step + 1 == self.steps):
            m.update(validation(self.trainer.model, self.task, self.cfg))
        self.logger.log(m, step=step)
        ages = [step - g.min_admission_version for g in batch.groups]
        self._batches.write(json.dumps({"step": step, "prompt_ids": [g.prompt_id for g in batch.groups], "ages": ages}) + "\n")
        self._batches.flush()
        self.history.append({"step": step, **m})
        self.bar.update(1)
        self.bar.set_postfix(reward=f"{m['rollout_reward/avg_train_reward/mean']:.2f}",
                             diff=f"{m.get('bit_wise/logprob_diff/abs_mean', float('nan')):.1e}")

    def checkpoint_due(self, step: int) -> bool:
        return bool(self.ckpt_every) and ((step + 1) % self.ckpt_every == 0 or step + 1 == self.steps)

    def save(self, step: int, generator_state: dict) -> None:
        """Checkpoint after ``step`` (steps done: step + 1); ``generator_state``: RolloutWorker.state()."""
        save_rl_checkpoint(self.checkpoint_path, step + 1, self.trainer, generator_state)
        log.info("checkpoint after step %d: %s (%d groups in flight)", step, self.checkpoint_path,
                 len(generator_state["in_flight"]))

    def abort(self) -> None:
        """A failed run: end the progress bar's line (the error is printed after it), close the batch record."""
        self.bar.close()
        self._batches.close()

    def finish(self) -> dict:
        """Close the logger, print the summary; the job's result."""
        self.bar.close()
        summary = summarize(self.history, time.perf_counter() - self._t_run, self.logger)
        self.logger.summary(summary)
        self.logger.close()
        self._batches.close()
        for k, v in summary.items():
            log.info("%s: %s", k, v)
        return {"history": self.history, "summary": summary, "run_dir": str(self.logger.run_dir)}


def summarize(history: list[dict], seconds: float, logger: MetricsLogger) -> dict:
    if not history:
        return {"steps": 0}
    first, last = history[0], history[-1]
    evals = [h[VALIDATION_METRIC] for h in history if VALIDATION_METRIC in h]
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
