"""Rebuild the write-up's figures (NOTES 1) from finished run directories.

    runs = load_runs("runs/*")                         # run dirs, globs, or a runs root
    index = build_figures(runs, "paper_figures")       # PNG + PDF per figure, and figures.json

Figures, one file per setting (task x model preset), one panel per off-policy window:
  reward_<task>_<preset>      rollout_reward/avg_train_reward/mean vs step per arm, EMA-smoothed, raw faint
  validation_<task>_<preset>  validation_reward/_mean vs step (AIME 2025 with task.source=hub, else held-out)
  mismatch_<task>_<preset>    bit_wise/logprob_diff/abs_mean vs step on a log axis, exact zeros on a floor line
                              marked "0 (bitwise)"; second row: the precision / staleness split (ours)
  cost_<task>_<preset>        perf/trainer/tokens_per_second_{full_step,fwd_bwd} per arm (median over steps)
  metric_<key>_<task>_<preset> any extra metric key vs step (`metrics=[...]`)

A run is one directory written by zeromismatch.logging.MetricsLogger: config.json (the resolved run config)
plus metrics.jsonl and/or an offline W&B run under wandb/. Runs are grouped by (task.name, model.preset,
arm, rl.offpolicy), where the arm is numerics.name (bi, bi_chunk, stock), or vllm_native for a stock run
with generator.backend=vllm. Several runs in one group (seeds) are averaged step by step; each run's raw
curve is drawn faint.

Everything draws on matplotlib.figure.Figure objects (no pyplot state), so it works headless and in notebooks.
"""

from __future__ import annotations

import difflib
import glob as globlib
import json
import math
import os
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..logging.metrics import JSONL_NAME, find_wandb_file, read_jsonl, read_wandb_offline, wandb_cli_available

# ----------------------------------------------------------------------------------------------- names

REWARD = "rollout_reward/avg_train_reward/mean"
VALIDATION = "validation_reward/_mean"
MISMATCH = "bit_wise/logprob_diff/abs_mean"
PRECISION = "bit_wise/logprob_diff/precision_abs_mean"
STALENESS = "bit_wise/logprob_diff/staleness_abs_mean"
TPS_FULL = "perf/trainer/tokens_per_second_full_step"
TPS_FWD_BWD = "perf/trainer/tokens_per_second_fwd_bwd"

FIGURES = ("reward", "validation", "mismatch", "cost")
# the metric each figure cannot do without (the others it draws when present)
FIGURE_METRICS = {
    "reward": (REWARD,),
    "validation": (VALIDATION,),
    "mismatch": (MISMATCH, PRECISION, STALENESS),
    "cost": (TPS_FULL, TPS_FWD_BWD),
}
SOURCES = ("jsonl", "wandb", "auto")

ARM_ORDER = ("bi", "bi_chunk", "stock", "vllm_native")
ARM_LABELS = {"bi": "BI", "bi_chunk": "BI-chunk (ours)", "stock": "stock", "vllm_native": "vLLM-native"}
ARM_COLORS = {"bi": "tab:blue", "bi_chunk": "tab:purple", "stock": "tab:orange", "vllm_native": "tab:green"}
_EXTRA_COLORS = ("tab:red", "tab:brown", "tab:pink", "tab:gray", "tab:olive", "tab:cyan")

ZERO_LABEL = "0 (bitwise)"


@lru_cache(maxsize=1)
def _wandb_cli_ok() -> bool:
    """Whether `wandb leet inspect` runs here (asked once per process: it starts a subprocess)."""
    return wandb_cli_available()


class PlotError(RuntimeError):
    """Bad input to the figure builders: no runs, a run without config or metrics, an unknown metric."""


# ------------------------------------------------------------------------------------------------ runs


def _dig(d: Any, dotted: str, default: Any = None) -> Any:
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return default
        d = d[part]
    return default if d is None else d


