#!/usr/bin/env python
"""Entry point for every job:

    python run.py job=<name> model=<preset> numerics=<mode> [key=value ...]
    python run.py +exp=tiny_math_op4_bi                       # a fixed experiment (conf/exp/, experiments/README.md)
    python run.py -m +exp=tiny_math_op4_bi,tiny_math_op4_stock # a sweep

Jobs: zeromismatch.jobs.JOBS. Config: conf/config.yaml. One folder per run, cfg.logging.run_dir (runs/...):
Hydra's config and run.log, the metrics (JSONL + offline W&B), checkpoints.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

import zeromismatch.logging  # noqa: F401 - registers ${zm_run_dir:...}, which conf/logging resolves
from zeromismatch.jobs import JobError, get_job


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> dict:
    OmegaConf.resolve(cfg)  # one value for ${now:...} etc. everywhere in this run
    try:
        job = get_job(cfg.job.name)
    except JobError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    result = job(cfg)
    if not isinstance(result, dict):
        raise TypeError(f"job {cfg.job.name!r} returned {type(result).__name__}, expected a dict")
    return result


if __name__ == "__main__":
    main()
