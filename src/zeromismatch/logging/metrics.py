"""MetricsLogger (JSONL + W&B) and the readers that rebuild metric histories offline. See the package doc."""

from __future__ import annotations

import json
import netrc
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from omegaconf import OmegaConf

from ..config import cfg_get
from .run_dir import hydra_run_dir, unique_dir

WANDB_MODES = ("auto", "offline", "online", "disabled")
JSONL_NAME = "metrics.jsonl"
_WANDB_INTERNAL = ("_step", "_runtime", "_timestamp")


def resolve_wandb_mode(mode: str | None = "auto", env: Mapping[str, str] | None = None) -> str:
    """'auto': $WANDB_MODE if set, else 'online' when $WANDB_API_KEY is set, else 'offline'.
    'offline' / 'online' / 'disabled' are forced as given."""
    env = os.environ if env is None else env
    mode = mode or "auto"
    if mode not in WANDB_MODES:
        raise ValueError(f"logging.wandb.mode must be one of {WANDB_MODES}, got {mode!r}")
    if mode != "auto":
        return mode
    env_mode = env.get("WANDB_MODE")
    if env_mode:
        return {"dryrun": "offline", "run": "online"}.get(env_mode, env_mode)
    return "online" if env.get("WANDB_API_KEY") else "offline"


def _have_wandb_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": x}} -> {"a/b": x}; 1-element tensors / numpy scalars -> Python numbers."""
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{name}/"))
            continue
        if hasattr(value, "item") and not isinstance(value, (bool, int, float, str)):
            size = value.numel() if callable(getattr(value, "numel", None)) else getattr(value, "size", 1)
            if size != 1:
                raise TypeError(f"metric {name!r} must be a scalar, got {type(value).__name__} of {size} elements")
            value = value.item()
        if not isinstance(value, (bool, int, float, str)):
            raise TypeError(f"metric {name!r} must be a number, bool or str, got {type(value).__name__}")
        out[name] = value
    return out


def truncate_jsonl_from(run_dir: Path, step: int) -> None:
    """Drop the rows of every JSONL in ``run_dir`` logged at ``step`` or later: a resume from the checkpoint
    after step - 1 logs them again (a killed run may have got past its last checkpoint)."""
    for path in run_dir.glob("*.jsonl"):
        kept = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line cut by the kill
                continue
            if int(row.get("step", -1)) < step:
                kept.append(line + "\n")
        path.write_text("".join(kept), encoding="utf-8")


def _wandb_run_id(run_dir: Path) -> str | None:
    """The id of the W&B run under ``run_dir`` (its folder wandb/<offline-run|run>-<time>-<id>), if any."""
    runs = sorted((run_dir / "wandb").glob("*run-*-*"), key=lambda p: p.stat().st_mtime)
    return runs[-1].name.rsplit("-", 1)[1] if runs else None