def arm_of(config: dict) -> str:
    """numerics.name, or vllm_native for stock numerics on the vLLM generator (the write-up's third arm)."""
    numerics = str(_dig(config, "numerics.name", "unknown"))
    backend = str(_dig(config, "generator.backend", "embedded"))
    if backend in ("embedded", ""):
        return numerics
    if numerics == "stock":
        return f"{backend}_native"
    return f"{numerics}+{backend}"


def arm_label(arm: str) -> str:
    return ARM_LABELS.get(arm, arm)


def _arm_sort_key(arm: str) -> tuple:
    return (ARM_ORDER.index(arm), "") if arm in ARM_ORDER else (len(ARM_ORDER), arm)


def arm_color(arm: str, _cache: dict = {}) -> str:  # noqa: B006 - a stable colour per unknown arm
    if arm in ARM_COLORS:
        return ARM_COLORS[arm]
    if arm not in _cache:
        _cache[arm] = _EXTRA_COLORS[len(_cache) % len(_EXTRA_COLORS)]
    return _cache[arm]


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
        return _dig(self.config, "job.name")

    @property
    def numerics(self) -> str:
        return str(_dig(self.config, "numerics.name", "unknown"))

    @property
    def offpolicy(self) -> int | None:
        op = _dig(self.config, "rl.offpolicy")
        return None if op is None else int(op)

    @property
    def preset(self) -> str:
        return str(_dig(self.config, "model.preset", "unknown"))

    @property
    def task(self) -> str:
        return str(_dig(self.config, "task.name", "unknown"))

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
    return (p / "config.json").is_file() or (p / JSONL_NAME).is_file() or any(p.glob("*.jsonl")) or (p / "wandb").is_dir()


def _as_list(runs: Any) -> list:
    if isinstance(runs, (str, os.PathLike, Run)):
        return [runs]
    return list(runs)


