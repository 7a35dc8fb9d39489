"""Multi-turn limits and failures: the turn limit and the context cap truncate an episode (reward 0, finish
recorded, counted in the batch metrics); a ToolError stops the run with its message in every controller mode
(lockstep, threaded async, on Ray) and no episode is left open; in-flight multi-turn groups of a
checkpoint are regenerated from their prompts and seeds; a short async RL job on task=toy_multiturn."""

from __future__ import annotations

import io
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from zeromismatch.evaluation import evaluate, make_engine
from zeromismatch.generator import SamplingParams
from zeromismatch.jobs import rl as rl_job
from zeromismatch.model_init import load_model
from zeromismatch.orchestration import runner
from zeromismatch.orchestration.build import build_rollout_worker, build_trainer, for_generation
from zeromismatch.rl.metrics import rollout_metrics
from zeromismatch.tasks.base import ToolError
from zeromismatch.tasks.registry import build_task
from zeromismatch.tasks.toy import ToyTask
from zeromismatch.tasks.toy_multiturn import ToyMultiTurnTask, tool_output
from zeromismatch.trainer.trainer import aligned_logprobs

from test_multiturn import VOCAB, make_worker, run_groups, samples_of

ROOT = Path(__file__).resolve().parents[2]
CONF = str(ROOT / "conf")


def test_turn_limit_truncates_with_reward_0(tiny_models):
    """max_turns=2: the 3-turn episodes (odd prompt ids) end their second turn without done."""
    task = ToyMultiTurnTask(VOCAB, seed=0)
    groups = run_groups(make_worker(tiny_models("tiny", "bi"), task, max_turns=2))
    for g in groups:
        for s in g.samples:
            assert len(s.turns) == 2
            if task.turns_wanted(g.prompt_id) == 3:
                assert s.finish == "max_turns" and s.reward == 0.0
            else:
                assert s.finish == "done"
    m = rollout_metrics(groups)
    assert m["rollout/truncated_fraction"] == m["rollout/truncated_max_turns_fraction"] == 0.5
    assert m["rollout/turns_mean"] == 2.0 and task.live_episodes == 0


def test_context_cap_shortens_the_last_turn_then_truncates(tiny_models):
    """Prompts of 20 tokens, 8 tokens a turn, cap 37: after turn 0 and its 2-6 tool tokens there is room for
    3-7 tokens, so turn 1 is cut to exactly the room left; a 3-turn episode then has no room: 'max_context'."""
    task = ToyMultiTurnTask(VOCAB, seed=0, min_len=20, max_len=20)
    groups = run_groups(make_worker(tiny_models("tiny", "bi"), task, context=37))
    for g in groups:
        for s in g.samples:
            tool0 = tool_output(s.turns[0].tokens, 0, VOCAB)
            assert len(s.turns) == 2 and len(s.turns[1].tokens) == 37 - 28 - len(tool0)
            assert s.token_ids.numel() == 37
            if task.turns_wanted(g.prompt_id) == 3:
                assert s.finish == "max_context" and s.reward == 0.0
            else:
                assert s.finish == "done"
    assert rollout_metrics(groups)["rollout/truncated_max_context_fraction"] == 0.5


def test_tool_error_stops_the_worker_and_close_closes_every_episode(tiny_models):
    task = ToyMultiTurnTask(VOCAB, seed=0, tool_error_turn=1)
    worker = make_worker(tiny_models("tiny", "bi"), task)
    worker.admit_available()
    with pytest.raises(ToolError, match=r"toy tool failed after model turn 1 \(task.tool_error_turn=1\)"):
        worker.drain()
    assert task.live_episodes > 0
    worker.close()
    assert task.live_episodes == 0


def test_close_mid_run_closes_live_episodes(tiny_models):
    task = ToyMultiTurnTask(VOCAB, seed=0)
    worker = make_worker(tiny_models("tiny", "bi"), task)
    worker.admit_available()
    for _ in range(5):
        worker.step()
    assert task.live_episodes > 0
    worker.close()
    assert task.live_episodes == 0


