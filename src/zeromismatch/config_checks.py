"""What a validated config needs from this machine before anything is built, per task and backend: the files a
task reads, the optional packages (ray, vllm) and the sandbox tool. Each raises one ConfigError line naming the
key and the fix; config_schema.check_runnable calls them."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from .errors import ConfigError, MissingFileError
from .tasks.agent.sandbox import bwrap_available


def _files_exist(section: Any, prefix: str, keys: tuple[str, ...]) -> None:
    """Every path the section sets under ``keys`` is a file (unset keys are checked by the caller)."""
    for key in keys:
        path = section.get(key)
        if path and not Path(path).is_file():
            raise MissingFileError(f"file not found: {path} ({prefix}.{key})")


def search_files(task: Any) -> None:
    """task.source=files: the Search-R1 parquet files (and the corpus a managed retriever serves) exist."""
    for key in ("train", "eval"):
        if not task.files.get(key):
            raise ConfigError(f"task.files.{key}=null: task.source=files needs a local Search-R1 parquet (conf/task/search.yaml)")
    if not task.retriever.get("url") and not task.files.get("corpus"):
        raise ConfigError("task.files.corpus=null and task.retriever.url=null: give a corpus JSONL to serve or a running "
                          "retriever's URL (conf/task/search.yaml)")  # fmt: skip
    _files_exist(task.files, "task.files", ("train", "eval", "corpus"))


def ray(cfg: Any) -> None:
    if importlib.util.find_spec("ray") is None:
        raise ConfigError("rl.backend=ray: the ray package is not installed; pip install -e '.[ray]' (pyproject.toml)")
    r = cfg.ray
    gen, tr = float(r.generator_resources.num_gpus), float(r.trainer_resources.num_gpus)
    if not str(cfg.device).startswith("cuda"):
        if max(gen, tr) > 0:
            raise ConfigError(f"ray.*_resources.num_gpus={max(gen, tr):g} with device={cfg.device}: set device=cuda or num_gpus=0 (conf/ray/default.yaml)")
        return
    # an actor sees only the GPUs Ray gives it (CUDA_VISIBLE_DEVICES): every role must reserve a share
    for role, share in (("generator", gen), ("trainer", tr)):
        if share <= 0:
            raise ConfigError(f"ray.{role}_resources.num_gpus=0 with device={cfg.device}: reserve a GPU share per actor "
                              "(ray=one_gpu: every role on one GPU, conf/ray/one_gpu.yaml)")
    if int(r.trainer_ranks) > 1 and tr < 1:
        raise ConfigError(f"ray.trainer_ranks={r.trainer_ranks} with ray.trainer_resources.num_gpus={tr:g}: trainer ranks would "
                          "share a GPU, which NCCL refuses; give each rank a whole GPU or set ray.trainer_ranks=1")
    need = int(r.generators) * gen + int(r.trainer_ranks) * tr
    if not r.address and need > int(r.num_gpus):
        raise ConfigError(f"ray.num_gpus={r.num_gpus}: the actors reserve {need:g} GPUs of the local cluster; set ray.num_gpus "
                          "to this machine's GPU count or lower the shares (conf/ray/default.yaml)")


def agent(task: Any) -> None:
    why = bwrap_available()
    if why:
        raise ConfigError(f"task=agent runs every rollout in a bubblewrap sandbox: {why}")
    if task.source == "rows":
        _files_exist(task.rows, "task.rows", ("train", "eval"))


def vllm(cfg) -> None:
    """generator=vllm / vllm_native: vLLM installed, one process, the CPU build's device."""
    backend = cfg.generator.backend
    if cfg.job.name == "rl" and cfg.rl.get("swap_policy", "keep") != "keep":
        raise ConfigError(f"rl.swap_policy={cfg.rl.swap_policy!r}: generator={backend} supports keep only")
    if cfg.job.name == "rl" and float(cfg.rl.temperature) != 1.0:
        raise ConfigError(f"rl.temperature={cfg.rl.temperature}: generator={backend} returns raw logprobs, which a "
                          "loss at temperature != 1 cannot use; set rl.temperature=1.0 or use generator=embedded")
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"generator={backend} needs vLLM: pip install -e '.[vllm]' (or scripts/install_vllm.sh), "
                          "or use generator=embedded")
