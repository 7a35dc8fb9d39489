#!/usr/bin/env python
"""The numbers results/REPORT.md quotes, from the run folders of a sweep (results/repro/<exp>/<seed>/).

    python scripts/repro_table.py [--runs 'results/repro/*/*'] [--out results/repro/table.json] [--md results/repro/table.md] [--last 10]

Per group (task, preset, arm, offpolicy): seeds, steps reached, the step-0 gap, the gap (abs_mean) and its
precision / staleness parts averaged over the last --last steps that every run of every arm of the window
reached (so arms compare at the same steps), train reward over those
steps, held-out accuracy at step 0 and at the last eval every seed reached, and the median full-step / fwd-bwd
trainer tokens/s. Each value is the mean over seeds with a 95% confidence half-width across seeds (Student t,
n - 1 degrees of freedom; none for one seed). Then per window, BI minus stock (and bi_chunk minus stock) with a
95% interval for the difference of two independent means (pooled variance, n1 + n2 - 2 degrees of freedom).
Prints a Markdown table; writes the JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from zeromismatch.plots import group_runs, load_runs  # noqa: E402
from zeromismatch.plots.cost import TPS_FULL, TPS_FWD_BWD  # noqa: E402
from zeromismatch.plots.curves import REWARD, VALIDATION  # noqa: E402
from zeromismatch.plots.mismatch import MISMATCH, PRECISION, STALENESS  # noqa: E402
from zeromismatch.plots.runs import config_value  # noqa: E402

# Student t quantile 0.975 by degrees of freedom (the normal 1.96 beyond the table)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t975(df: int) -> float:
    return T975.get(df) or T975[max(k for k in T975 if k <= df)] if df <= 30 else 1.96


COLUMNS = {  # name -> (metric, how)
    "gap_step0": (MISMATCH, "step0"),
    "gap_last": (MISMATCH, "last"),
    "precision_last": (PRECISION, "last"),
    "staleness_last": (STALENESS, "last"),
    "reward_last": (REWARD, "last"),
    "heldout_step0": (VALIDATION, "step0"),
    "heldout_last": (VALIDATION, "final"),
    "tps_full_step": (TPS_FULL, "median"),
    "tps_fwd_bwd": (TPS_FWD_BWD, "median"),
}


def mean_ci(values: list[float]) -> tuple[float | None, float | None]:
    """(mean, 95% half-width across seeds; None for one value)."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
    if v.size == 0:
        return None, None
    if v.size == 1:
        return float(v[0]), None
    return float(v.mean()), float(t975(v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))


def diff_ci(a: list[float], b: list[float]) -> tuple[float | None, float | None]:
    """mean(a) - mean(b) and the 95% half-width (pooled variance); None where either side has < 2 values."""
    a = np.asarray([x for x in a if x is not None], dtype=np.float64)
    b = np.asarray([x for x in b if x is not None], dtype=np.float64)
    if a.size == 0 or b.size == 0:
        return None, None
    d = float(a.mean() - b.mean())
    if a.size < 2 or b.size < 2:
        return d, None
    pooled = ((a.size - 1) * a.var(ddof=1) + (b.size - 1) * b.var(ddof=1)) / (a.size + b.size - 2)
    half = t975(a.size + b.size - 2) * math.sqrt(pooled * (1 / a.size + 1 / b.size))
    return d, float(half)


def paired_ci(a: dict, b: dict) -> tuple[float | None, float | None, int]:
    """Mean and 95% half-width of a[seed] - b[seed] over the seeds both have (arms of one seed see the same
    prompts and sampling seeds, so their difference varies far less than either arm); the number of pairs."""
    d = [a[k] - b[k] for k in sorted(set(a) & set(b)) if a[k] is not None and b[k] is not None]
    d = [x for x in d if math.isfinite(x)]
    return (*mean_ci(d), len(d))


def run_value(run, key: str, how: str, last_steps: set[int], final_step: int | None) -> float | None:
    steps, vals = run.series(key)
    if not steps.size:
        return None
    if how == "step0":
        return float(vals[steps == 0][0]) if (steps == 0).any() else None
    if how == "median":
        return float(np.median(vals))
    if how == "final":  # the last eval at or before the last step every seed of the group reached
        ok = steps <= final_step if final_step is not None else np.ones_like(steps, bool)
        return float(vals[ok][-1]) if ok.any() else None
    sel = np.isin(steps, list(last_steps))
    return float(vals[sel].mean()) if sel.any() else None