# ---------------------------------------------------------------------------------------------- runs
def cfg_for(tmp_path, *overrides):
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return compose("config", overrides=[
            "job=rl", "task=toy_multiturn", "model=tiny", "numerics=bi", "rl.prompts_per_step=2",
            "rl.samples_per_prompt=4", "rl.max_new_tokens=6", "rl.eval_every=0", "rl.offpolicy=1", "trainer.lr=1e-4",
            "logging.wandb.mode=disabled", f"logging.run_dir={tmp_path / 'run'}", *overrides])


def model_and_task(cfg):
    """The run's generation model (seeded init) and its task, as the runner builds them."""
    torch.manual_seed(0)
    model = for_generation(load_model(cfg))
    return model, build_task(cfg, vocab_size=model.config.vocab_size)


@pytest.fixture(autouse=True)
def _restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture
def built_tasks(monkeypatch):
    """The tasks the runner builds (in-process modes), to check their episodes were closed."""
    tasks = []

    def build(*a, **kw):
        tasks.append(build_task(*a, **kw))
        return tasks[-1]

    monkeypatch.setattr(runner, "build_task", build)
    return tasks


@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_tool_error_stops_the_run_in_process(tmp_path, built_tasks, mode):
    cfg = cfg_for(tmp_path, "task.tool_error_turn=0", "rl.steps=3", f"rl.deterministic={mode == 'lockstep'}")
    expected = ToolError if mode == "lockstep" else RuntimeError
    with pytest.raises(expected, match=r"toy tool failed after model turn 0"):
        rl_job.main(cfg)
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["status"] == "failed" and "toy tool failed" in status["error"]
    assert built_tasks and all(t.live_episodes == 0 for t in built_tasks)


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="rl.backend=ray needs the ray extra: pip install -e '.[ray]'")
def test_tool_error_stops_the_run_on_ray(tmp_path):
    cfg = cfg_for(tmp_path, "task.tool_error_turn=0", "rl.steps=3", "rl.deterministic=false", "rl.backend=ray",
                  "rl.checkpoint_every=0")
    with pytest.raises(ToolError, match=r"toy tool failed after model turn 0"):
        rl_job.main(cfg)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_async_job_multiturn_bi_step0_exact(tmp_path, built_tasks, temperature):
    """A short async RL job with tool turns in every batch: step-0 gap exactly 0 in bi (also sampling at 0.6,
    with tempered logprobs on both sides), ages within N, and the episodes still running when the last step
    is trained are closed at the end."""
    out = rl_job.main(cfg_for(tmp_path, "rl.steps=4", "rl.deterministic=false", f"rl.temperature={temperature}"))
    hist = out["history"]
    assert len(hist) == 4 and hist[0]["bit_wise/logprob_diff/abs_mean"] == 0.0
    assert all(h["rollout/turns_mean"] > 1 and h["rollout/tool_tokens_mean"] > 0 for h in hist)
    assert max(h["train_batch/policy_age_max"] for h in hist) <= 1
    assert built_tasks and all(t.live_episodes == 0 for t in built_tasks)


def test_rollouts_at_temperature_carry_the_logprobs_the_trainer_scores(tmp_path):
    """rl.temperature=0.6: the generator's logprobs (tool turns included) are log p under logits / 0.6, the
    trainer's loss side scores the same, bit for bit; the raw logprobs differ (so neither side is raw)."""
    cfg = cfg_for(tmp_path, "rl.temperature=0.6")
    model, task = model_and_task(cfg)
    worker = build_rollout_worker(cfg, model, task, version=0)
    worker.admit_available()
    worker.drain()
    worker.close()
    samples = [s for g in worker.buffer.untrained_groups() for s in g.samples]
    assert any(len(s.turns) > 1 for s in samples)
    trainer = build_trainer(cfg, model)
    with torch.no_grad():
        tempered = aligned_logprobs(model, samples, temperature=trainer.logprob_temperature)
        raw = aligned_logprobs(model, samples)
    for s, t, r in zip(samples, tempered, raw):
        m = s.loss_mask.bool()
        assert torch.equal(t[m], s.gen_logprobs[m])
        assert not torch.equal(r[m], s.gen_logprobs[m])


