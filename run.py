#!/usr/bin/env python
"""Entry point for every job:

    python run.py job=<name> model=<preset> numerics=<mode> [key=value ...]
    python run.py +exp=tiny_math_op4_bi                       # a fixed experiment (conf/exp/, experiments/README.md)
    python run.py -m +exp=tiny_math_op4_bi,tiny_math_op4_stock # a sweep

Jobs: zeromismatch.jobs.JOBS. Config: conf/config.yaml. One folder per run, cfg.logging.run_dir (runs/...):
Hydra's config and run.log, the metrics (JSONL + offline W&B), checkpoints, status.json.

The composed config is checked before any work (zeromismatch/config_schema.py): an unknown key, a wrong type,
an out-of-range value, or an experiment this machine cannot run stops the run with one line
``error: <key>=<value>: expected <what is allowed> (<yaml file>)`` and exit status 2. So do Hydra's own
composition errors and faulty input files (zeromismatch.errors.UserError: the file and the line), and a task's
infrastructure failure (zeromismatch.tasks.base.ToolError: what failed, e.g. the retriever URL and request).
Debug flag: ``HYDRA_FULL_ERROR=1 python run.py ...`` shows the full traceback of every error instead.
"""

from __future__ import annotations

import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

import zeromismatch.logging  # noqa: F401 - registers ${zm_run_dir:...}, which conf/logging resolves
from zeromismatch.config_schema import check_config, hydra_error_line, resolve_config
from zeromismatch.errors import UserError
from zeromismatch.jobs import JobError, get_job
from zeromismatch.tasks.base import ToolError

DEBUG = os.environ.get("HYDRA_FULL_ERROR") == "1"
_job_started = False  # Hydra errors after this point come from a job, not from composing the config


def _user_error(e: BaseException) -> UserError | ToolError | None:
    """The UserError (or ToolError: a task's infrastructure failed, e.g. a retriever URL that does not answer)
    behind ``e``, also when a worker thread's failure wraps it."""
    while e is not None and not isinstance(e, (UserError, ToolError)):
        e = e.__cause__ or e.__context__
    return e


def _exit_with(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> dict:
    global _job_started
    _job_started = True
    try:
        resolve_config(cfg)  # one value for ${now:...} etc. everywhere in this run
        job = get_job(cfg.job.name)
        check_config(cfg, HydraConfig.get().runtime.choices)
        result = job(cfg)
    except JobError as e:
        _exit_with(str(e))
    except Exception as e:
        user_error = _user_error(e)
        if DEBUG or user_error is None:
            raise
        _exit_with(str(user_error))
    if not isinstance(result, dict):
        raise TypeError(f"job {cfg.job.name!r} returned {type(result).__name__}, expected a dict")
    return result


if __name__ == "__main__":
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises its composition errors here instead of printing them
    try:
        main()
    except (HydraException, OmegaConfBaseException) as e:
        if DEBUG or _job_started:
            raise
        _exit_with(hydra_error_line(e))
