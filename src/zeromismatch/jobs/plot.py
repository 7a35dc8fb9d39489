"""`python run.py job=plot`: rebuild the figures from run dirs (default results/repro/<exp>/<seed>/ into paper_figures/).

Knobs (conf/job/plot.yaml): runs, out, source, figures, metrics, ema, mismatch_ema, formats, dpi, jobs,
strict. Draws with zeromismatch.plots.figures.build_figures, prints every path written (figures, then
<out>/figures.json) and returns {"out", "files", "index", "figures", "skipped"}. Bad input (no runs for a
glob, a run without config.json or metrics, an unknown metric or figure) prints "error: ..." and exits 2.
"""

from __future__ import annotations

import sys
from typing import Any

from ..config import to_plain
from ..plots.figures import PlotError, build_figures, written_files


def _list(value: Any) -> list:
    value = to_plain(value)
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def main(cfg) -> dict:
    job = cfg.job
    runs = _list(job.get("runs", "results/repro/*/*"))
    figures = to_plain(job.get("figures", "all"))
    try:
        index = build_figures(
            runs,
            job.get("out", "paper_figures"),
            source=str(job.get("source", "jsonl")),
            figures=figures,
            metrics=[str(m) for m in _list(job.get("metrics"))],
            ema_weight=float(job.get("ema", 0.9)),
            mismatch_ema=float(job.get("mismatch_ema", 0.0)),
            formats=[str(f) for f in _list(job.get("formats", ["png", "pdf"]))],
            dpi=int(job.get("dpi", 150)),
            jobs=[str(j) for j in _list(job.get("jobs", ["rl"]))] or None,
            strict=bool(job.get("strict", True)),
        )
    except PlotError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    files = written_files(index)
    print(f"{len(index['runs'])} runs, {len(index['groups'])} groups; wrote {len(files)} files:")
    for f in files:
        print(f)
    for name, why in index["skipped"].items():
        print(f"skipped {name}: {why}")
    for item in index["ignored_runs"]:
        print(f"ignored {item['run_dir']}: {item['reason']}")
    return {
        "out": str(job.get("out", "paper_figures")),
        "files": files,
        "index": index["index_path"],
        "figures": sorted(index["figures"]),
        "skipped": index["skipped"],
    }