def test_in_flight_multiturn_groups_are_regenerated_with_their_seeds(tmp_path):
    cfg = cfg_for(tmp_path)
    model, task = model_and_task(cfg)

    def complete(worker) -> dict:
        worker.drain()
        worker.close()
        return {g.prompt_id: [(s.token_ids.tolist(), torch.nan_to_num(s.gen_logprobs, nan=-1.0).tolist(), s.reward) for s in g.samples]
                for g in worker.buffer.untrained_groups()}

    reference = build_rollout_worker(cfg, model, task, version=0)
    reference.admit_available()
    expected = complete(reference)

    worker = build_rollout_worker(cfg, model, task, version=0)
    worker.admit_available()
    while worker.episodes.stats["tool_tokens"] == 0:  # stop mid-episode: tool output appended, nothing complete
        assert worker.step() == 0
    with worker.lock:
        state = worker.state()
    worker.close()
    assert len(state["in_flight"]) == 4 and task.live_episodes == 0
    buf = io.BytesIO()
    torch.save(state, buf)
    resumed = build_rollout_worker(cfg, model, task, version=0, resume=torch.load(io.BytesIO(buf.getvalue()), weights_only=False))
    assert complete(resumed) == expected and task.live_episodes == 0


def test_run_py_prints_a_tool_error_as_one_line(tmp_path):
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    env.pop("HYDRA_FULL_ERROR", None)
    cmd = [sys.executable, str(ROOT / "run.py"), "job=rl", "task=toy_multiturn", "task.tool_error_turn=0", "model=tiny",
           "rl.steps=2", "rl.eval_every=0", "rl.prompts_per_step=2", "rl.samples_per_prompt=2", "rl.max_new_tokens=4",
           "logging.wandb.mode=disabled", f"logging.run_dir={tmp_path / 'run'}"]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:") or "Traceback" in line]
    assert errors == ["error: toy tool failed after model turn 0 (task.tool_error_turn=0)"], r.stderr


def test_evaluate_runs_the_episodes(tiny_models):
    """Held-out evaluation runs each prompt as an episode of the task (16 toy prompts: ids -1..-16, half of
    them wanting 3 turns), and closes them."""
    task = ToyMultiTurnTask(VOCAB, seed=0)
    task.max_context_tokens = 256  # (else the engine's max_model_len: longest prompt + one turn)
    res = evaluate(tiny_models("tiny", "bi"), task, max_new_tokens=4)
    assert res["n"] == res["samples"] == 16 and res["turns_mean"] == 2.5 and res["episodes_truncated"] == 0.0
    assert res["mean_len"] == 2.5 * 4 and task.live_episodes == 0


def test_evaluate_single_turn_is_plain_generation(tiny_models):
    """A single-turn task's evaluation is exactly engine.generate + task.reward (the path before episodes)."""
    model = tiny_models("tiny", "bi")
    task = ToyTask(VOCAB, seed=0)
    items = task.eval_prompts()
    params = [SamplingParams(temperature=1.0, max_new_tokens=6, seed=3 + i) for i in range(2 * len(items))]
    prompts = [it.prompt_ids for it in items for _ in range(2)]
    outs = make_engine(model, prompts, 6).generate(prompts, params)
    rewards = [task.reward(o.tokens, None) for o in outs]
    res = evaluate(model, task, greedy=False, max_new_tokens=6, samples_per_prompt=2, seed=3)
    assert res["accuracy"] == sum(rewards) / len(rewards) and res["truncated"] == 1.0 and res["turns_mean"] == 1.0


def test_lockstep_multiturn_kill_and_resume_is_bitwise(tmp_path):
    """Lockstep on toy_multiturn: a run resumed from the step-2 checkpoint (its buffer of complete multi-turn
    groups, the data position) logs exactly the metrics of the uninterrupted run: the multi-turn rollouts are a
    function of the seed, whenever the environment turns come back (bi)."""
    def run(name, steps, *extra):
        return rl_job.main(cfg_for(tmp_path / name, f"rl.steps={steps}", "rl.deterministic=true", "rl.checkpoint_every=2", *extra))

    full, part = run("full", 4), run("part", 2)
    resumed = run("resumed", 4, f"job.resume={Path(part['run_dir']) / 'checkpoint.pt'}")
    strip = lambda h: {k: v for k, v in h.items() if not k.startswith("perf/")}
    assert [strip(h) for h in part["history"]] == [strip(h) for h in full["history"][:2]]
    assert [strip(h) for h in resumed["history"]] == [strip(h) for h in full["history"][2:]]
    assert all(h["rollout/tool_tokens_mean"] > 0 for h in full["history"])