def find_run_dirs(runs: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    """Run directories from run dirs, glob patterns (`runs/*`, `runs/**/2026-*math*`) or a runs root (a
    directory that is not itself a run: its run subdirectories). Files a glob matches are ignored.
    Raises PlotError when nothing is found, naming the patterns."""
    specs = [str(s) for s in _as_list(runs)]
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


def load_run(path: str | os.PathLike, source: str = "jsonl") -> Run:
    """Read one run dir. source: jsonl (metrics.jsonl), wandb (the offline .wandb file through `wandb leet
    inspect`; an error if it cannot be read), auto (the .wandb file when present and readable, else the JSONL)."""
    if source not in SOURCES:
        raise PlotError(f"unknown source {source!r}; choose one of {SOURCES}")
    p = Path(path)
    cfg_file = p / "config.json"
    if not cfg_file.is_file():
        raise PlotError(f"run {p} has no config.json (MetricsLogger writes it when the run starts); "
                        "cannot tell its arm")
    try:
        config = json.loads(cfg_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise PlotError(f"{cfg_file}: not JSON ({e})") from e
    has_jsonl = (p / JSONL_NAME).is_file() or any(p.glob("*.jsonl"))
    use = source
    if source == "auto":
        use = "wandb" if find_wandb_file(p) is not None and _wandb_cli_ok() else "jsonl"
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
    items = _as_list(runs)
    ready = [r for r in items if isinstance(r, Run)]
    specs = [r for r in items if not isinstance(r, Run)]
    dirs = find_run_dirs(specs) if specs else []
    ignored = [] if ignored is None else ignored
    out = list(ready)
    for d in dirs:
        try:
            run = load_run(d, source)
        except PlotError as e:
            if strict:
                raise PlotError(f"{e} [strict: job.strict=false / strict=False skips unreadable runs]") from e
            warnings.warn(f"skipping run: {e}")
            ignored.append({"run_dir": str(d), "reason": str(e)})
            continue
        out.append(run)
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


def group_runs(runs: Iterable[Run]) -> dict[GroupKey, list[Run]]:
    """{(task, preset, arm, offpolicy): [runs]} in a stable order (setting, offpolicy, arm)."""
    groups: dict[GroupKey, list[Run]] = {}
    for r in runs:
        groups.setdefault(r.key, []).append(r)
    order = sorted(groups, key=lambda k: (k.task, k.preset, -1 if k.offpolicy is None else k.offpolicy, _arm_sort_key(k.arm)))
    return {k: sorted(groups[k], key=lambda r: str(r.path)) for k in order}


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


# -------------------------------------------------------------------------------------------- helpers


def ema(values: Sequence[float], weight: float) -> np.ndarray:
    """Debiased exponential moving average (W&B / TensorBoard 'smoothing'): weight 0 = raw, 0.99 = very smooth.
    A run of exact zeros stays exactly zero."""
    if not 0.0 <= weight < 1.0:
        raise PlotError(f"ema weight must be in [0, 1), got {weight}")
    v = np.asarray(values, dtype=np.float64)
    if weight == 0.0 or v.size == 0:
        return v.copy()
    out = np.empty_like(v)
    last, n = 0.0, 0
    for i, x in enumerate(v):
        last = last * weight + (1.0 - weight) * x
        n += 1
        out[i] = last / (1.0 - weight**n)
    return out


def mean_series(runs: Sequence[Run], key: str) -> tuple[np.ndarray, np.ndarray]:
    """Step-wise mean over runs (each step averages the runs that logged it)."""
    acc: dict[int, list[float]] = {}
    for r in runs:
        for s, v in zip(*r.series(key)):
            acc.setdefault(int(s), []).append(float(v))
    steps = np.array(sorted(acc), dtype=np.int64)
    return steps, np.array([np.mean(acc[s]) for s in steps], dtype=np.float64)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_") or "x"


def _op_label(op: int | None) -> str:
    return "offpolicy=?" if op is None else f"offpolicy={op}"


def _settings(groups: dict[GroupKey, list[Run]]) -> dict[tuple[str, str], dict[GroupKey, list[Run]]]:
    out: dict[tuple[str, str], dict[GroupKey, list[Run]]] = {}
    for k, rs in groups.items():
        out.setdefault(k.setting, {})[k] = rs
    return out


def _offpolicies(groups: dict[GroupKey, list[Run]]) -> list[int | None]:
    ops = {k.offpolicy for k in groups}
    return sorted(ops, key=lambda o: -1 if o is None else o)


def _new_figure(ncols: int, nrows: int = 1, *, panel=(4.2, 3.2)):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(panel[0] * ncols, 5.0), panel[1] * nrows + 0.4), layout="constrained")  # + legend row
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex="col")
    return fig, axes


