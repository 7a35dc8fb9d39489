"""MetricsLogger writes JSONL + offline W&B; both read back to the same metric series."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from zeromismatch.logging import MetricsLogger, metric_series, read_jsonl, read_wandb_offline, resolve_wandb_mode
from zeromismatch.logging import metrics as metrics_mod


def _cfg(tmp_path, mode="disabled", name="run"):
    return {"run_dir": str(tmp_path / name), "jsonl": "metrics.jsonl", "wandb": {"mode": mode, "project": "zm-test"}}


# Two rows at step 0 (train, then eval) exercise the JSONL-one-row-per-call vs W&B-one-row-per-step difference.
LOGGED = [
    (0, {"train/loss": 2.5, "perf/trainer/tokens_per_second_fwd_bwd": 100.0}),
    (0, {"validation_reward/_mean": 0.25}),
    (1, {"train/loss": 2.0, "perf/trainer/tokens_per_second_fwd_bwd": 110.0}),
    (2, {"train/loss": 1.5, "perf/trainer/tokens_per_second_fwd_bwd": 120.0, "validation_reward/_mean": 0.5}),
]
KEYS = ["train/loss", "perf/trainer/tokens_per_second_fwd_bwd", "validation_reward/_mean"]


def _log_all(log: MetricsLogger) -> None:
    for step, metrics in LOGGED:
        log.log(metrics, step=step)


def test_jsonl_roundtrip(tmp_path):
    with MetricsLogger(_cfg(tmp_path), "r", {"rl": {"offpolicy": 4}}) as log:
        assert log.wandb_run is None
        _log_all(log)
        log.log({"t": torch.tensor(3.0), "n": np.float32(0.5), "nested": {"a": 1, "b": {"c": True}}}, step=3)
        log.summary({"final": {"loss": 1.5}})
    rows = read_jsonl(log.jsonl_path)
    assert len(rows) == len(LOGGED) + 1
    assert all(isinstance(r["_time"], float) for r in rows)
    for row, (step, metrics) in zip(rows, LOGGED):
        assert row == {"step": step, "_time": row["_time"], **metrics}
    assert rows[-1] == {"step": 3, "_time": rows[-1]["_time"], "t": 3.0, "n": 0.5, "nested/a": 1, "nested/b/c": True}
    assert read_jsonl(log.run_dir) == rows  # a run dir works too
    assert metric_series(rows, "train/loss") == ([0, 1, 2], [2.5, 2.0, 1.5])
    assert json.loads((log.run_dir / "summary.json").read_text()) == {"final/loss": 1.5}
    assert json.loads((log.run_dir / "config.json").read_text()) == {"rl": {"offpolicy": 4}}


def test_wandb_offline_roundtrip(tmp_path):
    with MetricsLogger(_cfg(tmp_path, mode="offline"), "r", {"seed": 0}) as log:
        assert log.wandb_run is not None and log.wandb_mode == "offline"
        _log_all(log)
    assert list(log.run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    try:
        wrows = read_wandb_offline(log.run_dir, fallback=False)
    except RuntimeError:
        if metrics_mod.wandb_cli_available():
            raise
        pytest.skip("`wandb leet inspect` does not run on this machine; the JSONL side is covered above")
    jrows = read_jsonl(log.jsonl_path)
    assert [r["step"] for r in wrows] == [0, 1, 2]  # W&B merged the two step-0 calls
    for key in KEYS:
        assert metric_series(wrows, key) == metric_series(jrows, key), key
    assert all(not k.startswith("_") or k == "_time" for r in wrows for k in r)


def test_read_wandb_offline_falls_back_to_jsonl(tmp_path, monkeypatch):
    with MetricsLogger(_cfg(tmp_path), "r") as log:  # W&B disabled: no .wandb file
        _log_all(log)
    with pytest.warns(UserWarning, match="no .wandb file"):
        assert read_wandb_offline(log.run_dir) == read_jsonl(log.jsonl_path)
    with pytest.raises(RuntimeError, match="no .wandb file"):
        read_wandb_offline(log.run_dir, fallback=False)
    # a .wandb file the CLI cannot read (here: the CLI itself is missing)
    (log.run_dir / "run-x.wandb").write_bytes(b"")
    monkeypatch.setattr(metrics_mod, "_wandb_cli", lambda: ["/nonexistent/wandb-cli"])
    with pytest.warns(UserWarning, match="failed"):
        assert read_wandb_offline(log.run_dir) == read_jsonl(log.jsonl_path)


def test_wandb_init_failure_keeps_jsonl(tmp_path, monkeypatch):
    import wandb

    def boom(**kwargs):
        raise RuntimeError("no wandb today")

    monkeypatch.setattr(wandb, "init", boom)
    with pytest.warns(UserWarning, match="wandb.init failed"):
        log = MetricsLogger(_cfg(tmp_path, mode="offline"), "r")
    with log:
        assert log.wandb_run is None
        _log_all(log)
    assert len(read_jsonl(log.jsonl_path)) == len(LOGGED)


def test_wandb_import_failure_keeps_jsonl(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    with pytest.warns(UserWarning, match="could not be imported"):
        log = MetricsLogger(_cfg(tmp_path, mode="offline"), "r")
    with log:
        log.log({"x": 1.0}, step=0)
    assert read_jsonl(log.jsonl_path)[0]["x"] == 1.0


def test_run_dir_never_shared(tmp_path):
    with MetricsLogger(_cfg(tmp_path), "a") as first:
        first.log({"x": 1}, step=0)
    with MetricsLogger(_cfg(tmp_path), "b") as second:
        second.log({"x": 2}, step=0)
    assert second.run_dir.name == first.run_dir.name + "-1"
    assert read_jsonl(first.jsonl_path)[0]["x"] == 1 and read_jsonl(second.jsonl_path)[0]["x"] == 2


def test_bad_metrics_are_rejected(tmp_path):
    with MetricsLogger(_cfg(tmp_path), "r") as log:
        with pytest.raises(TypeError, match="'v' must be a scalar"):
            log.log({"v": torch.ones(3)}, step=0)
        with pytest.raises(TypeError, match="'o' must be a number"):
            log.log({"o": object()}, step=0)
        with pytest.raises(ValueError, match="reserved"):
            log.log({"step": 1}, step=0)
        with pytest.raises(TypeError, match="integer"):
            log.log({"x": 1}, step=0.5)


def test_truncated_last_line_is_skipped(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 0, "x": 1}\n{"step": 1, "x"')
    with pytest.warns(UserWarning, match="truncated"):
        assert read_jsonl(p) == [{"step": 0, "x": 1}]
    p.write_text('{"step": 0\n{"step": 1, "x": 2}\n')
    with pytest.raises(ValueError, match=":1:"):
        read_jsonl(p)


def test_resolve_wandb_mode():
    assert resolve_wandb_mode("auto", {}) == "offline"
    assert resolve_wandb_mode("auto", {"WANDB_API_KEY": "k"}) == "online"
    assert resolve_wandb_mode("auto", {"WANDB_API_KEY": "k", "WANDB_MODE": "offline"}) == "offline"
    assert resolve_wandb_mode("offline", {"WANDB_API_KEY": "k"}) == "offline"
    assert resolve_wandb_mode("disabled", {}) == "disabled"
    with pytest.raises(ValueError, match="must be one of"):
        resolve_wandb_mode("sometimes", {})
