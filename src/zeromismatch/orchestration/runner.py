"""One RL run from its config: prompts -> generator (RolloutWorker) -> rollouts (RunAheadBuffer) -> trainer
-> weights -> generator.

    run_rl(cfg) -> {"history", "summary", "run_dir"}

Schedules (cfg.rl):
- deterministic=false (default): the generator samples in a thread of its own while the trainer steps
  (controller.run_async); deterministic=true: lockstep (controller.run_lockstep), bitwise resumable.
- backend=ray: the trainer ranks and several generators as Ray actors, each in a process of its own
  (ray_run.py, docs/distributed.md): the one disaggregated mode.

Checkpoints (checkpoint.py): every rl.checkpoint_every steps into the run dir; job.resume=<checkpoint.pt or
run dir> continues the run in the same folder, async or lockstep, in one process or on Ray.
"""

from __future__ import annotations

import random

import torch

from ..model_init import initial_model
from ..tasks.registry import build_task
from .build import build_rollout_worker, build_trainer, generator_copy
from .checkpoint import load_rl_checkpoint, restore_rng, restore_trainer
from .controller import run_async, run_lockstep
from .trainer_loop import TrainerLoop

__all__ = ["run_rl"]


def run_rl(cfg) -> dict:
    if cfg.rl.get("backend", "threaded") == "ray":
        from . import ray_run  # needs the optional ray package

        return ray_run.run_on_ray(cfg)
    return _run_in_process(cfg)


def _start(cfg):
    """Seeds, the starting model (may run the cached SFT warm start with all threads), thread count."""
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    model = initial_model(cfg)
    # One intra-op thread, as every Ray actor (ray_actors.py), in every mode: generator and trainer share the
    # cores (oversubscribed OpenMP spins badly), and the trainer's gradients can depend on the thread count
    # (torch's CPU GEMMs split a reduction over threads: on an AVX-512 Xeon, 1 and 2 threads differ in the last
    # bits), so a run's numbers do not depend on the backend or on the machine's cores. The forward ops are
    # thread-count invariant (tests/ops): the generator/trainer parity never rested on this.
    torch.set_num_threads(1)
    return model


def _trainer_from_checkpoint(cfg, model):
    """(Trainer, the checkpoint job.resume names or None, the step to start from)."""
    trainer = build_trainer(cfg, model)
    ckpt = load_rl_checkpoint(cfg.job.get("resume"))
    if ckpt:
        restore_trainer(trainer, ckpt)
    return trainer, ckpt, ckpt["step"] if ckpt else 0


def _run_in_process(cfg) -> dict:
    model = _start(cfg)
    task = build_task(cfg, vocab_size=model.config.vocab_size)
    trainer, ckpt, start = _trainer_from_checkpoint(cfg, model)
    worker = build_rollout_worker(cfg, generator_copy(model), task, version=trainer.version, resume=ckpt)
    if ckpt:
        restore_rng(ckpt)
    loop = TrainerLoop(cfg, trainer, task, start, generator_stats=worker.engine.throughput)

    def after_step(step):  # step boundary: buffer, in-flight groups and data position agree under the lock
        if loop.checkpoint_due(step):
            with worker.lock:
                loop.save(step, worker.state())

    loop.log_initial_validation()
    schedule = run_lockstep if cfg.rl.deterministic else run_async
    try:
        schedule(worker, trainer, start, loop.steps, loop.on_step, after_step)
    except BaseException:
        loop.abort()
        raise
    finally:  # also on failure: no episode (sandbox) nor task service (a retriever server) outlives the run
        worker.close()
        task.close()
    return loop.finish()
