"""Finding and reading run directories, telling each run's arm, and grouping runs for the figures.

A run is one directory written by zeromismatch.logging.MetricsLogger: config.json (the resolved run config)
plus metrics.jsonl and/or an offline W&B run under wandb/. Runs are grouped by (task.name, model.preset,
arm, rl.offpolicy), where the arm is numerics.name (bi, bi_chunk, stock), or vllm_native for a run with
generator.backend=vllm_native. Several runs in one group (seeds) are averaged step by step by the figures.
"""

from __future__ import annotations

import difflib
import glob as globlib
import json
import os
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..logging.metrics import JSONL_NAME, find_wandb_file, read_jsonl, read_wandb_offline, wandb_cli_available
from ..logging.run_dir import STATUS_NAME, read_status

SOURCES = ("jsonl", "wandb", "auto")
# the order arms are listed, drawn and coloured in (other arms follow, alphabetically)
ARM_ORDER = ("bi", "bi_chunk", "stock", "vllm_native")


class PlotError(RuntimeError):
    """Bad input to the figure builders: no runs, a run without config or metrics, an unknown metric."""


@lru_cache(maxsize=1)
def wandb_cli_ok() -> bool:
    """Whether `wandb leet inspect` runs here (asked once per process: it starts a subprocess)."""
    return wandb_cli_available()


def config_value(config: Any, dotted: str, default: Any = None) -> Any:
    """config["a"]["b"] for "a.b"; `default` when a key is missing or the value is None."""
    for part in dotted.split("."):
        if not isinstance(config, dict) or part not in config:
            return default
        config = config[part]
    return default if config is None else config


def arm_of(config: dict) -> str:
    """numerics.name (our model, on the embedded engine or inside vLLM: the same arithmetic), or vllm_native for
    vLLM's own model (generator.backend=vllm_native, the write-up's third arm)."""
    numerics = str(config_value(config, "numerics.name", "unknown"))
    backend = str(config_value(config, "generator.backend", "embedded"))
    if backend in ("embedded", "", "vllm"):
        return numerics
    return backend


def arm_sort_key(arm: str) -> tuple:
    return (ARM_ORDER.index(arm), "") if arm in ARM_ORDER else (len(ARM_ORDER), arm)


class GroupKey(NamedTuple):
    task: str
    preset: str
    arm: str
    offpolicy: int | None

    @property
    def setting(self) -> tuple[str, str]:
        return (self.task, self.preset)


