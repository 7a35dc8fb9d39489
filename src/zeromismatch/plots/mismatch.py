"""The logprob-mismatch figure: |trainer - generator| logprob vs step on a log axis.

The point of the figure is that BI's gap is exactly zero where it should be, and a log axis cannot show 0:
exact zeros are drawn on a dotted floor line a decade below the smallest positive value, marked
"0 (bitwise)", so they read as zero rather than as a very small number.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from matplotlib.ticker import FuncFormatter, LogFormatterSciNotation, LogLocator

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
from .runs import Run, arms_of, by_setting, group_runs, offpolicies_of
from .smoothing import seed_band

MISMATCH = "bit_wise/logprob_diff/abs_mean"
PRECISION = "bit_wise/logprob_diff/precision_abs_mean"
STALENESS = "bit_wise/logprob_diff/staleness_abs_mean"
PRECISION_UNMIXED = "bit_wise/logprob_diff/precision_unmixed_abs_mean"  # samples no hot swap mixed (rl/metrics.py)

ZERO_LABEL = "0 (bitwise)"


def log_floor(arrays: Iterable[np.ndarray]) -> float:
    """A y value one decade below the smallest positive value: where exact zeros are drawn on a log axis."""
    pos = [a[a > 0].min() for a in arrays if a.size and (a > 0).any()]
    if not pos:
        return 1e-7
    return 10.0 ** (math.floor(math.log10(min(pos))) - 1)


def _plot_log(ax, steps, values, floor, *, color, ls="-", low=None, high=None) -> bool:
    """Plot on a log axis with values <= 0 drawn at `floor` (and marked there), the seed band likewise clipped
    to the floor, every point visible (drawing.draw_curve). Returns whether any exact zero was drawn."""
    at = lambda a: None if a is None else np.where(a <= 0, floor, a)  # noqa: E731
    draw_curve(ax, steps, at(values), color=color, ls=ls, low=at(low), high=at(high))
    return _mark_zeros(ax, steps, values, floor, color)


def _mark_zeros(ax, steps, values, floor, color) -> bool:
    """Open circles on the floor line where a value is exactly zero (bitwise parity); whether there were any."""
    zero = values <= 0
    if zero.any():
        ax.plot(steps[zero], np.full(int(zero.sum()), floor), ls="none", marker="o", ms=4, mfc="white",
                mec=color, clip_on=False, zorder=5)
    return bool(zero.any())


def _mark_floor(ax, floor: float) -> None:
    """Dotted floor line, annotated, and its tick labelled 0 (no data lies within a decade above it)."""
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
    staleness part (t_cur - t_old, dashed) of the same gap, and where logged the precision part over the samples
    that no hot swap mixed (dotted). Per arm the mean over its runs (seeds), the seeds'
    range shaded. Smoothing (ema_weight) applies to the lines; the zero markers are always the raw values."""
    out_dir = Path(out_dir)
    with_key = [r for r in runs if r.has(MISMATCH)]
    records = []
    for setting, groups in by_setting(group_runs(with_key)).items():
        ops = offpolicies_of(groups)
        members = [r for rs in groups.values() for r in rs]
        split = any(r.has(PRECISION) or r.has(STALENESS) for r in members)
        unmixed = any(r.has(PRECISION_UNMIXED) for r in members)
        split_keys = [PRECISION, STALENESS] + ([PRECISION_UNMIXED] if unmixed else [])
        keys = [MISMATCH] + (split_keys if split else [])
        floor = log_floor(r.series(k)[1] for r in members for k in keys)
        top = max((float(r.series(k)[1].max()) for r in members for k in keys if r.series(k)[1].size), default=floor)
        top = max(top, floor * 10) * 2.0  # one y range for every panel: arms and windows compare at a glance
        fig, axes = new_figure(len(ops), 2 if split else 1)
        zeros_at: set[int] = set()
        for j, op in enumerate(ops):
            for row, row_keys in enumerate([[MISMATCH]] + ([split_keys] if split else [])):
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
                        ls = {STALENESS: "--", PRECISION_UNMIXED: ":"}.get(key, "-")
                        s, v, lo, hi = seed_band(rs, key, ema_weight)
                        any_zero |= _plot_log(ax, s, v, floor, color=color, ls=ls, low=lo, high=hi)
                        if ema_weight:  # exact zeros of the raw seed mean, marked on the floor
                            _, raw, _, _ = seed_band(rs, key)
                            any_zero |= _mark_zeros(ax, s, raw, floor, color)
                if any_zero:
                    _mark_floor(ax, floor)
                    zeros_at.add(row)
                ax.set_ylim(floor / 4.0, top)
                ax.grid(alpha=0.3, lw=0.5)
                if row == 0:
                    ax.set_title(op_label(op))
                if row == len(axes) - 1:
                    ax.set_xlabel("step")
        axes[0, 0].set_ylabel("|trainer − generator| logprob\n(abs_mean, token-weighted)")
        extra = []
        if split:
            axes[1, 0].set_ylabel("split of the same gap\n(abs_mean)")
            extra = [("precision: t_old − gen", "-"), ("staleness: t_cur − t_old", "--")]
            if PRECISION_UNMIXED in split_keys:
                extra.append(("precision, samples no swap mixed", ":"))
        arm_legend(fig, arms_of(groups), extra)
        smooth = f", EMA {ema_weight:g}" if ema_weight else ""
        suptitle(fig, f"Logprob mismatch — {setting_title(setting)}{smooth}")
        stem = f"mismatch_{slug(setting[0])}_{slug(setting[1])}"
        files = save_figure(fig, out_dir, stem, formats, dpi)
        records.append(figure_record("mismatch", stem, files, keys, members, ema=ema_weight, zero_floor=floor,
                                     exact_zeros_drawn=sorted(zeros_at), split=split, groups=group_paths(groups)))
    return records
