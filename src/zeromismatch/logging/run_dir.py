"""One folder per run: Hydra's output dir, the metrics, the W&B run, the checkpoints and the status are the
same directory (conf/config.yaml points hydra.run.dir at logging.run_dir; a resume names the folder of its
checkpoint). status.json says whether the run is running, completed, failed (with the error, one line) or
interrupted, so that readers (plots) can skip runs that never produced anything."""

from __future__ import annotations

import json
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

from ..config import cfg_get

STATUS_NAME = "status.json"


def resume_dir(resume: str | Path) -> Path:
    """The run folder a resume continues: job.resume names the checkpoint file or the folder."""
    p = Path(resume)
    return p.parent if p.suffix == ".pt" or p.is_file() else p


def _run_dir_resolver(resume, default):
    return str(resume_dir(resume)) if resume else default


if not OmegaConf.has_resolver("zm_run_dir"):  # conf/logging: ${zm_run_dir:${job.resume},<fresh run dir>}
    OmegaConf.register_new_resolver("zm_run_dir", _run_dir_resolver)


def unique_dir(path: Path) -> Path:
    """`path` if it holds no metrics yet, else path-1, path-2, ... (two runs never share a JSONL)."""
    candidate, n = path, 0
    while candidate.is_dir() and any(candidate.glob("*.jsonl")):
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def _relative(path: Path) -> Path:
    """``path`` relative to the working directory when it lies under it (how configs and logs name runs)."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def hydra_run_dir() -> Path | None:
    """This job's Hydra output dir (run.py: the run folder, a sweep job's included), or None outside Hydra."""
    return _relative(Path(HydraConfig.get().runtime.output_dir)) if HydraConfig.initialized() else None


def pin_run_dir(cfg) -> Path:
    """Decide the run's one folder and write it into cfg.logging.run_dir, so every part of the run (the Ray
    actors of an rl.backend=ray one too) uses it: the resumed run's folder, else Hydra's output dir, else
    (no Hydra: tests, notebooks) cfg.logging.run_dir made unique."""
    resume = cfg_get(cfg.job, "resume")
    if resume:
        run_dir = resume_dir(resume)
    elif hydra_run_dir() is not None:
        run_dir = hydra_run_dir()
    else:
        run_dir = unique_dir(Path(cfg.logging.run_dir))
    with open_dict(cfg):
        cfg.logging.run_dir = str(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def write_status(run_dir: str | Path, status: str, error: str | None = None) -> None:
    record = {"status": status, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if error:
        record["error"] = error
    path = Path(run_dir) / STATUS_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record) + "\n")
    tmp.replace(path)


def read_status(run_dir: str | Path) -> dict | None:
    """The run's status.json, or None (no file: a run written without one, or unreadable)."""
    try:
        return json.loads((Path(run_dir) / STATUS_NAME).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def one_line(e: BaseException) -> str:
    """``Type: message`` of the exception, on one line (the traceback is in run.log)."""
    text = " ".join(traceback.format_exception_only(type(e), e)).strip()
    return " ".join(text.split())


@contextmanager
def run_status(run_dir: str | Path):
    """status.json is running inside the block, then completed, failed (with the error) or interrupted."""
    write_status(run_dir, "running")
    try:
        yield
    except KeyboardInterrupt:
        write_status(run_dir, "interrupted")
        raise
    except BaseException as e:
        write_status(run_dir, "failed", one_line(e))
        raise
    write_status(run_dir, "completed")
