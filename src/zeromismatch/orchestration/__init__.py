"""RL orchestration: who runs where and how rollouts and weights move between the generator and the trainer.
The algorithms themselves (losses, advantages, the offpolicy-N buffer's rules) are in rl/, free of threads
and process groups.

    rollouts.py        RolloutWorker: prompts -> episodes -> scored groups -> RunAheadBuffer
    controller.py      in-process schedules: run_async (generator thread + WeightChannel), run_lockstep
    disaggregated.py   two-process protocol over torch.distributed: serve_generator / run_trainer
    build.py           an RL run's pieces from its config (trainer; engine + buffer + worker)
    trainer_loop.py    per-step training, logging, evaluation, checkpoints, summary
    checkpoint.py      step-boundary checkpoints and resume
    runner.py          run_rl(cfg): the whole run, in one process or two
"""

from .controller import WeightChannel, run_async, run_lockstep
from .rollouts import RolloutWorker
from .runner import run_rl

__all__ = ["RolloutWorker", "WeightChannel", "run_async", "run_lockstep", "run_rl"]
