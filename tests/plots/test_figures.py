"""zeromismatch.plots and `job=plot` on synthetic run dirs (config.json + metrics.jsonl, and one
offline W&B run). The synthetic runs are test data only; no figure written here is a result."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import nbclient
import nbformat
import numpy as np
import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

from zeromismatch.logging import MetricsLogger, metric_series  # noqa: E402
from zeromismatch.plots import (  # noqa: E402
    GroupKey,
    PlotError,
    arm_of,
    build_figures,
    cost_table,
    ema,
    find_run_dirs,
    group_runs,
    load_run,
    load_runs,
    written_files,
)
from zeromismatch.plots.curves import REWARD  # noqa: E402
from zeromismatch.plots.mismatch import MISMATCH, PRECISION, log_floor  # noqa: E402
from zeromismatch.plots.runs import wandb_cli_ok  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import plot_synth as synth  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FAST = {"formats": ("png",), "dpi": 40}


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> Path:
    """bi / stock / vllm_native at op4 and op12, a second bi op4 seed, and a smoke run (not an rl run)."""
    root = tmp_path_factory.mktemp("runs")
    synth.write_matrix(root, offpolicies=(4, 12))
    synth.write_run(root, "bi", 4, seed=1)
    synth.write_run(root, "stock", 4, name="2026-01-01_smoke", job="smoke")
    (root / "notes.txt").write_text("a file the glob also matches\n")
    return root


@pytest.fixture(scope="module")
def built(matrix, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("fig")
    return build_figures(str(matrix / "*"), out, formats=("png", "pdf"), dpi=50)


# ------------------------------------------------------------------------------------------ figures


def test_all_figures_written(built):
    stems = {"reward_math_tiny", "validation_math_tiny", "mismatch_math_tiny", "cost_math_tiny", "throughput_math_tiny"}
    assert set(built["figures"]) == stems
    assert built["skipped"] == {}
    for stem, rec in built["figures"].items():
        assert [Path(f).name for f in rec["files"]] == [f"{stem}.png", f"{stem}.pdf"]
        for f in rec["files"]:
            data = Path(f).read_bytes()
            assert len(data) > 1000, f
            assert data.startswith(PNG_MAGIC if f.endswith(".png") else b"%PDF"), f
    index = json.loads(Path(built["index_path"]).read_text())
    assert set(index["figures"]) == stems
    assert written_files(built)[-1] == built["index_path"]


def test_index_says_which_runs_fed_which_figure(built, matrix):
    rl_runs = sorted(str(p) for p in matrix.iterdir() if p.is_dir() and "smoke" not in p.name)
    assert len(rl_runs) == 7
    for rec in built["figures"].values():
        assert rec["runs"] == rl_runs
    assert [i["run_dir"] for i in built["ignored_runs"]] == [str(matrix / "2026-01-01_smoke")]
    assert "job 'smoke'" in built["ignored_runs"][0]["reason"]
    assert built["figures"]["reward_math_tiny"]["metrics"] == [REWARD]
    assert built["figures"]["reward_math_tiny"]["ema"] == 0.9
    assert len(built["figures"]["reward_math_tiny"]["groups"]["bi/op4"]) == 2
    assert {r["source"] for r in built["runs"]} == {"jsonl"}


def test_mismatch_zeros_on_floor_and_split(built):
    rec = built["figures"]["mismatch_math_tiny"]
    assert rec["split"] is True
    assert rec["metrics"][1:] == [PRECISION, "bit_wise/logprob_diff/staleness_abs_mean"]
    # BI: total gap exactly 0 at step 0 (row 0) and precision part exactly 0 throughout (row 1)
    assert rec["exact_zeros_drawn"] == [0, 1]
    smallest = min(v for r in synth.rows("stock", 4) + synth.rows("bi", 4) for k, v in r.items()
                   if k.startswith("bit_wise/logprob_diff/") and k.endswith("abs_mean") and v > 0)
    assert rec["zero_floor"] < smallest < 100 * rec["zero_floor"]  # one decade below the smallest value's decade


def test_mismatch_draws_the_unmixed_precision_part_where_logged(tmp_path):
    """Runs that log the precision part over samples no hot swap mixed get it as a third line of the split row:
    exactly 0 for bi (drawn on the floor), positive for stock."""
    for arm in ("bi", "stock"):
        d = synth.write_run(tmp_path / "runs", arm, 4, eval_every=0)
        rows = [json.loads(line) for line in open(d / "metrics.jsonl")]
        for r in rows:
            r["bit_wise/logprob_diff/precision_unmixed_abs_mean"] = r["bit_wise/logprob_diff/precision_abs_mean"]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rec = build_figures(tmp_path / "runs", tmp_path / "out", figures=["mismatch"], **FAST)["figures"]["mismatch_math_tiny"]
    assert rec["metrics"][1:] == [PRECISION, "bit_wise/logprob_diff/staleness_abs_mean",
                                  "bit_wise/logprob_diff/precision_unmixed_abs_mean"]
    assert rec["exact_zeros_drawn"] == [0, 1]


def test_cost_table_ratios(matrix):
    rows = {(r["arm"], r["offpolicy"]): r for r in cost_table(load_runs(str(matrix / "*")))}
    bi, stock = rows[("bi", 4)], rows[("stock", 4)]
    assert bi["n_runs"] == 2 and stock["n_runs"] == 1
    full = "perf/trainer/tokens_per_second_full_step"
    assert bi[full] / stock[full] == pytest.approx(1 / 3, rel=1e-6)
    assert bi["perf/trainer/tokens_per_second_fwd_bwd"] == pytest.approx(2 * bi[full])


# ----------------------------------------------------------------------------------------- grouping


def test_grouping_by_config(matrix):
    runs = load_runs(str(matrix / "*"))
    groups = group_runs(runs)
    assert list(groups) == [
        GroupKey("math", "tiny", "bi", 4),
        GroupKey("math", "tiny", "stock", 4),
        GroupKey("math", "tiny", "vllm_native", 4),
        GroupKey("math", "tiny", "bi", 12),
        GroupKey("math", "tiny", "stock", 12),
        GroupKey("math", "tiny", "vllm_native", 12),
    ]
    assert len(groups[GroupKey("math", "tiny", "bi", 4)]) == 2
    for key, members in groups.items():
        for r in members:
            assert (r.numerics, r.offpolicy) == ({"vllm_native": "stock"}.get(key.arm, key.arm), key.offpolicy)
    # all jobs when the filter is off: the smoke run joins stock op4
    assert len(group_runs(load_runs(str(matrix / "*"), jobs=None))[GroupKey("math", "tiny", "stock", 4)]) == 2


def test_arm_of():
    assert arm_of(synth.config("bi", 4)) == "bi"
    assert arm_of(synth.config("bi_chunk", 4)) == "bi_chunk"
    assert arm_of(synth.config("stock", 4, backend="vllm_native")) == "vllm_native"
    assert arm_of(synth.config("bi", 4, backend="vllm")) == "bi"  # our model inside vLLM: the bi arm
    assert arm_of({"numerics": {"name": "stock"}}) == "stock"


def test_settings_get_separate_files(tmp_path):
    synth.write_run(tmp_path / "runs", "bi", 4)
    d = synth.write_run(tmp_path / "runs", "stock", 4)
    cfg = json.loads((d / "config.json").read_text())
    cfg["model"]["preset"] = "qwen3_5_9b"
    (d / "config.json").write_text(json.dumps(cfg))
    index = build_figures(tmp_path / "runs", tmp_path / "out", figures=["cost"], **FAST)
    assert sorted(index["figures"]) == ["cost_math_qwen3_5_9b", "cost_math_tiny"]
    assert index["figures"]["cost_math_qwen3_5_9b"]["runs"] == [str(d)]


def test_series_reads_merged_rows(matrix):
    run = load_run(next(p for p in sorted(matrix.iterdir()) if p.name.endswith("op4_bi")))
    steps, vals = run.series(MISMATCH)
    assert steps.tolist() == list(range(6)) and vals[0] == 0.0 and (vals[1:] > 0).all()
    s2, v2 = run.series("validation_reward/_mean")  # logged in separate rows at the same steps
    assert s2.tolist() == [0, 2, 4]
    assert (steps.tolist(), vals.tolist()) == tuple(list(x) for x in metric_series(run.rows, MISMATCH))


def test_ema():
    assert ema([0.0, 0.0, 0.0], 0.9).tolist() == [0.0, 0.0, 0.0]  # exact zeros stay zero
    x = np.array([1.0, 3.0, 2.0])
    assert ema(x, 0.0).tolist() == x.tolist()
    assert ema([2.0, 2.0, 2.0], 0.9) == pytest.approx([2.0, 2.0, 2.0])  # debiased: no pull towards 0
    assert ema(x, 0.5)[0] == 1.0 and ema(x, 0.5)[1] == pytest.approx((0.25 + 1.5) / 0.75)
    with pytest.raises(PlotError):
        ema(x, 1.0)


def test_log_floor():
    assert log_floor([np.array([0.0, 0.004]), np.array([0.03])]) == pytest.approx(1e-4)
    assert log_floor([np.array([0.0])]) == 1e-7
    assert math.isclose(log_floor([np.array([1e-6, 0.5])]), 1e-7)


# ------------------------------------------------------------------------------------------- errors


def test_empty_glob_names_the_glob(tmp_path):
    pattern = str(tmp_path / "nothing" / "*")
    with pytest.raises(PlotError, match="no run directories found") as e:
        build_figures(pattern, tmp_path / "out")
    assert pattern in str(e.value)
    with pytest.raises(PlotError, match="does not exist"):
        find_run_dirs(str(tmp_path / "missing_run"))
    with pytest.raises(PlotError, match="no runs given"):
        find_run_dirs([])
    assert not (tmp_path / "out").exists()


def test_runs_root_and_glob_agree(matrix):
    assert find_run_dirs(matrix) == find_run_dirs(str(matrix / "*"))
    assert find_run_dirs([str(matrix / "*op12_bi"), str(matrix / "*op12_bi")]) == [matrix / "2026-01-01_00-00-00_math_op12_bi"]


def test_run_without_config_or_metrics(tmp_path):
    good = synth.write_run(tmp_path / "runs", "bi", 4)
    no_cfg = synth.write_run(tmp_path / "runs", "stock", 4)
    (no_cfg / "config.json").unlink()
    with pytest.raises(PlotError, match=rf"run {no_cfg} holds metrics.jsonl but no config.json and no "
                                        r"\.hydra/config.yaml: cannot tell its arm \(numerics.name, rl.offpolicy"):
        load_runs(str(tmp_path / "runs" / "*"))
    with pytest.warns(UserWarning, match="no config.json"):
        runs = load_runs(str(tmp_path / "runs" / "*"), strict=False)
    assert [r.path for r in runs] == [good]
    second = synth.write_run(tmp_path / "runs", "bi", 12)
    (second / "config.json").unlink()
    with pytest.raises(PlotError, match=r"^2 of 3 run folders unreadable: run .*; run .*no config.json") as e:
        load_runs(str(tmp_path / "runs" / "*"))
    assert str(no_cfg) in str(e.value) and str(second) in str(e.value) and "\n" not in str(e.value)

    no_metrics = tmp_path / "runs2" / "crashed"
    no_metrics.mkdir(parents=True)
    (no_metrics / "config.json").write_text(json.dumps(synth.config("bi", 4)))
    with pytest.raises(PlotError, match=r"has no metrics\.jsonl"):
        load_run(no_metrics)
    (no_metrics / "metrics.jsonl").write_text("")
    with pytest.raises(PlotError, match="has no metrics"):
        load_run(no_metrics)
    with pytest.raises(PlotError, match="unknown source"):
        load_run(good, source="csv")


def test_unknown_metric_and_figure(matrix, tmp_path):
    with pytest.raises(PlotError, match="unknown metric 'bit_wise/logprob_dif/abs_mean'") as e:
        build_figures(str(matrix / "*"), tmp_path / "out", metrics=["bit_wise/logprob_dif/abs_mean"])
    assert MISMATCH in str(e.value)  # the closest logged name is suggested
    with pytest.raises(PlotError, match="unknown figure"):
        build_figures(str(matrix / "*"), tmp_path / "out", figures=["rewards"])
    assert not (tmp_path / "out").exists()  # nothing drawn before the check


def test_missing_figure_metric_skipped_or_error(tmp_path):
    synth.write_run(tmp_path / "runs", "bi", 4, eval_every=0, split=False)
    index = build_figures(tmp_path / "runs", tmp_path / "out", figures="all", mismatch_ema=0.5, **FAST)
    assert index["skipped"] == {"validation": "no run logged validation_reward/_mean"}
    assert index["figures"]["mismatch_math_tiny"]["ema"] == 0.5  # smoothed lines, zeros still marked
    assert index["figures"]["mismatch_math_tiny"]["split"] is False
    assert index["figures"]["mismatch_math_tiny"]["exact_zeros_drawn"] == [0]
    with pytest.raises(PlotError, match="unknown metric 'validation_reward/_mean'"):
        build_figures(tmp_path / "runs", tmp_path / "out2", figures=["validation"], **FAST)


# ------------------------------------------------------------------------------------ W&B offline


def test_wandb_offline_source(tmp_path, monkeypatch):
    if not wandb_cli_ok():
        pytest.skip("`wandb leet inspect` is not usable here; the JSONL path is covered by the other tests")
    monkeypatch.setenv("WANDB_SILENT", "true")
    rows = synth.rows("bi", 4, steps=4, eval_every=0)
    cfg = {"run_dir": str(tmp_path / "runs" / "wb_bi"), "wandb": {"mode": "offline"}}
    with MetricsLogger(cfg, "wb_bi", synth.config("bi", 4)) as log:
        for row in rows:
            log.log({k: v for k, v in row.items() if k not in ("step", "_time")}, step=row["step"])
    if not list(log.run_dir.rglob("*.wandb")):
        pytest.skip("wandb could not start an offline run here")
    (log.run_dir / "metrics.jsonl").unlink()  # only the W&B file is left: the figures must come from it

    with pytest.raises(PlotError, match="try source=wandb"):
        load_run(log.run_dir, source="jsonl")
    jsonl_only = synth.write_run(tmp_path / "plain", "stock", 4)
    with pytest.raises(PlotError, match="no offline W&B run"):
        load_run(jsonl_only, source="wandb")
    assert load_run(jsonl_only, source="auto").source == "jsonl"

    index = build_figures(tmp_path / "runs", tmp_path / "out", source="wandb", figures=["mismatch"], **FAST)
    assert index["source"] == "wandb" and index["runs"][0]["source"] == "wandb"
    rec = index["figures"]["mismatch_math_tiny"]
    assert rec["runs"] == [str(log.run_dir)] and rec["exact_zeros_drawn"] == [0, 1]
    assert Path(rec["files"][0]).stat().st_size > 1000
    run = load_run(log.run_dir, source="auto")  # auto prefers the W&B file; same values as logged
    assert run.source == "wandb"
    assert run.series(MISMATCH)[1].tolist() == [r[MISMATCH] for r in rows]
    assert run.series(PRECISION)[1].tolist() == [0.0] * 4


# ---------------------------------------------------------------------------------------- plot job


def _compose(*overrides: str):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=["job=plot", *overrides])


def test_plot_job(matrix, tmp_path, capsys):
    from zeromismatch.jobs import get_job

    main = get_job("plot")
    cfg = _compose(f"job.runs={matrix}/*", f"job.out={tmp_path}/out", "job.figures=[cost,reward]",
                   "job.formats=[png]", "job.dpi=40")
    assert cfg.job.source == "jsonl" and cfg.job.figures == ["cost", "reward"]
    result = main(cfg)
    out = capsys.readouterr().out
    assert result["figures"] == ["cost_math_tiny", "reward_math_tiny"]
    for f in result["files"]:
        assert f in out and Path(f).stat().st_size > 0
    assert result["index"] == str(tmp_path / "out" / "figures.json")
    assert "ignored" in out and "smoke" in out

    default = _compose()
    assert default.job.runs == "results/repro/*/*" and default.job.out == "paper_figures" and default.job.figures == "all"

    for overrides, message in [
        ([f"job.runs={tmp_path}/none/*"], f"no run directories found for ['{tmp_path}/none/*']"),
        ([f"job.runs={matrix}/*", "job.metrics=[no/such/metric]"], "unknown metric 'no/such/metric'"),
    ]:
        with pytest.raises(SystemExit) as e:
            main(_compose(*overrides, f"job.out={tmp_path}/out2"))
        assert e.value.code == 2
        assert message in capsys.readouterr().err


# ---------------------------------------------------------------------------------------- notebook


def test_notebook_is_valid_and_runs(matrix, tmp_path, monkeypatch):
    nb = json.loads((ROOT / "notebooks" / "figures.ipynb").read_text())
    assert nb["nbformat"] == 4 and nb["nbformat_minor"] >= 4
    kinds = [c["cell_type"] for c in nb["cells"]]
    assert kinds[0] == "markdown" and "code" in kinds and len(kinds) <= 10
    for c in nb["cells"]:
        assert isinstance(c["source"], list) and c["metadata"] == {}
        if c["cell_type"] == "code":
            assert c["outputs"] == [] and c["execution_count"] is None
    text = "".join(s for c in nb["cells"] if c["cell_type"] == "markdown" for s in c["source"])
    for stem in ("reward_", "validation_", "mismatch_", "cost_", "0 (bitwise)"):
        assert stem in text

    for stem in ("throughput_", "results/repro"):
        assert stem in text


FIXTURE = ROOT / "tests" / "plots" / "data" / "sweep_tiny"  # a CPU sweep's logs: 2 arms x 2 seeds (README there)


def test_notebook_executes_headless_from_any_directory(tmp_path):
    """notebooks/figures.ipynb run by a Jupyter kernel (nbclient), started in an unrelated folder, on the
    committed small logs: it finds the repo, draws every figure and shows them."""
    nb = nbformat.read(ROOT / "notebooks" / "figures.ipynb", as_version=4)
    env = {"ZM_RUNS": str(FIXTURE / "*" / "*"), "ZM_OUT": str(tmp_path / "out"), "ZM_FORMATS": "png"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits them
    try:
        nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                resources={"metadata": {"path": str(tmp_path)}}).execute()
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    out = json.loads((tmp_path / "out" / "figures.json").read_text())
    assert sorted(out["figures"]) == ["cost_math_tiny", "mismatch_math_tiny", "reward_math_tiny",
                                      "throughput_math_tiny", "validation_math_tiny"]
    assert len(out["runs"]) == 4 and {r["arm"] for r in out["runs"]} == {"bi", "stock"}
    shown = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(shown) == 5
