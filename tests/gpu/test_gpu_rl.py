"""The RL job on CUDA: a few async steps of the tiny math experiment (conf/exp/tiny_math_op4_<mode>) in bf16
(fp32 GDN state, lm_head and logprobs) in each numerics mode, threaded and on Ray (ray=one_gpu: a generator
actor and a trainer actor sharing cuda:0 by fractional GPU reservations, the weights pushed GPU to GPU by CUDA
IPC; skipped where ray is not installed). The run goes through the real math task (prompts, rollouts, the verifier reward),
the train step, the staleness split, held-out evaluation and a checkpoint.

A random-init model (no SFT warm start, for speed) never writes a marked answer, so every group is all-wrong;
rl.drop_uniform_groups=false keeps those groups so that every step still runs the loss and the mismatch
metrics. Skipped without CUDA."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from zeromismatch.jobs import rl as rl_job

pytestmark = pytest.mark.gpu

CONF = str(Path(__file__).resolve().parents[2] / "conf")
OFFPOLICY = 4  # conf/exp/tiny_math_op4_*
STEPS = 3


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Offline math problems and the tiny tokenizer, built once for the module (seconds)."""
    return tmp_path_factory.mktemp("gpu_rl_data")


def rl_cfg(data: Path, run_dir: Path, mode: str, *overrides, device: str = "cuda", dtype: str = "bfloat16"):
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return compose(
            "config",
            overrides=[
                f"+exp=tiny_math_op4_{mode}", f"device={device}", f"trainer.dtype={dtype}",
                f"rl.steps={STEPS}", "rl.deterministic=false", "rl.sft_warm_start=false",
                "rl.drop_uniform_groups=false", "rl.prompts_per_step=4", "rl.samples_per_prompt=4",
                "rl.max_new_tokens=32", f"rl.eval_every={STEPS}", f"rl.checkpoint_every={STEPS}",
                f"task.offline.dir={data / 'offline_math'}", "task.offline.n_train=400",
                f"task.tokenizer_cache={data / 'tokenizers'}",
                "logging.wandb.mode=disabled", f"logging.run_dir={run_dir}", *overrides,
            ],
        )


def check_run(out: dict, mode: str) -> None:
    hist = out["history"]
    assert [h["step"] for h in hist] == list(range(STEPS))
    step0 = hist[0]["bit_wise/logprob_diff/abs_mean"]
    if mode == "stock":
        assert step0 > 0.0, step0
    else:
        assert step0 == 0.0, step0
        # after step 0 only samples a weight swap mixed may differ from the trainer at their versions
        unmixed = "bit_wise/logprob_diff/precision_unmixed_abs_mean"
        assert all(h[unmixed] == 0.0 for h in hist if unmixed in h), [h.get(unmixed) for h in hist]
    assert max(h["train_batch/policy_age_max"] for h in hist) <= OFFPOLICY
    for h in hist:
        assert torch.isfinite(torch.tensor(h["train/loss"])), h
    assert "validation_reward/_mean" in hist[-1]
    # the trainer's process reports its GPU memory every step (peak so far, held now)
    assert all(h["perf/gpu/max_allocated_gib"] > 0 and h["perf/gpu/reserved_gib"] > 0 for h in hist), hist[-1]
    run_dir = Path(out["run_dir"])
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    assert [r["step"] for r in rows if "train/loss" in r] == list(range(STEPS))
    assert (run_dir / "checkpoint.pt").is_file()


SCHEDULES = {"threaded": ["rl.backend=threaded"], "ray": ["rl.backend=ray", "ray=one_gpu"]}
RAY_MISSING = importlib.util.find_spec("ray") is None


@pytest.mark.parametrize("schedule", ["threaded", pytest.param("ray", marks=pytest.mark.skipif(
    RAY_MISSING, reason="rl.backend=ray needs the ray package (pip install -e '.[ray]')"))])
@pytest.mark.parametrize("mode", ["stock", "bi", "bi_chunk"])
def test_gpu_rl_async_steps(data_dir, tmp_path, mode, schedule):
    cfg = rl_cfg(data_dir, tmp_path / "run", mode, *SCHEDULES[schedule])
    n_threads = torch.get_num_threads()
    try:
        out = rl_job.main(cfg)
    finally:
        torch.set_num_threads(n_threads)  # async runs pin one intra-op thread
    check_run(out, mode)
    if schedule == "ray":
        assert out["weight_sync"] == "cuda_ipc"  # the weights moved GPU to GPU between the two actors
