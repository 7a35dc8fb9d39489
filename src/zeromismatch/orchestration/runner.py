"""One RL run from its config: prompts -> generator (RolloutWorker) -> rollouts (RunAheadBuffer) -> trainer
-> weights -> generator.

    run_rl(cfg) -> {"history", "summary", "run_dir"}

Schedules (cfg.rl):
- deterministic=false (default): the generator samples in a thread of its own while the trainer steps
  (controller.run_async); deterministic=true: lockstep (controller.run_lockstep), bitwise resumable.
- backend=ray: the trainer ranks and several generators as Ray actors (ray_run.py, docs/distributed.md).
- disaggregated=true: generator and trainer in two processes over gloo (disaggregated.py). The trainer
  process holds the model, the Trainer and the logger (and the task only to evaluate); the generator
  process holds its model, the Engine, the run-ahead buffer and the task, and on resume loads the
  checkpoint's weights directly.

Checkpoints (checkpoint.py): every rl.checkpoint_every steps into the run dir; job.resume=<checkpoint.pt or
run dir> continues the run in the same folder, async or lockstep, one process or two.
"""

from __future__ import annotations

import os
import random
import socket
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import OmegaConf

from ..logging.run_dir import log_to_run_dir
from ..model_init import initial_model, uses_sft_warm_start
from ..sft import ensure_sft_checkpoint
from ..tasks.base import ToolError
from ..tasks.registry import build_task
from .build import build_rollout_worker, build_trainer, for_generation, generator_copy
from .checkpoint import load_rl_checkpoint, restore_rng, restore_trainer, trained_weights
from .controller import run_async, run_lockstep
from .disaggregated import GeneratorFailed, make_groups, run_trainer, serve_generator
from .trainer_loop import TrainerLoop

__all__ = ["run_rl"]


def run_rl(cfg) -> dict:
    if cfg.rl.get("backend", "threaded") == "ray":
        from . import ray_run  # needs the optional ray package

        return ray_run.run_on_ray(cfg)
    if cfg.rl.get("disaggregated", False):
        return _spawn_disaggregated(cfg)
    return _run_in_process(cfg)


def _start(cfg):
    """Seeds, the starting model (may run the cached SFT warm start with all threads), thread count."""
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    model = initial_model(cfg)
    if not cfg.rl.deterministic:
        # generator and trainer share the cores: one intra-op thread each (oversubscribed OpenMP spins
        # badly). Numerics do not depend on the thread count (tests/ops), so parity is unaffected.
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


def _trainer_role(cfg, groups) -> dict:
    model = _start(cfg)
    # the task serves only the held-out evaluation here: rollouts and rewards live with the generator
    task = build_task(cfg, vocab_size=model.config.vocab_size) if cfg.rl.eval_every else None
    trainer, ckpt, start = _trainer_from_checkpoint(cfg, model)
    if ckpt:
        restore_rng(ckpt)
    loop = TrainerLoop(cfg, trainer, task, start)

    def after_step(step, generator_state):
        if loop.checkpoint_due(step):
            loop.save(step, generator_state())

    loop.log_initial_validation()
    try:
        run_trainer(trainer, start, loop.steps, loop.on_step, generator_rank=1, groups=groups, after_step=after_step)
    except BaseException:
        loop.abort()
        raise
    finally:
        if task is not None:
            task.close()
    return loop.finish()


def _generator_role(cfg, groups) -> None:
    model = _start(cfg)
    task = build_task(cfg, vocab_size=model.config.vocab_size)
    ckpt = load_rl_checkpoint(cfg.job.get("resume"))
    version = 0
    if ckpt:
        version, weights = trained_weights(ckpt)
        model.load_state_dict(weights)
    worker = build_rollout_worker(cfg, for_generation(model), task, version=version, resume=ckpt)
    try:
        serve_generator(worker, trainer_rank=0, groups=groups)
    finally:
        worker.close()
        task.close()


def _spawn_disaggregated(cfg) -> dict:
    """Two processes on this machine over gloo: rank 0 trains, rank 1 generates. Returns the trainer's result."""
    if cfg.rl.deterministic:
        raise ValueError("rl.disaggregated=true is asynchronous: set rl.deterministic=false")
    if uses_sft_warm_start(cfg):  # built once, here, before both processes load it from the cache
        ensure_sft_checkpoint(cfg)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = os.path.join(tempfile.mkdtemp(prefix="zm_disagg_"), "result.pt")
    try:
        mp.spawn(_role_process, args=(OmegaConf.to_container(cfg, resolve=True), port, out), nprocs=2, join=True)
    except mp.ProcessRaisedException as e:
        failure = _read_failure(out)
        if failure is not None:  # the trainer's error (a generator failure it received), with its own type
            raise failure from e
        raise
    return torch.load(out, weights_only=False)


def _read_failure(out: str) -> BaseException | None:
    path = out + ".error"
    if not os.path.exists(path):
        return None
    name, text = torch.load(path, weights_only=False)
    return ToolError(text) if name == "ToolError" else GeneratorFailed(text)


def _role_process(rank: int, cfg_dict: dict, port: int, out: str) -> None:
    """Spawn entry point (importable in the child): one rank of a disaggregated run."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    log_to_run_dir(cfg_dict["logging"]["run_dir"])
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        cfg = OmegaConf.create(cfg_dict)
        groups = make_groups()
        if rank == 0:
            try:
                torch.save(_trainer_role(cfg, groups), out)
            except (ToolError, GeneratorFailed) as e:  # the driver re-raises it (the spawn error is a traceback dump)
                torch.save((type(e).__name__, str(e)), out + ".error")
                raise
        else:
            _generator_role(cfg, groups)
    finally:
        dist.destroy_process_group()
