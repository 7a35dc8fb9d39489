"""Async resume after kill -9, threaded and on Ray: the run killed just after its first checkpoint is
resumed from it and reaches its last step, with no completed rollout lost or trained twice and every age
within offpolicy N.

The accounting uses the toy task, whose prompt ids are their positions in the train stream (0, 1, 2, ...):
every prompt the generator took from the stream must end up trained exactly once, dropped by the offpolicy-N
rule (counted in the metrics), or still be in the final checkpoint's buffer (complete or in flight)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from zeromismatch.logging import read_jsonl, read_status

ROOT = Path(__file__).resolve().parents[2]
N, STEPS = 1, 8


def _cmd(*overrides: str) -> list[str]:
    return [sys.executable, str(ROOT / "run.py"), "job=rl", "task=toy", "model=tiny", "numerics=bi",
            "rl.prompts_per_step=4", "rl.samples_per_prompt=4", "rl.max_new_tokens=12", "rl.eval_every=0",
            f"rl.offpolicy={N}", f"rl.steps={STEPS}", "rl.checkpoint_every=2", "rl.deterministic=false",
            "trainer.lr=1e-4", *overrides]


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src"), "HYDRA_FULL_ERROR": "1"}


def _run_and_kill(cmd: list[str], ckpt: Path, timeout: float = 240) -> None:
    """Start ``cmd`` in a process group of its own; SIGKILL the whole group (a Ray run's local cluster
    too) as soon as the first checkpoint is on disk."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    t0 = time.time()
    try:
        while not ckpt.exists():
            if proc.poll() is not None:
                pytest.fail(f"run exited ({proc.returncode}) before its first checkpoint: {proc.stderr.read().decode()[-3000:]}")
            if time.time() - t0 > timeout:
                pytest.fail("no checkpoint within the time limit")
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.parametrize("mode", ["threaded", pytest.param("ray", marks=pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="rl.backend=ray needs the ray extra: pip install -e '.[ray]'"))])
def test_kill_9_and_resume_keeps_offpolicy_semantics(tmp_path, mode):
    run_dir = tmp_path / "run"
    ckpt = run_dir / "checkpoint.pt"
    extra = {"threaded": ["logging.wandb.mode=offline"], "ray": ["rl.backend=ray", "logging.wandb.mode=disabled"]}[mode]
    _run_and_kill(_cmd(*extra, f"logging.run_dir={run_dir}"), ckpt)
    assert read_status(run_dir)["status"] == "running"  # killed: never marked completed
    killed_at = torch.load(ckpt, weights_only=False)
    k = killed_at["step"]
    assert 0 < k < STEPS, k

    # resume names only the checkpoint: the folder (Hydra's too) is the killed run's
    r = subprocess.run(_cmd(*extra, f"job.resume={ckpt}"), cwd=ROOT, env=_env(), capture_output=True, text=True,
                       timeout=600, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-5000:]
    assert read_status(run_dir)["status"] == "completed"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # one folder for both invocations
    assert (run_dir / ".hydra" / "config.yaml").is_file() and (run_dir / "run.log").is_file()

    metrics = read_jsonl(run_dir)
    assert [m["step"] for m in metrics] == list(range(STEPS))  # the killed tail was replaced, not appended
    assert [m["train/version"] for m in metrics] == list(range(1, STEPS + 1))
    assert max(m["train_batch/policy_age_max"] for m in metrics) <= N
    batches = [json.loads(line) for line in (run_dir / "batches.jsonl").read_text().splitlines()]
    assert [b["step"] for b in batches] == list(range(STEPS))
    assert all(0 <= a <= N for b in batches for a in b["ages"])

    trained = [p for b in batches for p in b["prompt_ids"]]
    assert len(trained) == len(set(trained)) == STEPS * 4, "a group was trained twice"
    final = torch.load(ckpt, weights_only=False)
    assert final["step"] == STEPS
    waiting = {g.prompt_id for g in final["buffer"].untrained_groups()} | {item.prompt_id for _, item, _ in final["in_flight"]}
    dropped = sum(m["offpolicy/dropped_stale"] + m["offpolicy/dropped_filtered"] for m in metrics)
    missing = set(range(final["prompts_consumed"])) - set(trained) - waiting
    assert len(missing) == dropped, f"prompts lost across the kill: {sorted(missing)} (dropped by the rule: {dropped})"

    # what the checkpoint held as complete or in flight was trained after the resume (or dropped as stale)
    held = {g.prompt_id for g in killed_at["buffer"].untrained_groups()} | {item.prompt_id for _, item, _ in killed_at["in_flight"]}
    after = {p for b in batches if b["step"] >= k for p in b["prompt_ids"]}
    assert len(held - after - waiting) <= dropped
    if mode == "threaded":  # the W&B run continues under its id (offline: a second folder, merged on sync)
        ids = {p.name.rsplit("-", 1)[1] for p in (run_dir / "wandb").glob("offline-run-*")}
        assert len(ids) == 1 and len(list((run_dir / "wandb").glob("offline-run-*"))) == 2


def test_checkpoint_keeps_only_weight_versions_the_buffer_needs(tmp_path):
    """The weight history in a checkpoint is the versions that produced tokens still to be trained; the
    current one is the model itself."""
    r = subprocess.run(_cmd("logging.wandb.mode=disabled", "rl.steps=2", f"logging.run_dir={tmp_path / 'run'}"),
                       cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    ckpt = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)
    needed = set()
    for g in ckpt["buffer"].untrained_groups():
        for s in g.samples:
            needed |= set(s.gen_version[s.loss_mask.bool()].tolist())
    assert set(ckpt["trainer"]["history"]) == needed - {ckpt["trainer"]["version"]}
