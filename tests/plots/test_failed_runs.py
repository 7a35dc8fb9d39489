"""Runs that failed, or stopped before their first metric, are skipped with a warning (status.json, written by
zeromismatch.logging.run_status): a broken run in runs/ does not stop `job=plot` or the notebook."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from zeromismatch.logging import write_status
from zeromismatch.plots import find_run_dirs, load_runs

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plot_synth as synth  # noqa: E402


def test_failed_and_empty_runs_are_skipped(tmp_path):
    root = tmp_path / "runs"
    good = synth.write_run(root, "bi", 4)
    write_status(good, "completed")
    failed = root / "2026-01-01_00-00-05_failed"  # failed before writing anything but its status
    write_status(failed, "failed", "ValueError: rl.steps must be an integer")
    killed = root / "2026-01-01_00-00-06_killed"  # killed before its first metric
    killed.mkdir()
    (killed / "config.json").write_text(json.dumps(synth.config("bi", 4)))
    write_status(killed, "running")
    with pytest.warns(UserWarning) as caught:
        assert find_run_dirs(root) == [good]
        assert [r.path for r in load_runs(str(root / "*"))] == [good]
    messages = " ".join(str(w.message) for w in caught)
    assert "rl.steps must be an integer" in messages and "running and has no metrics" in messages
