"""Step-curve figures: train reward, validation accuracy, and any other logged metric vs step.

One file per setting (task x preset), one panel per off-policy window; per arm the step-mean over its runs
(seeds), each run EMA-smoothed first, with the seeds' range shaded; a single run's raw curve is drawn faint
under its smoothed one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from .cost import TPS_FULL
from .drawing import (
    arm_color,
    draw_curve,
    arm_legend,
    figure_record,
    group_paths,
    new_figure,
    op_label,
    save_figure,
    setting_title,
    slug,
    suptitle,
)
from .runs import Run, arms_of, by_setting, check_metric, config_value, group_runs, offpolicies_of
from .smoothing import seed_band

REWARD = "rollout_reward/avg_train_reward/mean"
VALIDATION = "validation_reward/_mean"


def curve_figure(kind, runs, key, out_dir, *, ema_weight, formats, dpi, ylabel, title, stem_prefix, markers=False):
    """One file per setting; one panel per offpolicy; per arm: step-mean over its runs, EMA'd; raw faint."""
    with_key = [r for r in runs if r.has(key)]
    records = []
    for setting, groups in by_setting(group_runs(with_key)).items():
        ops = offpolicies_of(groups)
        fig, axes = new_figure(len(ops))
        for j, op in enumerate(ops):
            ax = axes[0, j]
            for gk, rs in groups.items():
                if gk.offpolicy != op:
                    continue
                color = arm_color(gk.arm)
                if len(rs) == 1 and ema_weight:  # one run: its raw curve, faint, under the smoothed one
                    s, v = rs[0].series(key)
                    ax.plot(s, v, color=color, alpha=0.25, lw=0.8)
                s, v, lo, hi = seed_band(rs, key, ema_weight)
                draw_curve(ax, s, v, color=color, low=lo, high=hi, markers=markers)
            ax.set_title(op_label(op))
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        arm_legend(fig, arms_of(groups))
        axes[0, 0].set_ylabel(ylabel)
        n_runs = sorted({len(rs) for rs in groups.values()})
        seeds = f"; mean of {'/'.join(map(str, n_runs))} seeds, range shaded" if max(n_runs) > 1 else ""
        smooth = f", EMA {ema_weight:g}" if ema_weight else ""
        suptitle(fig, f"{title} — {setting_title(setting)}{smooth}{seeds}")
        stem = f"{stem_prefix}_{slug(setting[0])}_{slug(setting[1])}"
        files = save_figure(fig, out_dir, stem, formats, dpi)
        members = [r for rs in groups.values() for r in rs]
        records.append(figure_record(kind, stem, files, [key], members, ema=ema_weight, groups=group_paths(groups)))
    return records


def plot_reward(runs: Sequence[Run], out_dir: str | os.PathLike = "paper_figures", *, ema_weight: float = 0.9,
                formats: Sequence[str] = ("png", "pdf"), dpi: int = 150) -> list[dict]:
    """(a) Train reward vs step per arm (write-up: reward curves, BI / stock / vLLM-native at op4/12/32)."""
    return curve_figure("reward", runs, REWARD, Path(out_dir), ema_weight=ema_weight, formats=formats, dpi=dpi,
                        ylabel="train reward (rollout mean)", title="Train reward", stem_prefix="reward")


def plot_validation(runs: Sequence[Run], out_dir: str | os.PathLike = "paper_figures", *, ema_weight: float = 0.0,
                    formats: Sequence[str] = ("png", "pdf"), dpi: int = 150) -> list[dict]:
    """(b) Held-out / AIME 2025 accuracy vs step (write-up: AIME25 eval every 10 steps). Not smoothed by default."""
    with_key = [r for r in runs if r.has(VALIDATION)]
    hub = bool(with_key) and all(config_value(r.config, "task.source") == "hub" and r.task == "math" for r in with_key)
    ylabel = "AIME 2025 accuracy" if hub else "held-out accuracy"
    return curve_figure("validation", runs, VALIDATION, Path(out_dir), ema_weight=ema_weight, formats=formats, dpi=dpi,
                        ylabel=ylabel, title=f"Validation ({VALIDATION})", stem_prefix="validation", markers=True)


def plot_throughput(runs: Sequence[Run], out_dir: str | os.PathLike = "paper_figures", *, ema_weight: float = 0.9,
                    formats: Sequence[str] = ("png", "pdf"), dpi: int = 150) -> list[dict]:
    """(d') Trainer tokens/s of the full step (incl. waiting for rollouts) vs step per arm (write-up: the
    throughput curves behind 8.4k vs 14.5k tokens/s)."""
    return curve_figure("throughput", runs, TPS_FULL, Path(out_dir), ema_weight=ema_weight, formats=formats, dpi=dpi,
                        ylabel="trainer tokens / s, full step", title="Trainer throughput", stem_prefix="throughput")


def plot_metric(runs: Sequence[Run], key: str, out_dir: str | os.PathLike = "paper_figures", *, ema_weight: float = 0.0,
                formats: Sequence[str] = ("png", "pdf"), dpi: int = 150) -> list[dict]:
    """Any logged metric vs step per arm; PlotError if no run logged it."""
    check_metric(runs, key)
    return curve_figure("metric", runs, key, Path(out_dir), ema_weight=ema_weight, formats=formats, dpi=dpi, ylabel=key,
                        title=key, stem_prefix=f"metric_{slug(key)}")
