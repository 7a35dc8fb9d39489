"""The write-up's figures rebuilt from run directories (`python run.py job=plot`; notebooks/figures.ipynb).

build_figures (figures.py) is the entry point; runs.py finds, reads and groups runs; curves.py, mismatch.py
and cost.py draw the figure families.
"""

from .cost import cost_table, plot_cost
from .curves import plot_metric, plot_reward, plot_throughput, plot_validation
from .drawing import arm_label
from .figures import FIGURES, build_figures, written_files
from .mismatch import log_floor, plot_mismatch
from .runs import GroupKey, PlotError, Run, arm_of, find_run_dirs, group_runs, load_run, load_runs
from .smoothing import ema

__all__ = [
    "FIGURES",
    "GroupKey",
    "PlotError",
    "Run",
    "arm_label",
    "arm_of",
    "build_figures",
    "cost_table",
    "ema",
    "find_run_dirs",
    "group_runs",
    "load_run",
    "load_runs",
    "log_floor",
    "plot_cost",
    "plot_metric",
    "plot_mismatch",
    "plot_reward",
    "plot_throughput",
    "plot_validation",
    "written_files",
]
