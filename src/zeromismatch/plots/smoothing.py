"""Curve statistics for the figures: the step-wise mean over a group's runs, its seed band, and EMA smoothing."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .runs import PlotError, Run


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


def seed_band(runs: Sequence[Run], key: str, weight: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(steps, mean, low, high) over a group's runs: each run EMA-smoothed first (``weight``), then per step the
    mean, min and max over the runs that logged it. With one run, low == high == mean."""
    acc: dict[int, list[float]] = {}
    for r in runs:
        s, v = r.series(key)
        for step, x in zip(s, ema(v, weight)):
            acc.setdefault(int(step), []).append(float(x))
    steps = np.array(sorted(acc), dtype=np.int64)
    vals = [acc[s] for s in steps]
    return (steps, np.array([np.mean(v) for v in vals]), np.array([min(v) for v in vals]),
            np.array([max(v) for v in vals]))
