"""Figures draw every point (a series of one point gets a marker), shade the seeds' range, and read a run's arm
from the config Hydra saved (.hydra/config.yaml) when config.json is missing."""

import json
import sys
from pathlib import Path

import numpy as np
import yaml
from matplotlib.figure import Figure

from zeromismatch.plots import build_figures, load_run
from zeromismatch.plots.drawing import draw_curve, isolated

sys.path.insert(0, str(Path(__file__).parent))
import plot_synth as synth  # noqa: E402


def test_isolated_points():
    assert isolated([5]).tolist() == [True]
    assert isolated([0, 1, 2, 3]).tolist() == [False] * 4
    assert isolated([0, 1, 2, 10, 20, 21, 22]).tolist() == [False, False, False, True, False, False, False]


def test_one_point_series_gets_a_marker_and_band_is_shaded():
    ax = Figure().subplots()
    draw_curve(ax, np.array([3]), np.array([0.02]), color="tab:blue")
    assert any(line.get_marker() == "o" and list(line.get_xdata()) == [3] for line in ax.lines)
    ax = Figure().subplots()
    draw_curve(ax, np.arange(4), np.ones(4), color="tab:blue", low=np.zeros(4), high=2 * np.ones(4))
    assert len(ax.collections) == 1  # the band
    ax = Figure().subplots()
    draw_curve(ax, np.arange(4), np.ones(4), color="tab:blue", low=np.ones(4), high=np.ones(4))
    assert len(ax.collections) == 0  # one seed: no band


def test_config_from_hydra_when_config_json_missing(tmp_path):
    run = synth.write_run(tmp_path / "runs", "stock", 12)
    cfg = json.loads((run / "config.json").read_text())
    (run / "config.json").unlink()
    (run / ".hydra").mkdir()
    cfg["run_name"] = "${task.name}_op${rl.offpolicy}_${numerics.name}"  # Hydra saves interpolations unresolved
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    loaded = load_run(run)
    assert (loaded.arm, loaded.offpolicy, loaded.preset, loaded.task, loaded.name) == ("stock", 12, "tiny", "math", "math_op12_stock")


def test_one_step_mismatch_run_is_drawn(tmp_path):
    run = synth.write_run(tmp_path / "runs", "stock", 4, steps=1)
    index = build_figures(str(tmp_path / "runs" / "*"), tmp_path / "out", figures=["mismatch"], formats=("png",), dpi=40)
    assert index["figures"]["mismatch_math_tiny"]["runs"] == [str(run)]
