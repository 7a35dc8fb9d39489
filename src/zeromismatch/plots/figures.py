"""Rebuild the write-up's figures from finished run directories.

    runs = load_runs("runs/*")                         # run dirs, globs, or a runs root
    index = build_figures(runs, "paper_figures")       # PNG + PDF per figure, and figures.json

Figures, one file per setting (task x model preset), one panel per off-policy window; per arm the mean over
its runs (seeds) with the seeds' range shaded, every logged point visible:
  reward_<task>_<preset>      rollout_reward/avg_train_reward/mean vs step per arm, EMA-smoothed, raw faint
  validation_<task>_<preset>  validation_reward/_mean vs step (AIME 2025 with task.source=hub, else held-out)
  mismatch_<task>_<preset>    bit_wise/logprob_diff/abs_mean vs step on a log axis, exact zeros on a floor line
                              marked "0 (bitwise)"; second row: the precision / staleness split (ours)
  cost_<task>_<preset>        perf/trainer/tokens_per_second_{full_step,fwd_bwd} per arm (median over steps)
  throughput_<task>_<preset>  perf/trainer/tokens_per_second_full_step vs step per arm
  metric_<key>_<task>_<preset> any extra metric key vs step (`metrics=[...]`)

Where each part lives: runs.py (finding, reading and grouping runs), smoothing.py (step means, EMA),
drawing.py (colours, panels, legend, saving), curves.py / mismatch.py / cost.py (the figure families).
This module is the driver: it picks the figures, draws them and writes the figures.json index.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .cost import TPS_FULL, TPS_FWD_BWD, plot_cost
from .curves import REWARD, VALIDATION, plot_metric, plot_reward, plot_throughput, plot_validation
from .mismatch import MISMATCH, PRECISION, STALENESS, plot_mismatch
from .runs import PlotError, Run, as_list, check_metric, group_runs, known_metrics, load_runs

FIGURES = ("reward", "validation", "mismatch", "cost", "throughput")
# the metric each figure cannot do without (the others it draws when present)
FIGURE_METRICS = {
    "reward": (REWARD,),
    "validation": (VALIDATION,),
    "mismatch": (MISMATCH, PRECISION, STALENESS),
    "cost": (TPS_FULL, TPS_FWD_BWD),
    "throughput": (TPS_FULL,),
}
PLOTTERS = {"reward": plot_reward, "validation": plot_validation, "mismatch": plot_mismatch, "cost": plot_cost,
            "throughput": plot_throughput}


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
        "runs_spec": [str(r.path) if isinstance(r, Run) else str(r) for r in as_list(runs)],
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
        elif name == "throughput":
            recs = plot_throughput(loaded, out, ema_weight=ema_weight, formats=formats, dpi=dpi)
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
