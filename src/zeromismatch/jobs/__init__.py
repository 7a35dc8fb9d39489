"""Job registry: `python run.py job=<name>` runs JOBS[name].

Contract: each job is a module `zeromismatch.jobs.<name>` with `main(cfg: DictConfig) -> dict`. `cfg` is the
whole composed, resolved config (cfg.job holds the job's own knobs; cfg.model, cfg.numerics, cfg.task,
cfg.rl, cfg.generator, cfg.trainer, cfg.logging, cfg.seed, cfg.device, cfg.run_name the shared ones). The
job logs through zeromismatch.logging.MetricsLogger and returns a dict of JSON-serializable results.
Modules are imported only when their job runs, so a job that is not written yet breaks nothing else.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Callable

JOBS: dict[str, str] = {
    "rl": "zeromismatch.jobs.rl:main",
    "sft": "zeromismatch.jobs.sft:main",
    "parity": "zeromismatch.jobs.parity:main",
    "eval": "zeromismatch.jobs.eval:main",
    "bench": "zeromismatch.jobs.bench:main",
    "plot": "zeromismatch.jobs.plot:main",
    "smoke": "zeromismatch.jobs.smoke:main",
    "retriever": "zeromismatch.jobs.retriever:main",
}

JobFn = Callable[[Any], dict]


class JobError(RuntimeError):
    """A job that does not exist, is not written yet, or cannot be imported."""


def available_jobs() -> dict[str, bool]:
    """name -> whether its module exists (without importing it)."""
    return {name: importlib.util.find_spec(target.split(":")[0]) is not None for name, target in JOBS.items()}


def _listing() -> str:
    return ", ".join(f"{n}" if ok else f"{n} (not written yet)" for n, ok in available_jobs().items())


def get_job(name: str) -> JobFn:
    if name not in JOBS:
        raise JobError(f"unknown job {name!r}; available jobs: {_listing()}")
    module_name, attr = JOBS[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name == module_name:
            raise JobError(
                f"job {name!r} is not available yet: {module_name} does not exist; jobs: {_listing()}"
            ) from e
        raise JobError(f"job {name!r} is not available yet: importing {module_name} failed: {e}") from e
    except ImportError as e:
        raise JobError(f"job {name!r} is not available yet: importing {module_name} failed: {e}") from e
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise JobError(f"job {name!r}: {module_name} defines no callable {attr}(cfg)")
    return fn

