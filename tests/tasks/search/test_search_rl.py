"""A short RL job on the search task (tiny, CPU, bi): tool turns in every batch, step-0 gap exactly 0, ages within
N, and the managed retriever server the run started is gone when the job ends."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from zeromismatch.config_schema import resolve_config
from zeromismatch.jobs import rl as rl_job
from zeromismatch.orchestration import runner
from zeromismatch.tasks.registry import build_task

CONF = str(Path(__file__).resolve().parents[3] / "conf")


@pytest.fixture(autouse=True)
def _restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_search_rl_job(tmp_path, monkeypatch):
    with initialize_config_dir(CONF, version_base="1.3"):
        cfg = compose("config", overrides=[
            "+exp=tiny_search_op4_bi", "rl.sft_warm_start=false", "rl.steps=2", "rl.prompts_per_step=2",
            "rl.samples_per_prompt=2", "rl.eval_every=0", "rl.drop_uniform_groups=false", "rl.deterministic=false", "rl.checkpoint_every=0",
            f"task.offline.dir={tmp_path / 'kb'}", "task.offline.n_people=20", "task.offline.n_heldout=4",
            f"task.tokenizer_cache={tmp_path / 'tok'}", f"task.retriever.index_cache={tmp_path / 'bm25'}",
            "logging.wandb.mode=disabled", f"logging.run_dir={tmp_path / 'run'}",
        ])  # fmt: skip
    resolve_config(cfg)
    pids = []

    def build(*a, **kw):  # start each task's retriever at once, to see it stopped at the end
        task = build_task(*a, **kw)
        task.client()
        pids.append(task._service.pid)
        return task

    monkeypatch.setattr(runner, "build_task", build)
    hist = rl_job.main(cfg)["history"]
    assert len(hist) == 2 and hist[0]["bit_wise/logprob_diff/abs_mean"] == 0.0
    assert all(h["rollout/turns_mean"] > 1 and h["rollout/tool_tokens_mean"] > 0 for h in hist)
    assert max(h["train_batch/policy_age_max"] for h in hist) <= 4
    assert pids
    time.sleep(0.2)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
