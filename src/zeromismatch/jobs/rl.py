"""`python run.py job=rl ...` (the default job): async off-policy RL (orchestration/runner.py).

Logs every step to JSONL + W&B (offline unless a key is set): the mismatch metrics (rl/metrics.py) with
their precision / staleness split. Checkpoints every `rl.checkpoint_every` steps into the run dir;
`job.resume=<checkpoint.pt>` continues the run (bit for bit with `rl.deterministic=true`).
"""

from __future__ import annotations

from ..orchestration.runner import run_rl


def main(cfg) -> dict:
    return run_rl(cfg)