def table(runs_spec: str, last: int) -> dict:
    runs = load_runs(runs_spec)
    out = {"runs": runs_spec, "last": last, "groups": [], "differences": []}
    per_group = {}
    groups = group_runs(runs)
    reached_of = {k: [int(r.series(REWARD)[0].max()) + 1 if r.has(REWARD) else 0 for r in rs] for k, rs in groups.items()}
    window_common = {}  # the steps every run of every arm of a window reached: arms compare at the same steps
    for k, reached in reached_of.items():
        w = (k.task, k.preset, k.offpolicy)
        window_common[w] = min(window_common.get(w, min(reached)), min(reached))
    for key, rs in groups.items():
        reached = reached_of[key]
        common = window_common[(key.task, key.preset, key.offpolicy)]
        last_steps = set(range(max(0, common - last), common))
        row = {"task": key.task, "preset": key.preset, "arm": key.arm, "offpolicy": key.offpolicy,
               "seeds": len(rs), "steps_reached": reached, "last_steps": [min(last_steps, default=0), common - 1]}
        values = {"_seeds": [config_value(r.config, "seed") for r in rs]}
        for name, (metric, how) in COLUMNS.items():
            values[name] = [run_value(r, metric, how, last_steps, common - 1) for r in rs]
            row[name], row[name + "_ci95"] = mean_ci(values[name])
            row[name + "_per_seed"] = values[name]
        out["groups"].append(row)
        per_group[(key.task, key.preset, key.offpolicy, key.arm)] = values
    for (task, preset, op, arm), values in per_group.items():
        ref = per_group.get((task, preset, op, "stock"))
        if arm == "stock" or ref is None:
            continue
        for name in ("gap_last", "reward_last", "heldout_last", "tps_full_step"):
            d, h = diff_ci(values[name], ref[name])
            pd, ph, n = paired_ci(dict(zip(values["_seeds"], values[name])), dict(zip(ref["_seeds"], ref[name])))
            out["differences"].append({"task": task, "preset": preset, "offpolicy": op, "arm": arm, "vs": "stock",
                                       "metric": name, "diff": d, "ci95": h,
                                       "paired_diff": pd, "paired_ci95": ph, "pairs": n})
    return out


def fmt(v, h=None, digits=3) -> str:
    if v is None:
        return "–"
    if v == 0 and h in (None, 0):
        return "0"
    text = f"{v:.{digits}g}" if abs(v) < 1e-2 and v != 0 else f"{v:.{digits}f}" if abs(v) < 100 else f"{v:.0f}"
    return text + (f" ± {h:.2g}" if h is not None else "")


def markdown(t: dict) -> str:
    lines = ["| task / preset | window | arm | seeds | steps reached (min) | compared steps | gap step 0 | gap (last) | precision | staleness | reward (last) | "
             "held-out 0 → last | tokens/s full step |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for g in t["groups"]:
        lines.append(
            f"| {g['task']} / {g['preset']} | op{g['offpolicy']} | {g['arm']} | {g['seeds']} | {min(g['steps_reached'])} | "
            f"{g['last_steps'][0]}-{g['last_steps'][1]} | {fmt(g['gap_step0'])} | "
            f"{fmt(g['gap_last'], g['gap_last_ci95'])} | {fmt(g['precision_last'])} | {fmt(g['staleness_last'])} | "
            f"{fmt(g['reward_last'], g['reward_last_ci95'])} | {fmt(g['heldout_step0'])} → "
            f"{fmt(g['heldout_last'], g['heldout_last_ci95'])} | {fmt(g['tps_full_step'], g['tps_full_step_ci95'])} |")
    lines += ["", "| task / preset | window | arm − stock | metric | difference ± 95% (independent) | paired by seed ± 95% |",
              "|---|---|---|---|---|---|"]
    for d in t["differences"]:
        lines.append(f"| {d['task']} / {d['preset']} | op{d['offpolicy']} | {d['arm']} | {d['metric']} | "
                     f"{fmt(d['diff'], d['ci95'])} | {fmt(d['paired_diff'], d['paired_ci95'])} ({d['pairs']} seeds) |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", default="results/repro/*/*")
    p.add_argument("--out", default=None, help="the JSON to write")
    p.add_argument("--md", default=None, help="the Markdown table to write too")
    p.add_argument("--last", type=int, default=10, help="steps at the end every seed reached, averaged")
    args = p.parse_args(argv)
    t = table(args.runs, args.last)
    print(markdown(t))
    if args.md:
        Path(args.md).write_text(markdown(t) + "\n")
    if args.out:
        Path(args.out).write_text(json.dumps(t, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
