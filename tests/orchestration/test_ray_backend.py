"""rl.backend=ray on a local Ray cluster: 2 generator actors and a trainer of 2 FSDP2 ranks (gloo).

- the tiny math experiment (conf/exp/tiny_math_op4_bi), lockstep: every logged metric and the trained
  weights equal the threaded run's bit for bit (the router spreads the groups over two engines; batch
  invariance makes where a group ran irrelevant; FSDP2 over 2 ranks equals one process);
- the same experiment async: step-0 diff exactly 0 in bi, every age <= N, the generators ran ahead (each weight
  push overlapping the next trainer step where the window holds its batch);
- a generator actor killed mid-run is restarted, its in-flight groups regenerated: the run completes
  with every prompt the driver admitted trained once, dropped by the age rule, or still in the buffer;
- checkpoint and resume: a lockstep run resumed from its step-2 checkpoint continues bit for bit.

Skipped where ray is not installed (`pip install -e ".[ray]"`)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

ray = pytest.importorskip("ray", reason="rl.backend=ray needs the ray extra: pip install -e '.[ray]'")

from zeromismatch.jobs import rl as rl_job  # noqa: E402

CONF = str(Path(__file__).resolve().parents[2] / "conf")
N = 4  # conf/exp/tiny_math_op4_bi
RAY = ["rl.backend=ray", "ray.generators=2", "ray.trainer_ranks=2"]


@pytest.fixture(autouse=True)
def _threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ray_math_data")


def math_cfg(data: Path, run_dir: Path, *overrides):
    """A few steps of the tiny math experiment; random init (no SFT warm start, for speed) and uniform groups
    kept, so every step trains and logs the mismatch metrics."""
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return compose("config", overrides=[
            "+exp=tiny_math_op4_bi", "rl.sft_warm_start=false", "rl.drop_uniform_groups=false",
            "rl.prompts_per_step=4", "rl.samples_per_prompt=4", "rl.max_new_tokens=24", "rl.eval_every=0",
            f"task.offline.dir={data / 'offline_math'}", "task.offline.n_train=200",
            f"task.tokenizer_cache={data / 'tokenizers'}", "logging.wandb.mode=disabled",
            f"logging.run_dir={run_dir}", *overrides])  # fmt: skip


def toy_cfg(run_dir: Path, *overrides):
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return compose("config", overrides=[
            "job=rl", "task=toy", "model=tiny", "rl.prompts_per_step=4", "rl.samples_per_prompt=4",
            "rl.max_new_tokens=12", "rl.eval_every=0", "rl.offpolicy=1", "trainer.lr=1e-4",
            "logging.wandb.mode=disabled", f"logging.run_dir={run_dir}", *RAY, *overrides])  # fmt: skip


def _logged(h: dict) -> dict:
    return {k: v for k, v in h.items() if not k.startswith("perf/")}


def _batches(run_dir) -> list[dict]:
    return [json.loads(line) for line in open(Path(run_dir) / "batches.jsonl")]


@pytest.mark.parametrize("task", ["math", "toy", "toy_multiturn"])
def test_lockstep_equals_threaded_bit_for_bit(data_dir, tmp_path, task):
    """math: the tiny math experiment's real task path (a random-init model earns no reward, so the update
    is AdamW's weight decay alone); toy: rewards with spread, so gradients flow through the FSDP reduce;
    toy_multiturn: tool turns, every turn of an episode on the generator that holds its cache."""
    steps = ["rl.steps=3", "rl.deterministic=true", "rl.checkpoint_every=3"]
    if task == "math":
        make = lambda d, *o: math_cfg(data_dir, d, *o)  # noqa: E731
    else:
        make = lambda d, *o: toy_cfg(d, *o, "rl.offpolicy=2", f"task={task}")  # noqa: E731
    threaded = rl_job.main(make(tmp_path / "threaded", *steps, "rl.backend=threaded"))
    on_ray = rl_job.main(make(tmp_path / "ray", *steps, *RAY))
    assert on_ray["history"][0]["bit_wise/logprob_diff/abs_mean"] == 0.0
    assert [_logged(h) for h in on_ray["history"]] == [_logged(h) for h in threaded["history"]]
    assert _batches(on_ray["run_dir"]) == _batches(threaded["run_dir"])
    w_threaded = torch.load(Path(threaded["run_dir"]) / "checkpoint.pt", weights_only=False)["trainer"]["model"]
    w_ray = torch.load(Path(on_ray["run_dir"]) / "checkpoint.pt", weights_only=False)["trainer"]["model"]
    assert set(w_ray) == set(w_threaded)
    assert all(torch.equal(w_ray[k], w_threaded[k]) for k in w_threaded)
    assert on_ray["history"][-1]["bit_wise/logprob_diff/abs_mean"] > 0  # the weights moved between versions
    assert all(h["perf/weight_sync/overlap_seconds"] == 0.0 for h in on_ray["history"])  # lockstep: pushed, then trained
    if task != "math":
        assert all(h["train/grad_norm"] > 0 for h in on_ray["history"])
    if task == "toy_multiturn":
        assert all(h["rollout/turns_mean"] > 1 for h in on_ray["history"])


def test_async_tiny_math_step0_zero_and_ages_within_n(data_dir, tmp_path):
    out = rl_job.main(math_cfg(data_dir, tmp_path / "async", "rl.steps=4", "rl.deterministic=false",
                               "rl.checkpoint_every=0", "rl.eval_every=4", *RAY))
    hist = out["history"]
    assert [h["step"] for h in hist] == [0, 1, 2, 3]
    assert hist[0]["bit_wise/logprob_diff/abs_mean"] == 0.0
    ages = [h["train_batch/policy_age_max"] for h in hist]
    assert max(ages) <= N and max(ages) >= 1  # the generators ran ahead of the trainer
    assert [h["train/version"] for h in hist] == [1, 2, 3, 4]
    assert "validation_reward/_mean" in hist[-1]
    assert out["generator_restarts"] == 0 and out["weight_sync"] == "gloo"
    # how long each step trained with the previous version's push in flight (tests/orchestration/test_push_overlap.py)
    assert all("perf/weight_sync/overlap_seconds" in h and "perf/weight_sync/push_seconds" in h for h in hist)


def _kill_generator_when_busy(run_dir: Path, done: threading.Event, killed: list) -> None:
    """Once the run's loop has started (its batches.jsonl exists) and step 0 is logged, kill generator-1 (Ray
    restarts it) at a moment it holds groups in flight."""
    path = run_dir / "batches.jsonl"
    while not done.is_set():
        if path.exists() and path.read_text().strip():
            gen = ray.get_actor("generator-1")
            if ray.get(gen.in_flight.remote()) > 0:
                ray.kill(gen, no_restart=False)
                killed.append(time.time())
                return
        time.sleep(0.01)


def test_generator_killed_mid_run_loses_no_group(tmp_path):
    run_dir, steps = tmp_path / "kill", 8
    done, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_generator_when_busy, args=(run_dir, done, killed), daemon=True)
    killer.start()
    try:
        out = rl_job.main(toy_cfg(run_dir, f"rl.steps={steps}", "rl.deterministic=false", f"rl.checkpoint_every={steps}",
                                  "rl.offpolicy=2"))
    finally:
        done.set()
        killer.join()
    assert killed, "the generator was never killed"
    assert out["generator_restarts"] == 1 and out["groups_regenerated"] >= 1
    hist = out["history"]
    assert [h["step"] for h in hist] == list(range(steps))
    assert max(h["train_batch/policy_age_max"] for h in hist) <= 2
    # toy prompt ids are stream positions: each admitted prompt trained once, dropped, or still buffered
    trained = [p for b in _batches(run_dir) for p in b["prompt_ids"]]
    assert len(trained) == len(set(trained)) == 4 * steps
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    buffered = [g.prompt_id for g in ckpt["buffer"].untrained_groups()] + [it.prompt_id for _, it, _ in ckpt["in_flight"]]
    dropped = int(sum(h["offpolicy/dropped_stale"] + h["offpolicy/dropped_filtered"] for h in hist))
    assert not set(trained) & set(buffered)
    assert len(trained) + len(buffered) + dropped == ckpt["prompts_consumed"]
    assert set(trained) | set(buffered) <= set(range(ckpt["prompts_consumed"]))


def test_checkpoint_resume_is_bitwise(tmp_path):
    lock = ["rl.deterministic=true", "rl.offpolicy=2"]
    full = rl_job.main(toy_cfg(tmp_path / "full", "rl.steps=4", "rl.checkpoint_every=0", *lock))
    part = rl_job.main(toy_cfg(tmp_path / "part", "rl.steps=2", "rl.checkpoint_every=2", *lock))
    resumed = rl_job.main(toy_cfg(tmp_path / "resumed", "rl.steps=4", *lock,
                                  f"job.resume={Path(part['run_dir']) / 'checkpoint.pt'}"))
    assert [_logged(h) for h in part["history"] + resumed["history"]] == [_logged(h) for h in full["history"]]
