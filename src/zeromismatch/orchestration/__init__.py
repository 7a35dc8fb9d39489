"""RL orchestration: who runs where and how rollouts and weights move between the generator and the trainer.
The algorithms themselves (losses, advantages, the offpolicy-N buffer's rules) are in rl/, free of threads
and process groups.

    rollouts.py        RolloutWorker: prompts -> episodes -> scored groups -> RunAheadBuffer
    controller.py      in-process schedules: run_async (generator thread + WeightChannel), run_lockstep
    ray_run.py         rl.backend=ray: the driver (buffer, router, schedules, recovery) over Ray actors
    ray_actors.py      GeneratorRole (an engine and its episodes), TrainerRank (one FSDP2 rank)
    ray_cluster.py     a local Ray cluster (loopback only) or an existing one; actor resources
    router.py          which generator runs which prompt group (least loaded, sticky)
    weight_sync.py     trainer -> generators weights by collective broadcast (gloo | nccl | cuda_ipc)
    weight_sync_check.py  the broadcast checked bitwise in two processes, without Ray (CPU or one GPU)
    build.py           an RL run's pieces from its config (trainer; engine + buffer + worker)
    trainer_loop.py    per-step training, logging, evaluation, checkpoints, summary
    checkpoint.py      step-boundary checkpoints and resume
    runner.py          run_rl(cfg): the whole run, in one process or on Ray
"""

from .controller import WeightChannel, run_async, run_lockstep
from .rollouts import RolloutWorker
from .runner import run_rl

__all__ = ["RolloutWorker", "WeightChannel", "run_async", "run_lockstep", "run_rl"]