@dataclass
class Run:
    """One run directory: its config.json and its metric rows (from `source`)."""

    path: Path
    config: dict
    rows: list[dict] = field(repr=False)
    source: str  # jsonl | wandb: where the rows came from

    @property
    def name(self) -> str:
        return str(self.config.get("run_name") or self.path.name)

    @property
    def job(self) -> str | None:
        return config_value(self.config, "job.name")

    @property
    def numerics(self) -> str:
        return str(config_value(self.config, "numerics.name", "unknown"))

    @property
    def offpolicy(self) -> int | None:
        op = config_value(self.config, "rl.offpolicy")
        return None if op is None else int(op)

    @property
    def preset(self) -> str:
        return str(config_value(self.config, "model.preset", "unknown"))

    @property
    def task(self) -> str:
        return str(config_value(self.config, "task.name", "unknown"))

    @property
    def arm(self) -> str:
        return arm_of(self.config)

    @property
    def key(self) -> GroupKey:
        return GroupKey(self.task, self.preset, self.arm, self.offpolicy)

    @cached_property
    def metric_keys(self) -> frozenset[str]:
        return frozenset(k for row in self.rows for k in row if k not in ("step", "_time"))

    def has(self, key: str) -> bool:
        return key in self.metric_keys

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of a metric, sorted by step, last value per step wins, non-finite values dropped."""
        by_step: dict[int, float] = {}
        for row in self.rows:
            v = row.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            by_step[int(row["step"])] = float(v)
        steps = np.array(sorted(by_step), dtype=np.int64)
        vals = np.array([by_step[s] for s in steps], dtype=np.float64)
        ok = np.isfinite(vals)
        return steps[ok], vals[ok]

    def describe(self) -> dict:
        return {
            "run_dir": str(self.path),
            "run_name": self.name,
            "job": self.job,
            "arm": self.arm,
            "numerics": self.numerics,
            "offpolicy": self.offpolicy,
            "preset": self.preset,
            "task": self.task,
            "source": self.source,
            "rows": len(self.rows),
        }


def _is_run_dir(p: Path) -> bool:
    return ((p / "config.json").is_file() or (p / JSONL_NAME).is_file() or any(p.glob("*.jsonl"))
            or (p / "wandb").is_dir() or (p / STATUS_NAME).is_file())


def _unusable_reason(p: Path) -> str | None:
    """Why a run dir holds nothing to plot: it failed (status.json), or it stopped before its first metric."""
    status = read_status(p)
    if status is None:
        return None
    if status.get("status") == "failed":
        return f"run {p} failed: {status.get('error', 'no error recorded')}"
    if status.get("status") != "completed" and not any(p.glob("*.jsonl")) and find_wandb_file(p) is None:
        return f"run {p} is {status.get('status')} and has no metrics"
    return None


def as_list(runs: Any) -> list:
    """One run spec (a path or a Run) or an iterable of them -> a list."""
    if isinstance(runs, (str, os.PathLike, Run)):
        return [runs]
    return list(runs)


def find_run_dirs(runs: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    """Run directories from run dirs, glob patterns (`runs/*`, `runs/**/2026-*math*`) or a runs root (a
    directory that is not itself a run: its run subdirectories). Files a glob matches are ignored; runs that
    failed or stopped before their first metric (status.json) are skipped with a warning.
    Raises PlotError when nothing is found, naming the patterns."""
    specs = [str(s) for s in as_list(runs)]
    if not specs:
        raise PlotError("no runs given: pass run dirs, a glob such as 'runs/*', or a runs root")
    found: list[Path] = []
    empty: list[str] = []
    for spec in specs:
        pattern = os.path.expanduser(spec)
        if globlib.has_magic(pattern):
            matches = sorted(globlib.glob(pattern, recursive=True))
        elif Path(pattern).is_dir():
            matches = [pattern]
        else:
            raise PlotError(f"run dir {spec!r} does not exist (relative to {os.getcwd()})")
        n_before = len(found)
        for m in matches:
            p = Path(m)
            if not p.is_dir():
                continue
            if _is_run_dir(p):
                found.append(p)
            else:  # a runs root: its run subdirectories
                found.extend(sorted(c for c in p.iterdir() if c.is_dir() and _is_run_dir(c)))
        if len(found) == n_before:
            empty.append(spec)
    seen, out = set(), []
    for p in found:
        reason = _unusable_reason(p)
        if reason is not None:
            warnings.warn(f"skipping {reason}")
            continue
        r = p.resolve()
        if r not in seen:
            seen.add(r)
            out.append(p)
    if not out:
        raise PlotError(f"no run directories found for {specs} (relative to {os.getcwd()}); a run dir holds "
                        f"config.json and {JSONL_NAME} (or wandb/), as written by MetricsLogger")
    for spec in empty:
        warnings.warn(f"{spec!r} matched no run directories")
    return out


ARM_KEYS = ("numerics.name", "rl.offpolicy", "model.preset", "task.name")  # what groups a run (GroupKey)
HYDRA_CONFIG = Path(".hydra") / "config.yaml"


def read_run_config(p: Path) -> dict:
    """The run's config: config.json (MetricsLogger writes it when the run starts), else the config Hydra saved
    in the run folder (.hydra/config.yaml, interpolations resolved where they can be). PlotError naming the
    folder, what it holds and what is missing when neither is there."""
    cfg_file = p / "config.json"
    if cfg_file.is_file():
        try:
            return json.loads(cfg_file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise PlotError(f"{cfg_file}: not JSON ({e})") from e
    if (p / HYDRA_CONFIG).is_file():
        try:
            cfg = OmegaConf.load(p / HYDRA_CONFIG)
            try:
                return OmegaConf.to_container(cfg, resolve=True)
            except OmegaConfBaseException:  # e.g. ${now:...} outside Hydra: the keys that group runs are plain
                return OmegaConf.to_container(cfg, resolve=False)
        except (OmegaConfBaseException, OSError, ValueError) as e:
            raise PlotError(f"{p / HYDRA_CONFIG}: unreadable ({e})") from e
    held = sorted(c.name for c in p.iterdir())[:6]
    raise PlotError(f"run {p} holds {', '.join(held) or 'nothing'} but no config.json and no {HYDRA_CONFIG}: cannot "
                    f"tell its arm ({', '.join(ARM_KEYS)}); put the run's config.json beside its metrics")


def load_run(path: str | os.PathLike, source: str = "jsonl") -> Run:
    """Read one run dir. source: jsonl (metrics.jsonl), wandb (the offline .wandb file through `wandb leet
    inspect`; an error if it cannot be read), auto (the .wandb file when present and readable, else the JSONL)."""
    if source not in SOURCES:
        raise PlotError(f"unknown source {source!r}; choose one of {SOURCES}")
    p = Path(path)
    config = read_run_config(p)
    has_jsonl = (p / JSONL_NAME).is_file() or any(p.glob("*.jsonl"))
    use = source
    if source == "auto":
        use = "wandb" if find_wandb_file(p) is not None and wandb_cli_ok() else "jsonl"
    if use == "wandb":
        if find_wandb_file(p) is None:
            raise PlotError(f"run {p} has no offline W&B run (no .wandb file under it); use source=jsonl")
        try:
            rows = read_wandb_offline(p, fallback=False)
        except RuntimeError as e:
            if source != "auto" or not has_jsonl:
                raise PlotError(f"run {p}: cannot read its W&B file offline: {e}") from e
            warnings.warn(f"run {p}: cannot read its W&B file offline ({e}); reading {JSONL_NAME}")
            use = "jsonl"
    if use == "jsonl":
        if not has_jsonl:
            hint = "; it has a W&B run: try source=wandb" if find_wandb_file(p) is not None else ""
            raise PlotError(f"run {p} has no {JSONL_NAME}{hint}")
        try:
            rows = read_jsonl(p)
        except (FileNotFoundError, ValueError) as e:
            raise PlotError(f"run {p}: {e}") from e
    if not rows:
        raise PlotError(f"run {p} has no metrics ({use} source is empty)")
    return Run(p, config, rows, use)


def load_runs(
    runs: Any,
    source: str = "jsonl",
    *,
    jobs: Sequence[str] | None = ("rl",),
    strict: bool = True,
    ignored: list[dict] | None = None,
) -> list[Run]:
    """Find and read runs. `runs`: run dirs, globs, a runs root, or Run objects (kept as they are).
    jobs: keep runs whose config job.name is one of these (None or empty: all); runs of other jobs (smoke,
    sft, parity) are left out. strict=False skips unreadable runs with a warning instead of raising.
    `ignored`, when given, collects {run_dir, reason} for every run left out."""
    items = as_list(runs)
    ready = [r for r in items if isinstance(r, Run)]
    specs = [r for r in items if not isinstance(r, Run)]
    dirs = find_run_dirs(specs) if specs else []
    ignored = [] if ignored is None else ignored
    out = list(ready)
    unreadable: list[str] = []
    for d in dirs:
        try:
            run = load_run(d, source)
        except PlotError as e:
            if strict:
                unreadable.append(str(e))
                continue
            warnings.warn(f"skipping run: {e}")
            ignored.append({"run_dir": str(d), "reason": str(e)})
            continue
        out.append(run)
    if unreadable:  # every unreadable folder in one line, not only the first
        head = f"{len(unreadable)} of {len(dirs)} run folders unreadable: " if len(unreadable) > 1 else ""
        raise PlotError(f"{head}{'; '.join(unreadable)} [strict: job.strict=false / strict=False skips unreadable runs]")
    if jobs:
        kept = []
        for r in out:
            if r.job is None or r.job in jobs:
                kept.append(r)
            else:
                ignored.append({"run_dir": str(r.path), "reason": f"job {r.job!r} not in jobs={list(jobs)}"})
        out = kept
    if not out:
        why = "; ".join(f"{i['run_dir']}: {i['reason']}" for i in ignored[:5])
        raise PlotError(f"no usable runs in {[str(s) for s in specs] or 'the given runs'}" + (f" ({why})" if why else ""))
    return out


# ------------------------------------------------------------------------------------------- grouping


def group_runs(runs: Iterable[Run]) -> dict[GroupKey, list[Run]]:
    """{(task, preset, arm, offpolicy): [runs]} in a stable order (setting, offpolicy, arm)."""
    groups: dict[GroupKey, list[Run]] = {}
    for r in runs:
        groups.setdefault(r.key, []).append(r)
    order = sorted(groups, key=lambda k: (k.task, k.preset, -1 if k.offpolicy is None else k.offpolicy, arm_sort_key(k.arm)))
    return {k: sorted(groups[k], key=lambda r: str(r.path)) for k in order}


def by_setting(groups: dict[GroupKey, list[Run]]) -> dict[tuple[str, str], dict[GroupKey, list[Run]]]:
    """Groups split per setting (task, preset): each setting gets its own figure file."""
    out: dict[tuple[str, str], dict[GroupKey, list[Run]]] = {}
    for k, rs in groups.items():
        out.setdefault(k.setting, {})[k] = rs
    return out


def offpolicies_of(groups: dict[GroupKey, list[Run]]) -> list[int | None]:
    """The off-policy windows present, ascending (unknown first): one panel each."""
    ops = {k.offpolicy for k in groups}
    return sorted(ops, key=lambda o: -1 if o is None else o)


def arms_of(groups: dict[GroupKey, list[Run]]) -> list[str]:
    return sorted({k.arm for k in groups}, key=arm_sort_key)


def known_metrics(runs: Iterable[Run]) -> set[str]:
    out: set[str] = set()
    for r in runs:
        out |= r.metric_keys
    return out


def check_metric(runs: Sequence[Run], key: str) -> None:
    """PlotError if no run logged `key`, with the closest names they did log."""
    keys = known_metrics(runs)
    if key in keys:
        return
    close = difflib.get_close_matches(key, sorted(keys), n=5, cutoff=0.5)
    hint = f"; closest: {close}" if close else f"; they log {len(keys)} metrics, e.g. {sorted(keys)[:8]}"
    raise PlotError(f"unknown metric {key!r}: none of the {len(runs)} runs logged it{hint}")