class MetricsLogger:
    """Writes every `log(metrics, step)` to `<run_dir>/<jsonl>` (one JSON object per line, with `step` and
    `_time`) and to a W&B run whose files live in `<run_dir>/wandb/`. With ``resume_step`` the run dir is
    reused as it is: rows at or after that step are dropped from its JSONL files and the W&B run is resumed
    under its id (offline: a new offline-run folder with the same id, merged when synced).

    cfg_logging keys (conf/logging/default.yaml): run_dir, jsonl (file name in run_dir),
    wandb.{mode, project, entity, group, tags}. W&B never prompts; if it cannot be imported or started,
    a warning is issued and logging continues to the JSONL alone. Steps should not decrease: W&B drops
    such rows (the JSONL keeps them).
    """

    def __init__(self, cfg_logging: Any, run_name: str, config_dict: Mapping[str, Any] | None = None,
                 *, resume_step: int | None = None):
        self.run_name = run_name
        run_dir = Path(cfg_get(cfg_logging, "run_dir", f"runs/{run_name}"))
        self.resume_step = resume_step
        if resume_step is None:
            self.run_dir = unique_dir(run_dir)
        else:  # a resumed run continues its folder, its JSONL and its W&B run
            self.run_dir = run_dir
            truncate_jsonl_from(run_dir, resume_step)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.run_dir / cfg_get(cfg_logging, "jsonl", JSONL_NAME)
        self._fh = open(self.jsonl_path, "a", encoding="utf-8")
        self._summary: dict[str, Any] = {}
        self._last_step: int | None = None
        if config_dict is not None:
            (self.run_dir / "config.json").write_text(json.dumps(dict(config_dict), indent=2, default=str))
        wcfg = cfg_get(cfg_logging, "wandb", {})
        self.wandb_mode = resolve_wandb_mode(cfg_get(wcfg, "mode", "auto"))
        if self.wandb_mode == "online" and not _have_wandb_key():
            warnings.warn("W&B mode is online but no API key is set (WANDB_API_KEY or ~/.netrc); using offline")
            self.wandb_mode = "offline"
        self.wandb_run = self._init_wandb(wcfg, config_dict)

    @classmethod
    def from_cfg(cls, cfg: Any, resume_step: int | None = None) -> "MetricsLogger":
        """The logger of a run.py job: cfg.logging, cfg.run_name, and the whole resolved config; ``resume_step``:
        the first step of a resumed run."""
        cfg_logging = OmegaConf.to_container(cfg.logging, resolve=True)
        if resume_step is None and hydra_run_dir() is not None:  # one folder: Hydra's, for every job
            cfg_logging["run_dir"] = str(hydra_run_dir())
        return cls(cfg_logging, cfg.run_name, OmegaConf.to_container(cfg, resolve=True), resume_step=resume_step)

    def _init_wandb(self, wcfg: Any, config_dict: Mapping[str, Any] | None):
        if self.wandb_mode == "disabled":
            return None
        try:  # imported here: W&B is optional at run time, a missing or broken install leaves the JSONL
            import wandb
        except Exception as e:  # noqa: BLE001 - any import failure: keep the JSONL going
            warnings.warn(f"wandb could not be imported ({e!r}); metrics go to {self.jsonl_path} only")
            return None
        run_id = _wandb_run_id(self.run_dir) if self.resume_step is not None else None
        try:
            return wandb.init(
                id=run_id,
                resume="allow" if run_id else None,
                project=cfg_get(wcfg, "project", "zeromismatch"),
                entity=cfg_get(wcfg, "entity"),
                group=cfg_get(wcfg, "group"),
                tags=list(cfg_get(wcfg, "tags", [])) or None,
                name=self.run_name,
                config=dict(config_dict) if config_dict is not None else None,
                dir=str(self.run_dir),
                mode=self.wandb_mode,
                reinit="create_new",
                settings=wandb.Settings(console="off", silent=True),
            )
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"wandb.init failed ({e!r}); metrics go to {self.jsonl_path} only")
            return None

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        if isinstance(step, bool) or int(step) != step:
            raise TypeError(f"step must be an integer, got {step!r}")
        step = int(step)
        flat = _flatten(metrics)
        clash = {"step", "_time"} & flat.keys()
        if clash:
            raise ValueError(f"metric names {sorted(clash)} are reserved by the logger")
        self._fh.write(json.dumps({"step": step, "_time": time.time(), **flat}) + "\n")
        self._fh.flush()
        if self.wandb_run is not None:
            if self._last_step is not None and step < self._last_step:
                warnings.warn(f"step {step} < previous step {self._last_step}: W&B drops this row, the JSONL keeps it")
            try:
                self.wandb_run.log(flat, step=step)
            except Exception as e:  # noqa: BLE001
                warnings.warn(f"wandb log failed ({e!r}); continuing with the JSONL only")
                self.wandb_run = None
        self._last_step = step if self._last_step is None else max(step, self._last_step)

    def summary(self, values: Mapping[str, Any]) -> None:
        """Final / best values: <run_dir>/summary.json (rewritten) and the W&B run summary."""
        flat = _flatten(values)
        self._summary.update(flat)
        (self.run_dir / "summary.json").write_text(json.dumps(self._summary, indent=2))
        if self.wandb_run is not None:
            try:
                self.wandb_run.summary.update(flat)
            except Exception as e:  # noqa: BLE001
                warnings.warn(f"wandb summary failed ({e!r})")

    def close(self, exit_code: int = 0) -> None:
        if not self._fh.closed:
            self._fh.close()
        if self.wandb_run is not None:
            run, self.wandb_run = self.wandb_run, None
            try:
                run.finish(exit_code=exit_code)
            except Exception as e:  # noqa: BLE001
                warnings.warn(f"wandb finish failed ({e!r})")

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(exit_code=0 if exc_type is None else 1)