def _save(fig, out_dir: Path, stem: str, formats: Sequence[str], dpi: int = 150) -> list[str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for i, fmt in enumerate(formats):
        path = out_dir / f"{stem}.{fmt}"
        kw = {"metadata": {"CreationDate": None}} if fmt == "pdf" else {}
        fig.savefig(path, dpi=dpi, **kw)
        files.append(str(path))
        if i == 0:  # the layout is solved: keep it for the other formats instead of solving it again
            fig.set_layout_engine("none")
    return files


def _record(kind: str, stem: str, files: list[str], metrics: Sequence[str], runs: Iterable[Run], **extra) -> dict:
    return {"kind": kind, "stem": stem, "files": files, "metrics": list(metrics),
            "runs": sorted({str(r.path) for r in runs}), **extra}


def _arm_legend(fig, arms: Iterable[str], extra: Sequence[tuple[str, str]] = (), *, bars: bool = False) -> None:
    """One legend for the whole figure, outside on the right: an entry per arm (colour), then `extra`
    (label, linestyle) entries drawn in black."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    arms = list(arms)
    if bars:
        handles = [Patch(color=arm_color(a)) for a in arms]
    else:
        handles = [Line2D([], [], color=arm_color(a), lw=1.8) for a in arms]
    labels = [arm_label(a) for a in arms]
    for label, ls in extra:
        handles.append(Line2D([], [], color="black", ls=ls, lw=1.4))
        labels.append(label)
    width = fig.get_figwidth()
    ncol = max(1, min(len(handles), int(width // 2.2)))
    fig.legend(handles, labels, loc="outside lower center", ncols=ncol, fontsize=8, frameon=False)


def _arms(groups: dict[GroupKey, list[Run]]) -> list[str]:
    return sorted({k.arm for k in groups}, key=_arm_sort_key)


def _setting_title(setting: tuple[str, str]) -> str:
    return f"{setting[0]} · {setting[1]}"


# ------------------------------------------------------------------------------------ step curves


def _curve_figure(kind, runs, key, out_dir, *, ema_weight, formats, dpi, ylabel, title, stem_prefix, markers=False):
    """One file per setting; one panel per offpolicy; per arm: step-mean over its runs, EMA'd; raw faint."""
    with_key = [r for r in runs if r.has(key)]
    records = []
    for setting, groups in _settings(group_runs(with_key)).items():
        ops = _offpolicies(groups)
        fig, axes = _new_figure(len(ops))
        for j, op in enumerate(ops):
            ax = axes[0, j]
            for gk, rs in groups.items():
                if gk.offpolicy != op:
                    continue
                color = arm_color(gk.arm)
                for r in rs:  # raw, faint
                    s, v = r.series(key)
                    ax.plot(s, v, color=color, alpha=0.25 if ema_weight else 0.35, lw=0.8)
                s, v = mean_series(rs, key)
                ax.plot(s, ema(v, ema_weight), color=color, lw=1.8, marker="o" if markers else None, ms=3)
            ax.set_title(_op_label(op))
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        _arm_legend(fig, _arms(groups))
        axes[0, 0].set_ylabel(ylabel)
        smooth = f", EMA {ema_weight:g} (raw faint)" if ema_weight else ""
        fig.suptitle(f"{title} — {_setting_title(setting)}{smooth}", fontsize=10)
        stem = f"{stem_prefix}_{_slug(setting[0])}_{_slug(setting[1])}"
        files = _save(fig, out_dir, stem, formats, dpi)
        members = [r for rs in groups.values() for r in rs]
        records.append(_record(kind, stem, files, [key], members, ema=ema_weight,
                               groups={f"{k.arm}/op{k.offpolicy}": [str(r.path) for r in v] for k, v in groups.items()}))
    return records


def plot_reward(runs: Sequence[Run], out_dir: str | os.PathLike = "paper_figures", *, ema_weight: float = 0.9,
                formats: Sequence[str] = ("png", "pdf"), dpi: int = 150) -> list[dict]:
    """(a) Train reward vs step per arm (write-up: reward curves, BI / stock / vLLM-native at op4/12/32)."""
    return _curve_figure("reward", runs, REWARD, Path(out_dir), ema_weight=ema_weight, formats=formats, dpi=dpi,
                         ylabel="train reward (rollout mean)", title="Train reward", stem_prefix="reward")


def plot_validation(runs: Sequence[Run], out_dir: str | os.PathLike = "paper_figures", *, ema_weight: float = 0.0,
                    formats: Sequence[str] = ("png", "pdf"), dpi: int = 150) -> list[dict]:
    """(b) Held-out / AIME 2025 accuracy vs step (write-up: AIME25 eval every 10 steps). Not smoothed by default."""
    with_key = [r for r in runs if r.has(VALIDATION)]
    hub = bool(with_key) and all(_dig(r.config, "task.source") == "hub" and r.task == "math" for r in with_key)
    ylabel = "AIME 2025 accuracy" if hub else "held-out accuracy"
    return _curve_figure("validation", runs, VALIDATION, Path(out_dir), ema_weight=ema_weight, formats=formats, dpi=dpi,
                         ylabel=ylabel, title=f"Validation ({VALIDATION})", stem_prefix="validation", markers=True)


def plot_metric(runs: Sequence[Run], key: str, out_dir: str | os.PathLike = "paper_figures", *, ema_weight: float = 0.0,
                formats: Sequence[str] = ("png", "pdf"), dpi: int = 150) -> list[dict]:
    """Any logged metric vs step per arm; PlotError if no run logged it."""
    check_metric(runs, key)
    return _curve_figure("metric", runs, key, Path(out_dir), ema_weight=ema_weight, formats=formats, dpi=dpi, ylabel=key,
                         title=key, stem_prefix=f"metric_{_slug(key)}")


# --------------------------------------------------------------------------------------- mismatch


def log_floor(arrays: Iterable[np.ndarray]) -> float:
    """A y value one decade below the smallest positive value: where exact zeros are drawn on a log axis."""
    pos = [a[a > 0].min() for a in arrays if a.size and (a > 0).any()]
    if not pos:
        return 1e-7
    return 10.0 ** (math.floor(math.log10(min(pos))) - 1)


def _plot_log(ax, steps, values, floor, *, color, ls="-", lw=1.8, alpha=1.0, label=None, zero_markers=True) -> bool:
    """Plot on a log axis with values <= 0 drawn at `floor`. Returns whether any exact zero was drawn."""
    zero = values <= 0
    ax.plot(steps, np.where(zero, floor, values), color=color, ls=ls, lw=lw, alpha=alpha, label=label)
    if zero_markers and zero.any():
        ax.plot(steps[zero], np.full(int(zero.sum()), floor), ls="none", marker="o", ms=4, mfc="white",
                mec=color, alpha=alpha, clip_on=False, zorder=5)
    return bool(zero.any())


def _mark_floor(ax, floor: float) -> None:
    """Dotted floor line, annotated, and its tick labelled 0 (no data lies within a decade above it)."""
    from matplotlib.ticker import FuncFormatter, LogFormatterSciNotation, LogLocator

    ax.axhline(floor, color="0.35", ls=":", lw=1.0, zorder=1)
    ax.annotate(ZERO_LABEL, xy=(0.98, floor), xycoords=("axes fraction", "data"), xytext=(0, -3),
                textcoords="offset points", fontsize=8, color="0.2", ha="right", va="top")
    base = LogFormatterSciNotation()
    base.set_axis(ax.yaxis)

    def fmt(y, pos=None):
        return "0" if math.isclose(y, floor, rel_tol=1e-9) else base(y, pos)

    ax.yaxis.set_major_locator(LogLocator(base=10.0, numticks=20))  # every decade, so the floor gets its tick
    ax.yaxis.set_major_formatter(FuncFormatter(fmt))


def plot_mismatch(runs: Sequence[Run], out_dir: str | os.PathLike = "paper_figures", *, ema_weight: float = 0.0,
                  formats: Sequence[str] = ("png", "pdf"), dpi: int = 150) -> list[dict]:
    """(c) bit_wise/logprob_diff/abs_mean vs step, log y (write-up: the logprob mismatch figure). Exact zeros
    (BI at step 0 / on-policy) are drawn on a dotted floor line a decade below the smallest positive value,
    annotated "0 (bitwise)". Second row (ours, when logged): the precision part (t_old - gen, solid) and the
    staleness part (t_cur - t_old, dashed) of the same gap. Smoothing (ema_weight) applies to the lines;
    the zero markers are always the raw values."""
    out_dir = Path(out_dir)
    with_key = [r for r in runs if r.has(MISMATCH)]
    records = []
    for setting, groups in _settings(group_runs(with_key)).items():
        ops = _offpolicies(groups)
        members = [r for rs in groups.values() for r in rs]
        split = any(r.has(PRECISION) or r.has(STALENESS) for r in members)
        keys = [MISMATCH] + ([PRECISION, STALENESS] if split else [])
        floor = log_floor(r.series(k)[1] for r in members for k in keys)
        top = max((float(r.series(k)[1].max()) for r in members for k in keys if r.series(k)[1].size), default=floor)
        top = max(top, floor * 10) * 2.0  # one y range for every panel: arms and windows compare at a glance
        fig, axes = _new_figure(len(ops), 2 if split else 1)
        zeros_at: set[int] = set()
        for j, op in enumerate(ops):
            for row, row_keys in enumerate([[MISMATCH]] + ([[PRECISION, STALENESS]] if split else [])):
                ax = axes[row, j]
                ax.set_yscale("log")
                any_zero = False
                for gk, rs in groups.items():
                    if gk.offpolicy != op:
                        continue
                    color = arm_color(gk.arm)
                    for key in row_keys:
                        if not any(r.has(key) for r in rs):
                            continue
                        ls = "--" if key == STALENESS else "-"
                        if ema_weight:
                            for r in rs:
                                s, v = r.series(key)
                                any_zero |= _plot_log(ax, s, v, floor, color=color, ls=ls, lw=0.8, alpha=0.25)
                        s, v = mean_series(rs, key)
                        any_zero |= _plot_log(ax, s, ema(v, ema_weight), floor, color=color, ls=ls,
                                              zero_markers=not ema_weight)
                        if ema_weight:  # zero markers from the raw mean, not the smoothed line
                            z = v <= 0
                            if z.any():
                                ax.plot(s[z], np.full(int(z.sum()), floor), ls="none", marker="o", ms=4, mfc="white",
                                        mec=color, clip_on=False, zorder=5)
                                any_zero = True
                if any_zero:
                    _mark_floor(ax, floor)
                    zeros_at.add(row)
                ax.set_ylim(floor / 4.0, top)
                ax.grid(alpha=0.3, lw=0.5)
                if row == 0:
                    ax.set_title(_op_label(op))
                if row == len(axes) - 1:
                    ax.set_xlabel("step")
        axes[0, 0].set_ylabel("|trainer − generator| logprob\n(abs_mean, token-weighted)")
        extra = []
        if split:
            axes[1, 0].set_ylabel("split of the same gap\n(abs_mean)")
            extra = [("precision: t_old − gen", "-"), ("staleness: t_cur − t_old", "--")]
        _arm_legend(fig, _arms(groups), extra)
        smooth = f", EMA {ema_weight:g}" if ema_weight else ""
        fig.suptitle(f"Logprob mismatch — {_setting_title(setting)}{smooth}", fontsize=10)
        stem = f"mismatch_{_slug(setting[0])}_{_slug(setting[1])}"
        files = _save(fig, out_dir, stem, formats, dpi)
        records.append(_record("mismatch", stem, files, keys, members, ema=ema_weight, zero_floor=floor,
                               exact_zeros_drawn=sorted(zeros_at), split=split,
                               groups={f"{k.arm}/op{k.offpolicy}": [str(r.path) for r in v] for k, v in groups.items()}))
    return records


# ------------------------------------------------------------------------------------------- cost


def _run_median(r: Run, key: str) -> float | None:
    _, v = r.series(key)
    return float(np.median(v)) if v.size else None


def cost_table(runs: Sequence[Run]) -> list[dict]:
    """Per group: median over steps of each trainer throughput metric, averaged over the group's runs."""
    rows = []
    for gk, rs in group_runs(runs).items():
        row = {"task": gk.task, "preset": gk.preset, "arm": gk.arm, "offpolicy": gk.offpolicy, "n_runs": len(rs)}
        for key in (TPS_FULL, TPS_FWD_BWD):
            meds = [m for m in (_run_median(r, key) for r in rs) if m is not None]
            row[key] = float(np.mean(meds)) if meds else None
            row[key + ":min"] = min(meds) if meds else None
            row[key + ":max"] = max(meds) if meds else None
        rows.append(row)
    return rows


def _fmt_tps(v: float) -> str:
    return f"{v / 1e3:.1f}k" if v >= 1e3 else f"{v:.0f}"


def plot_cost(runs: Sequence[Run], out_dir: str | os.PathLike = "paper_figures", *,
              formats: Sequence[str] = ("png", "pdf"), dpi: int = 150) -> list[dict]:
    """(d) Trainer tokens/s per arm, full step (incl. waiting for rollouts) and fwd/bwd only, as bars grouped
    by offpolicy (write-up: 8.4k vs 14.5k tokens/s at op12, etc.). Bar = median over the run's steps (mean
    over runs of a group, min-max whiskers); labels give the value and the ratio to the stock arm."""
    out_dir = Path(out_dir)
    with_key = [r for r in runs if r.has(TPS_FULL) or r.has(TPS_FWD_BWD)]
    table = cost_table(with_key)
    records = []
    by_setting: dict[tuple[str, str], list[dict]] = {}
    for row in table:
        by_setting.setdefault((row["task"], row["preset"]), []).append(row)
    for setting, rows in by_setting.items():
        ops = sorted({r["offpolicy"] for r in rows}, key=lambda o: -1 if o is None else o)
        arms = sorted({r["arm"] for r in rows}, key=_arm_sort_key)
        fig, axes = _new_figure(2, panel=(min(12.0, max(4.5, 0.5 * len(ops) * len(arms) + 1.5)), 3.6))
        width = 0.8 / len(arms)
        for ax, key, title in ((axes[0, 0], TPS_FULL, "full step (incl. waiting)"), (axes[0, 1], TPS_FWD_BWD, "fwd/bwd")):
            for i, arm in enumerate(arms):
                for x, op in enumerate(ops):
                    row = next((r for r in rows if r["arm"] == arm and r["offpolicy"] == op), None)
                    if row is None or row[key] is None:
                        continue
                    v = row[key]
                    pos = x - 0.4 + width * (i + 0.5)
                    err = None
                    if row["n_runs"] > 1:
                        err = [[v - row[key + ":min"]], [row[key + ":max"] - v]]
                    ax.bar(pos, v, width=width * 0.95, color=arm_color(arm), yerr=err, capsize=2)
                    text = _fmt_tps(v)
                    ref = next((r for r in rows if r["arm"] == "stock" and r["offpolicy"] == op), None)
                    if ref and ref[key] and arm != "stock":
                        text += f"\n{v / ref[key]:.2f}×"
                    ax.annotate(text, (pos, v), xytext=(0, 2), textcoords="offset points", ha="center", va="bottom", fontsize=7)
            ax.set_xticks(range(len(ops)), [_op_label(o) for o in ops])
            ax.set_title(f"trainer tokens/s, {title}", fontsize=9)
            ax.grid(alpha=0.3, axis="y")
            ax.margins(y=0.2)
        _arm_legend(fig, arms, bars=True)
        axes[0, 0].set_ylabel("tokens / s (median over steps)")
        fig.suptitle(f"Trainer cost — {_setting_title(setting)} (ratio vs stock under each value)", fontsize=10)
        stem = f"cost_{_slug(setting[0])}_{_slug(setting[1])}"
        files = _save(fig, out_dir, stem, formats, dpi)
        members = [r for r in with_key if r.key.setting == setting]
        records.append(_record("cost", stem, files, [TPS_FULL, TPS_FWD_BWD], members, table=rows))
    return records


# ------------------------------------------------------------------------------------------ driver

PLOTTERS = {"reward": plot_reward, "validation": plot_validation, "mismatch": plot_mismatch, "cost": plot_cost}


def resolve_figures(figures: str | Sequence[str] | None) -> tuple[list[str], bool]:
    """('all' | None | names) -> (names, explicit). Unknown names raise PlotError."""
    if figures is None or figures == "all" or (not isinstance(figures, str) and list(figures) == ["all"]):
        return list(FIGURES), False
    names = [figures] if isinstance(figures, str) else list(figures)
    bad = [n for n in names if n not in PLOTTERS]
    if bad:
        raise PlotError(f"unknown figure(s) {bad}; choose from {list(FIGURES)} or 'all'")
    return names, True


def build_figures(
    runs: Any,
    out_dir: str | os.PathLike = "paper_figures",
    *,
    source: str = "jsonl",
    figures: str | Sequence[str] | None = "all",
    metrics: Sequence[str] = (),
    ema_weight: float = 0.9,
    mismatch_ema: float = 0.0,
    formats: Sequence[str] = ("png", "pdf"),
    dpi: int = 150,
    jobs: Sequence[str] | None = ("rl",),
    strict: bool = True,
) -> dict:
    """Load runs (see load_runs), draw the requested figures into out_dir, write out_dir/figures.json and
    return that index: {figures: {stem: {kind, files, metrics, runs, ...}}, runs: [...], skipped: {...},
    ignored_runs: [...]}. With figures='all' a figure whose metrics no run logged is skipped (noted in
    the index); a figure named explicitly, or an extra metric in `metrics`, that no run logged is a PlotError."""
    names, explicit = resolve_figures(figures)
    if not formats:
        raise PlotError("formats is empty; use e.g. ['png', 'pdf']")
    ignored: list[dict] = []
    loaded = load_runs(runs, source, jobs=jobs, strict=strict, ignored=ignored)
    for key in metrics:
        check_metric(loaded, key)
    out = Path(out_dir)
    index: dict[str, Any] = {
        "generated_by": "zeromismatch.plots.figures.build_figures",
        "runs_spec": [str(r.path) if isinstance(r, Run) else str(r) for r in _as_list(runs)],
        "source": source,
        "ema": ema_weight,
        "mismatch_ema": mismatch_ema,
        "formats": list(formats),
        "runs": [r.describe() for r in loaded],
        "groups": {f"{k.task}/{k.preset}/{k.arm}/op{k.offpolicy}": [str(r.path) for r in v] for k, v in group_runs(loaded).items()},
        "figures": {},
        "skipped": {},
        "ignored_runs": ignored,
    }
    logged = known_metrics(loaded)
    todo = []
    for name in names:
        needed = FIGURE_METRICS[name] if name == "cost" else FIGURE_METRICS[name][:1]
        if any(k in logged for k in needed):
            todo.append(name)
        elif explicit:
            check_metric(loaded, needed[0])  # raises, naming the closest metrics the runs did log
        else:
            index["skipped"][name] = f"no run logged {' or '.join(needed)}"
    for name in todo:
        if name == "reward":
            recs = plot_reward(loaded, out, ema_weight=ema_weight, formats=formats, dpi=dpi)
        elif name == "validation":
            recs = plot_validation(loaded, out, formats=formats, dpi=dpi)
        elif name == "mismatch":
            recs = plot_mismatch(loaded, out, ema_weight=mismatch_ema, formats=formats, dpi=dpi)
        else:
            recs = plot_cost(loaded, out, formats=formats, dpi=dpi)
        for rec in recs:
            index["figures"][rec["stem"]] = rec
    for key in metrics:
        for rec in plot_metric(loaded, key, out, ema_weight=ema_weight, formats=formats, dpi=dpi):
            index["figures"][rec["stem"]] = rec
    out.mkdir(parents=True, exist_ok=True)
    index_path = out / "figures.json"
    index_path.write_text(json.dumps(index, indent=2, default=_json_default) + "\n", encoding="utf-8")
    index["index_path"] = str(index_path)
    return index


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def written_files(index: dict) -> list[str]:
    """Every file build_figures wrote (figures, then the index)."""
    files = [f for rec in index["figures"].values() for f in rec["files"]]
    return files + ([index["index_path"]] if "index_path" in index else [])
