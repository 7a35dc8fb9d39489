"""run.py end to end (smoke job, job errors, a sweep) and every config in conf/ composing as documented."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from zeromismatch.jobs import JOBS, JobError, get_job
from zeromismatch.jobs.smoke import main as smoke_main
from zeromismatch.logging import read_jsonl
from zeromismatch.models.qwen3_5 import PRESETS, build_model, save_checkpoint
from zeromismatch.numerics.modes import MODES
from zeromismatch.tasks.math.data import AIME2025_HUB_NAME, DAPO_HUB_NAME
from zeromismatch.tasks.math.prompts import dapo_prompt

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
EXPS = sorted(p.stem for p in (CONF / "exp").glob("*.yaml"))
EXP_RE = re.compile(r"^(?P<tiny>tiny_)?(?P<family>math_moe|math|search|agent)_op(?P<op>\d+)_(?P<num>bi_chunk|bi|stock)$")
FAMILY_MODEL = {"math": "qwen3_5_9b", "math_moe": "qwen3_5_35b_a3b", "search": "qwen3_5_9b", "agent": "qwen3_5_9b"}
FAMILY_TASK = {"math": "math", "math_moe": "math", "search": "search", "agent": "agent"}


def _run(tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    # one thread: on a shared 2-core machine torch's default 2 threads spin against other processes (~20x slower)
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    env.pop("WANDB_API_KEY", None)
    cmd = [
        sys.executable,
        "run.py",
        *args,
        f"logging.root={tmp_path / 'runs'}",  # Hydra's run dir (a sweep's job dirs too) is the run's folder under it
    ]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _compose(*overrides: str, hydra_cfg: bool = False):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra_cfg)


# ------------------------------------------------------------------------------------- subprocess


def test_smoke_job_runs(tmp_path):
    r = _run(tmp_path, "job=smoke", "model=tiny", "numerics=bi", "job.steps=2")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "4,471,384 parameters; batch 8 x 128" in out
    losses = [float(x) for x in re.findall(r"loss (\d+\.\d+)", out)]
    assert len(losses) == 2 and losses[1] < losses[0], out
    assert len(re.findall(r"tokens/s [\d,]+", out)) == 2, out
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.endswith("smoke-tiny-bi")
    rows = read_jsonl(run_dir)
    assert [row["step"] for row in rows] == [0, 1]
    assert all(row["train/loss"] > 0 and row["perf/trainer/tokens_per_second_fwd_bwd"] > 0 for row in rows)
    assert list((run_dir / "wandb").glob("offline-run-*/*.wandb")), "no offline W&B run written"
    assert (run_dir / ".hydra" / "config.yaml").is_file() and (run_dir / "run.log").is_file()  # one folder


def test_unknown_job_group_lists_jobs(tmp_path):
    r = _run(tmp_path, "job=nope")
    assert r.returncode != 0
    assert "Could not find 'job/nope'" in r.stderr
    for name in JOBS:
        assert name in r.stderr


def test_unknown_job_name_lists_jobs(tmp_path):
    r = _run(tmp_path, "job.name=nope")
    assert r.returncode == 2
    assert "unknown job 'nope'" in r.stderr
    for name in JOBS:
        assert name in r.stderr


def test_sweep_over_experiments(tmp_path):
    r = _run(
        tmp_path,
        "-m",
        "+exp=tiny_math_op4_bi,tiny_math_op4_stock",
        "job=smoke",  # the experiments' own job (rl) may not exist yet; the sweep machinery is what is tested
        "job.steps=1",
        "job.batch_size=1",
        "job.seq_len=16",
        "logging.wandb.mode=disabled",
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "numerics bi," in out and "numerics stock," in out
    names = sorted(p.name.split("_", 3)[-1] for p in (tmp_path / "runs").iterdir() if p.is_dir())  # <time>_<n>_<name>
    assert names == ["tiny_math_op4_bi", "tiny_math_op4_stock"]


def test_smoke_job_from_checkpoint(tmp_path):
    save_checkpoint(build_model("tiny", "stock", seed=3), tmp_path / "ckpt")
    cfg = _compose(
        "job=smoke",
        "numerics=stock",
        f"model.checkpoint={tmp_path / 'ckpt'}",
        "job.steps=2",
        "job.batch_size=1",
        "job.seq_len=16",
        f"logging.root={tmp_path / 'runs'}",
        "logging.wandb.mode=disabled",
    )
    OmegaConf.resolve(cfg)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in _run: two spinning threads are slow on a shared 2-core machine
    try:
        result = smoke_main(cfg)
    finally:
        torch.set_num_threads(threads)
    assert result["parameters"] == 4_471_384 and len(result["losses"]) == 2 and result["loss_decreased"]
    assert [r["step"] for r in read_jsonl(result["run_dir"])] == [0, 1]


# --------------------------------------------------------------------------------------- registry


def test_registry_resolves_smoke_and_reports_missing_modules(monkeypatch):
    assert callable(get_job("smoke"))
    monkeypatch.setitem(JOBS, "ghost", "zeromismatch.jobs._not_written:main")
    with pytest.raises(JobError, match="job 'ghost' is not available yet"):
        get_job("ghost")
    with pytest.raises(JobError, match=r"unknown job 'nope'; available jobs: .*smoke"):
        get_job("nope")


def test_every_job_has_a_config():
    assert {p.stem for p in (CONF / "job").glob("*.yaml")} == set(JOBS)
    for name in JOBS:
        assert _compose(f"job={name}").job.name == name


# ---------------------------------------------------------------------------------------- configs


def test_defaults():
    cfg = _compose(hydra_cfg=True)
    assert (cfg.job.name, cfg.model.preset, cfg.numerics.name, cfg.task.name) == ("rl", "tiny", "bi", "math")
    assert (cfg.rl.offpolicy, cfg.rl.loss, cfg.rl.clip_low, cfg.rl.clip_high) == (4, "dapo", 0.2, 0.28)
    assert cfg.generator.backend == "embedded" and cfg.trainer.optimizer == "adamw"
    assert cfg.logging.wandb.mode == "auto" and cfg.task.offline.dir == "data/offline_math"
    assert cfg.hydra.job.chdir is False
    hydra_dirs = OmegaConf.to_container(cfg.hydra, resolve=False)
    assert hydra_dirs["run"]["dir"] == "${logging.run_dir}" and hydra_dirs["sweep"]["dir"] == "${logging.root}"


def test_group_options_match_code():
    for p in (CONF / "model").glob("*.yaml"):
        cfg = _compose(f"model={p.stem}")
        assert cfg.model.preset == p.stem and p.stem in PRESETS
    assert {p.stem for p in (CONF / "model").glob("*.yaml")} == set(PRESETS)
    assert {p.stem for p in (CONF / "numerics").glob("*.yaml")} == set(MODES)
    for mode in MODES:
        assert _compose(f"numerics={mode}").numerics.name == mode


def test_task_configs():
    math = _compose("task=math").task
    assert math.prompt_template.format(problem="What is 1+1?") == dapo_prompt("What is 1+1?")
    assert (math.hub.train, math.hub.eval) == (DAPO_HUB_NAME, AIME2025_HUB_NAME)
    assert math.implemented is True
    assert _compose("task=search").task.implemented is True
    assert _compose("task=agent").task.implemented is True


def test_experiment_matrix_is_complete():
    expected = {f"math_op{op}_{n}" for op in (4, 12, 32) for n in ("bi", "stock", "bi_chunk")}
    expected |= {f"{fam}_{n}" for fam in ("math_moe_op12", "search_op4", "agent_op4") for n in ("bi", "stock")}
    expected |= {f"tiny_{fam}_op4_{n}" for fam in ("math", "search", "agent") for n in ("bi", "stock", "bi_chunk")}
    assert set(EXPS) == expected


@pytest.mark.parametrize("exp", EXPS)
def test_experiment_composes(exp):
    m = EXP_RE.match(exp)
    assert m, f"conf/exp/{exp}.yaml does not follow <family>_op<N>_<numerics>"
    cfg = _compose(f"+exp={exp}")
    OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves
    family, tiny = m["family"], bool(m["tiny"])
    assert cfg.model.preset == ("tiny" if tiny else FAMILY_MODEL[family])
    assert cfg.numerics.name == m["num"]
    assert cfg.rl.offpolicy == int(m["op"])
    assert cfg.task.name == FAMILY_TASK[family]
    assert cfg.job.name == "rl" and cfg.run_name == exp
    assert cfg.device == ("cpu" if tiny else "cuda")
    if family in ("math", "math_moe") and not tiny:  # the published recipe (conf/recipe/math.yaml)
        rl = cfg.rl
        assert (rl.prompts_per_step, rl.samples_per_prompt, rl.max_new_tokens) == (8, 16, 8192)
        assert (rl.loss, rl.clip_low, rl.clip_high, rl.temperature) == ("dapo", 0.2, 0.28, 1.0)
        assert (rl.steps, rl.eval_every, cfg.trainer.lr) == (200, 10, 1e-6)
        assert cfg.task.source == "hub"
    if family == "agent":
        assert cfg.rl.loss == "dppo" and cfg.rl.dppo_delta == 0.1
        if not tiny:  # the published recipe: 64 turns in a 64K context, 120 s per command
            assert (cfg.task.max_turns, cfg.task.max_context_tokens) == (64, 65536)
            assert cfg.task.sandbox.command_timeout_s == 120 and cfg.task.source == "rows"
    if family == "search":
        assert cfg.rl.adv_std_norm is True and cfg.task.max_turns == 4
    if tiny:
        assert cfg.task.source == "offline"


def test_command_line_beats_experiment():
    cfg = _compose("+exp=math_op12_bi", "numerics=stock", "model=tiny", "rl.offpolicy=7")
    assert (cfg.model.preset, cfg.numerics.name, cfg.rl.offpolicy, cfg.rl.max_new_tokens) == ("tiny", "stock", 7, 8192)