# ------------------------------------------------------------------------------------------ readers


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Rows of a metrics JSONL (a file, or a run dir holding metrics.jsonl or one other .jsonl). A truncated last line (a run
    killed mid-write) is skipped with a warning; a bad line elsewhere raises ValueError."""
    p = Path(path)
    if p.is_dir():
        found = [p / JSONL_NAME] if (p / JSONL_NAME).exists() else sorted(p.glob("*.jsonl"))
        if len(found) != 1:
            raise FileNotFoundError(f"{p}: expected {JSONL_NAME} or exactly one .jsonl file, found {len(found)}")
        p = found[0]
    lines = p.read_text(encoding="utf-8").splitlines()
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:
                warnings.warn(f"{p}: skipping a truncated last line")
                break
            raise ValueError(f"{p}:{i + 1}: not JSON ({e})") from e
    return rows


def _wandb_cli() -> list[str]:
    return [sys.executable, "-m", "wandb", "leet", "inspect"]


def wandb_cli_available(timeout: float = 60) -> bool:
    """Whether `wandb leet inspect` (the offline reader of .wandb files) runs here."""
    try:
        r = subprocess.run([*_wandb_cli(), "--help"], capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


def find_wandb_file(path: str | os.PathLike) -> Path | None:
    """The newest .wandb transaction log under `path` (a run dir, a wandb dir, an offline-run dir, or the file)."""
    p = Path(path)
    if p.is_file():
        return p if p.suffix == ".wandb" else None
    files = sorted(p.rglob("*.wandb"), key=lambda f: f.stat().st_mtime)
    if len(files) > 1:
        warnings.warn(f"{p} holds {len(files)} W&B runs; reading the newest, {files[-1]}")
    return files[-1] if files else None


def _history_rows(jsonl_records: str) -> list[dict]:
    rows = []
    for line in jsonl_records.splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if rec.get("type") != "history":
            continue
        hist = rec["history"]
        item = dict(hist.get("item", {}))
        step = hist.get("step", {}).get("num", item.get("_step", 0))
        row = {"step": int(step), "_time": item.get("_timestamp")}
        row.update({k: v for k, v in item.items() if k not in _WANDB_INTERNAL and not k.startswith("_wandb")})
        rows.append(row)
    return rows


def read_wandb_offline(run_dir: str | os.PathLike, *, fallback: bool = True, timeout: float = 120) -> list[dict]:
    """History rows of the W&B run under `run_dir`, read offline with `wandb leet inspect --json`.

    Rows look like read_jsonl's ({"step", "_time", metrics...}, W&B-internal keys dropped), one per step.
    If there is no .wandb file or the CLI cannot read it: with fallback (default) warn and return the JSONL
    beside it (read_jsonl(run_dir)); without, raise RuntimeError.
    """
    run_dir = Path(run_dir)
    wfile = find_wandb_file(run_dir)
    problem = None
    if wfile is None:
        problem = f"no .wandb file under {run_dir}"
    else:
        try:
            r = subprocess.run(
                [*_wandb_cli(), "--json", str(wfile)],
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
            if r.returncode == 0:
                return _history_rows(r.stdout)
            problem = f"`wandb leet inspect` exited {r.returncode}: {r.stderr.strip()[-500:]}"
        except (OSError, subprocess.SubprocessError, json.JSONDecodeError) as e:
            problem = f"`wandb leet inspect` failed: {e!r}"
    if not fallback:
        raise RuntimeError(problem)
    jsonl_dir = run_dir if run_dir.is_dir() else run_dir.parent
    warnings.warn(f"{problem}; reading the JSONL in {jsonl_dir} instead")
    return read_jsonl(jsonl_dir)


def metric_series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric, sorted by step; the last value logged at a step wins (as in W&B).
    The same for read_jsonl and read_wandb_offline rows."""
    by_step: dict[int, Any] = {}
    for row in rows:
        if key in row and row[key] is not None:
            by_step[int(row["step"])] = row[key]
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]
