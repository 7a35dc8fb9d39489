"""What every figure shares: arm colours and labels, the panel grid, the legend, saving, and the record a
figure returns for figures.json.

Everything draws on matplotlib.figure.Figure objects (no pyplot state), so it works headless and in notebooks.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from .runs import GroupKey, Run

ARM_LABELS = {"bi": "BI", "bi_chunk": "BI-chunk (ours)", "stock": "stock", "vllm_native": "vLLM-native"}
ARM_COLORS = {"bi": "tab:blue", "bi_chunk": "tab:purple", "stock": "tab:orange", "vllm_native": "tab:green"}
_EXTRA_COLORS = ("tab:red", "tab:brown", "tab:pink", "tab:gray", "tab:olive", "tab:cyan")
_extra_color_of: dict[str, str] = {}  # an arm outside ARM_COLORS keeps its first colour for the whole process


def arm_label(arm: str) -> str:
    return ARM_LABELS.get(arm, arm)


def arm_color(arm: str) -> str:
    if arm in ARM_COLORS:
        return ARM_COLORS[arm]
    if arm not in _extra_color_of:
        _extra_color_of[arm] = _EXTRA_COLORS[len(_extra_color_of) % len(_EXTRA_COLORS)]
    return _extra_color_of[arm]


def slug(text: str) -> str:
    """A file-name-safe form of a task, preset or metric name."""
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_") or "x"


def op_label(op: int | None) -> str:
    return "offpolicy=?" if op is None else f"offpolicy={op}"


def setting_title(setting: tuple[str, str]) -> str:
    return f"{setting[0]} · {setting[1]}"


def new_figure(ncols: int, nrows: int = 1, *, panel=(4.2, 3.2)):
    """A figure of nrows x ncols panels (axes always 2-D), sized per panel plus a row for the legend."""
    fig = Figure(figsize=(max(panel[0] * ncols, 5.0), panel[1] * nrows + 0.4), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex="col")
    return fig, axes


def suptitle(fig, text: str, fontsize: float = 10) -> None:
    """The figure's title, wrapped to its width (a one-panel figure is narrower than most titles)."""
    chars = int(fig.get_figwidth() * 130 / fontsize)  # ~13 characters an inch at 10 pt
    fig.suptitle("\n".join(textwrap.wrap(text, chars)), fontsize=fontsize)


def save_figure(fig, out_dir: Path, stem: str, formats: Sequence[str], dpi: int = 150) -> list[str]:
    """Write <out_dir>/<stem>.<fmt> for each format; PDFs carry no creation date, so reruns are byte-stable."""
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


def draw_curve(ax, steps, values, *, color, low=None, high=None, lw=1.8, ls="-", alpha=1.0, markers=False, label=None):
    """A mean curve with its seed band (low..high, shaded, where given and not flat). Every point stays visible:
    a series of one point, or a point whose neighbours were not logged, gets a marker (a line needs two)."""
    if low is not None and high is not None and np.any(high > low):
        ax.fill_between(steps, low, high, color=color, alpha=0.18 * alpha, lw=0, step=None)
    ax.plot(steps, values, color=color, lw=lw, ls=ls, alpha=alpha, label=label, marker="o" if markers else None, ms=3)
    if not markers and len(steps):
        lone = isolated(steps)
        if lone.any():
            ax.plot(np.asarray(steps)[lone], np.asarray(values)[lone], ls="none", marker="o", ms=3.5, color=color,
                    alpha=alpha, zorder=4)


def isolated(steps) -> np.ndarray:
    """Points a line cannot show: the only point, or one whose neighbour steps are further than the series'
    usual spacing on both sides (a logged point between gaps)."""
    s = np.asarray(steps, dtype=np.float64)
    if s.size <= 1:
        return np.ones(s.size, dtype=bool)
    gaps = np.diff(s)
    usual = np.median(gaps)
    before = np.concatenate([[np.inf], gaps]) > usual
    after = np.concatenate([gaps, [np.inf]]) > usual
    return before & after


def figure_record(kind: str, stem: str, files: list[str], metrics: Sequence[str], runs: Iterable[Run], **extra) -> dict:
    """The figures.json entry of one figure: what it is, its files, its metrics and the runs that fed it."""
    return {"kind": kind, "stem": stem, "files": files, "metrics": list(metrics),
            "runs": sorted({str(r.path) for r in runs}), **extra}


def group_paths(groups: dict[GroupKey, list[Run]]) -> dict[str, list[str]]:
    """{"<arm>/op<offpolicy>": [run dirs]} of one setting's groups, for figures.json."""
    return {f"{k.arm}/op{k.offpolicy}": [str(r.path) for r in v] for k, v in groups.items()}


def arm_legend(fig, arms: Iterable[str], extra: Sequence[tuple[str, str]] = (), *, bars: bool = False) -> None:
    """One legend for the whole figure, outside below the panels: an entry per arm (colour), then `extra`
    (label, linestyle) entries drawn in black."""
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
