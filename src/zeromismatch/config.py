"""Reading a run.py config (a composed DictConfig, a plain dict or an attribute object alike).

    cfg_get(cfg.model, "checkpoint")      # None-safe access with a default
    to_plain(cfg.numerics)                # OmegaConf containers -> dicts / lists
    config_hash(key)                      # cache keys (SFT warm start)
    numerics_spec(cfg)                    # what build_model / load_checkpoint take for cfg.numerics

No project imports: tasks, logging, jobs and the library modules all read configs through here.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

REPO_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = REPO_ROOT / "conf"

__all__ = [
    "CONF_DIR",
    "REPO_ROOT",
    "cfg_get",
    "config_hash",
    "file_sha256",
    "model_overrides",
    "numerics_spec",
    "to_plain",
]


def cfg_get(cfg: Any, key: str, default: Any = None) -> Any:
    """cfg[key] for a DictConfig, dict or attribute object; ``default`` when cfg is None or the value is
    absent or None."""
    if cfg is None:
        return default
    value = cfg.get(key, default) if hasattr(cfg, "get") else getattr(cfg, key, default)
    return default if value is None else value


def to_plain(value: Any) -> Any:
    """OmegaConf containers -> Python containers (resolved); anything else as is."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def config_hash(obj: Any, n: int = 16) -> str:
    """First ``n`` hex digits of sha256 over canonical JSON (sorted keys) of ``obj``."""
    text = json.dumps(to_plain(obj), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def model_overrides(cfg: Any) -> dict:
    """cfg.model.overrides as a plain dict ({} when unset)."""
    return dict(to_plain(cfg_get(cfg_get(cfg, "model"), "overrides", {})) or {})


def numerics_spec(cfg: Any, name: str | None = None) -> dict:
    """The numerics argument of build_model / load_checkpoint for this run: the whole cfg.numerics node (mode
    and kernel policies, conf/numerics) as a plain dict, so the policies reach the model; ``name`` replaces
    the mode (a benchmark over modes keeps the run's policies)."""
    node = to_plain(cfg_get(cfg, "numerics"))
    node = dict(node) if isinstance(node, dict) else {"name": node or "stock"}
    if name is not None:
        node["name"] = name
    return node
