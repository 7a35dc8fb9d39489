"""`python run.py job=sft model=tiny`: the SFT warm start (sft/): train (or hit the cache), measure, copy
the checkpoint to the run dir (or job.save_to)."""

from __future__ import annotations

import shutil
from pathlib import Path

from ..evaluation import VALIDATION_METRIC
from ..logging import MetricsLogger
from ..sft import run_sft


def main(cfg) -> dict:
    with MetricsLogger.from_cfg(cfg) as log:
        res = run_sft(cfg, load=False, log_fn=log.log)
        m = res.summary["measured"]
        final = {
            "sft/train_reward": m["train_reward"]["accuracy"],
            VALIDATION_METRIC: m["heldout"]["accuracy"],
            "sft/steps": res.summary["train"]["steps"],
            "sft/train_seconds": res.summary["train"]["train_seconds"],
        }
        log.summary({**final, "sft/cache_hit": res.cache_hit})
        dest = Path(cfg.job.save_to) if cfg.job.get("save_to") else log.run_dir / "checkpoint"
        shutil.copytree(res.path, dest, dirs_exist_ok=True)
        run_dir = str(log.run_dir)
    print(f"sft: checkpoint {res.path} (copied to {dest})", flush=True)
    return {
        **final,
        "heldout_accuracy": m["heldout"]["accuracy"],
        "cache_hit": res.cache_hit,
        "checkpoint": str(res.path),
        "copied_to": str(dest),
        "run_dir": run_dir,
    }
