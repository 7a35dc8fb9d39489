"""`python run.py job=rl ...` (the default job): async off-policy RL (orchestration/runner.py).

One folder per run (Hydra's output dir, logging/run_dir.py): config, run.log, metrics.jsonl (+ batches.jsonl),
the offline W&B run, checkpoint.pt and status.json. Logs every step to JSONL + W&B (offline unless a key is
set): the mismatch metrics (rl/metrics.py) with their precision / staleness split. Checkpoints every
`rl.checkpoint_every` steps; `job.resume=<run_dir>/checkpoint.pt` (or the run dir) continues the run in the
same folder and W&B run, async or lockstep (bit for bit with `rl.deterministic=true`).
"""

from __future__ import annotations

from ..logging import pin_run_dir, run_status
from ..orchestration.runner import run_rl


def main(cfg) -> dict:
    with run_status(pin_run_dir(cfg)):
        return run_rl(cfg)
