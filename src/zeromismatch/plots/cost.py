"""The cost figure and table: trainer tokens/s per arm, full step and fwd/bwd only.

Medians over steps, not means: the first steps (compilation, warm-up) and a stalled step would otherwise
move a whole run's number.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .drawing import (arm_color, arm_legend, figure_record, new_figure, op_label, save_figure, setting_title, slug,
                      suptitle)
from .runs import Run, arm_sort_key, group_runs

TPS_FULL = "perf/trainer/tokens_per_second_full_step"
TPS_FWD_BWD = "perf/trainer/tokens_per_second_fwd_bwd"


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
    rows_by_setting: dict[tuple[str, str], list[dict]] = {}
    for row in table:
        rows_by_setting.setdefault((row["task"], row["preset"]), []).append(row)
    for setting, rows in rows_by_setting.items():
        ops = sorted({r["offpolicy"] for r in rows}, key=lambda o: -1 if o is None else o)
        arms = sorted({r["arm"] for r in rows}, key=arm_sort_key)
        fig, axes = new_figure(2, panel=(min(12.0, max(4.5, 0.5 * len(ops) * len(arms) + 1.5)), 3.6))
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
            ax.set_xticks(range(len(ops)), [op_label(o) for o in ops])
            ax.set_title(f"trainer tokens/s, {title}", fontsize=9)
            ax.grid(alpha=0.3, axis="y")
            ax.margins(y=0.2)
        arm_legend(fig, arms, bars=True)
        axes[0, 0].set_ylabel("tokens / s (median over steps)")
        suptitle(fig, f"Trainer cost — {setting_title(setting)} (ratio vs stock under each value)")
        stem = f"cost_{slug(setting[0])}_{slug(setting[1])}"
        files = save_figure(fig, out_dir, stem, formats, dpi)
        members = [r for r in with_key if r.key.setting == setting]
        records.append(figure_record("cost", stem, files, [TPS_FULL, TPS_FWD_BWD], members, table=rows))
    return records
