"""The config schema (zeromismatch/config_schema.py): every config in conf/ validates; a bad key, type or value,
or an experiment this machine cannot run, fails with one line naming the key, the value and what is allowed;
run.py says so in seconds, exit status 2, before it writes any data."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException

from zeromismatch.config_schema import GENERATOR, JOB, TASK, check_config, check_runnable, hydra_error_line, resolve_config, validate_config
from zeromismatch.errors import ConfigError, MissingFileError
from zeromismatch.jobs import JOBS

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
EXPS = sorted(p.stem for p in (CONF / "exp").glob("*.yaml"))
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name not in ("exp", "recipe", "scale"))  # scale: tests/test_scale.py


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    resolve_config(cfg)
    return cfg


def _error(*overrides: str, cuda_available: bool = False) -> str:
    with pytest.raises(ConfigError) as e:
        check_config(_compose(*overrides), cuda_available=cuda_available)
    message = str(e.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------------------------- every config validates


def test_variant_groups_cover_their_yaml_files():
    assert set(JOB) == set(JOBS) == {p.stem for p in (CONF / "job").glob("*.yaml")}
    assert set(TASK) == {p.stem for p in (CONF / "task").glob("*.yaml")}
    assert set(GENERATOR) == {p.stem for p in (CONF / "generator").glob("*.yaml")}


@pytest.mark.parametrize("group", GROUPS)
def test_every_group_option_validates(group):
    for option in sorted(p.stem for p in (CONF / group).glob("*.yaml")):
        validate_config(_compose(f"{group}={option}"))  # also: no key of the yaml is missing from the schema


def test_default_config_runs_here():
    check_config(_compose(), cuda_available=False)


@pytest.mark.parametrize("exp", EXPS)
def test_every_experiment_validates(exp, tmp_path):
    cfg = _compose(f"+exp={exp}")
    validate_config(cfg)
    if exp.startswith("tiny_"):
        check_runnable(cfg, cuda_available=False)
    elif exp.startswith("search_"):  # local weights and data, each named when absent
        with pytest.raises(MissingFileError, match=r"^file not found: data/search_r1/train.parquet \(task.files.train\)"):
            check_runnable(cfg, cuda_available=True)
        files = {k: tmp_path / f"{k}.x" for k in ("train", "eval", "corpus")}
        for f in files.values():
            f.write_text("")
        over = [f"task.files.{k}={v}" for k, v in files.items()]
        with pytest.raises(MissingFileError, match=r"^file not found: checkpoints/qwen3_5_9b \(model.checkpoint"):
            check_runnable(_compose(f"+exp={exp}", *over), cuda_available=True)
        check_runnable(_compose(f"+exp={exp}", *over, f"model.checkpoint={tmp_path}"), cuda_available=True)
    elif exp.startswith("agent_"):  # the published task rows are local files: absent here, named at once
        for cuda in (False, True):
            with pytest.raises(MissingFileError, match=r"^file not found: data/agent/train.jsonl \(task.rows.train\)$"):
                check_runnable(cfg, cuda_available=cuda)
        rows = tmp_path / "rows.jsonl"
        rows.write_text("")
        with_rows = (f"task.rows.train={rows}", f"task.rows.eval={rows}")
        with pytest.raises(ConfigError, match=r"^model=qwen3_5_9b has no weights: set model.checkpoint="):
            check_runnable(_compose(f"+exp={exp}", *with_rows), cuda_available=True)
        check_runnable(_compose(f"+exp={exp}", *with_rows, f"model.checkpoint={tmp_path}"), cuda_available=True)
    else:  # the published-size math runs: a GPU and local weights
        with pytest.raises(ConfigError, match=rf"^device=cuda: this machine has no CUDA device .* model={cfg.model.preset} needs a GPU"):
            check_runnable(cfg, cuda_available=False)
        with pytest.raises(ConfigError, match=rf"^model={cfg.model.preset} has no weights: set model.checkpoint="):
            check_runnable(cfg, cuda_available=True)
        check_runnable(_compose(f"+exp={exp}", f"model.checkpoint={tmp_path}"), cuda_available=True)


def test_sweep_values_validate_one_by_one():
    for offpolicy in (0, 4, 32):
        validate_config(_compose("+exp=tiny_math_op4_bi", f"rl.offpolicy={offpolicy}"))


# ----------------------------------------------------------------------------------------- the messages


@pytest.mark.parametrize(
    "override, message",
    [
        ("rl.steps=abc", "rl.steps='abc': expected an integer >= 1 (conf/rl/default.yaml)"),
        ("rl.offpolicy=-3", "rl.offpolicy=-3: expected an integer >= 0 (conf/rl/default.yaml)"),
        ("rl.steps=true", "rl.steps=True: expected an integer >= 1 (conf/rl/default.yaml)"),
        ("rl.temperature=-1.5", "rl.temperature=-1.5: expected a number >= 0 (conf/rl/default.yaml)"),
        ("rl.loss=ppo", "rl.loss='ppo': expected one of dapo, grpo, dppo (conf/rl/default.yaml)"),
        ("rl.icepop=[5.0,0.5]", "rl.icepop=[5.0, 0.5]: expected null or [low, high] with 0 <= low <= high (conf/rl/default.yaml)"),
        ("trainer.lr=0", "trainer.lr=0: expected a number > 0 (conf/trainer/default.yaml)"),
        ("trainer.betas=[0.9]", "trainer.betas=[0.9]: expected a list of 2 of number >= 0 and < 1 (conf/trainer/default.yaml)"),
        ("numerics.gemm_policy=fast", "numerics.gemm_policy='fast': expected one of fixed, adaptive, hybrid (conf/numerics/bi.yaml)"),
        ("task.offline.levels=[7]", "task.offline.levels=[7]: expected a list of integer >= 1 and <= 4 or null (conf/task/math.yaml)"),
        ("device=gpu", "device='gpu': expected cpu, cuda or cuda:<index> (conf/config.yaml)"),
        ("seed=-1", "seed=-1: expected an integer >= 0 (conf/config.yaml)"),
        ("logging.wandb.mode=cloud", "logging.wandb.mode='cloud': expected one of auto, offline, online, disabled (conf/logging/default.yaml)"),
    ],
)
def test_bad_value_names_key_value_and_what_is_allowed(override, message):
    assert _error(override) == message


def test_job_keys_are_checked_per_job():
    assert _error("job=smoke", "job.steps=0") == "job.steps=0: expected an integer >= 1 (conf/job/smoke.yaml)"
    assert _error("job=plot", "job.figures=[reward,loss]").startswith(
        "job.figures=['reward', 'loss']: expected one of all, or a list of one of reward, validation, mismatch, cost"
    )


def test_unknown_key_is_named_with_a_suggestion():
    message = _error("+rl.stpes=3")
    assert message.startswith("rl.stpes: unknown key; did you mean rl.steps? rl takes offpolicy, ")
    assert message.endswith("(conf/rl/default.yaml)")
    assert _error("+colour=red") == "colour: unknown top-level key (conf/config.yaml)"
    assert _error("+model.overrides.hidden_sz=3").startswith(
        "model.overrides={'hidden_sz': 3}: expected a mapping of Qwen35Config fields"
    )


def test_removed_key_is_missing():
    assert _error("~rl.swap_policy") == "rl.swap_policy: missing; expected one of keep, recompute (conf/rl/default.yaml)"


REMOVED_DISAGGREGATED = ("rl.disaggregated=true: removed; the disaggregated run (trainer and generators in processes of "
                         "their own) is rl.backend=ray (conf/ray/default.yaml, docs/distributed.md)")


def test_a_key_that_is_gone_names_what_replaced_it():
    assert _error("+rl.disaggregated=true") == REMOVED_DISAGGREGATED  # e.g. set by an old experiment yaml
    with pytest.raises(HydraException) as e:
        _compose("rl.disaggregated=true")
    assert hydra_error_line(e.value) == REMOVED_DISAGGREGATED


def test_what_this_machine_cannot_run():
    cuda = _error("device=cuda")
    assert cuda.startswith("device=cuda: this machine has no CUDA device (torch ") and cuda.endswith("; use device=cpu")
    assert _error("model=qwen3_5_9b") == "model=qwen3_5_9b needs a GPU (device=cuda); on this CPU use model=tiny, tiny_moe or qwen3_5_mid"
    if importlib.util.find_spec("vllm") is None:
        assert _error("generator=vllm") == ("generator=vllm needs vLLM: pip install -e '.[vllm]' (or "
                                            "scripts/install_vllm.sh), or use generator=embedded")
    assert _error("generator=vllm", "rl.swap_policy=recompute") == "rl.swap_policy='recompute': generator=vllm supports keep only"
    assert _error("generator=vllm", "rl.temperature=0.6") == (
        "rl.temperature=0.6: generator=vllm returns raw logprobs, which a loss at temperature != 1 cannot use; "
        "set rl.temperature=1.0 or use generator=embedded")
    check_config(_compose("task=search"), cuda_available=False)
    assert _error("task=search", "task.source=files", "task.files.train=/x.parquet", "task.files.eval=/y.parquet") == (
        "task.files.corpus=null and task.retriever.url=null: give a corpus JSONL to serve or a running retriever's URL "
        "(conf/task/search.yaml)"
    )
    with pytest.raises(MissingFileError, match=r"^file not found: /no/such/dir \(model.checkpoint"):
        check_config(_compose("model.checkpoint=/no/such/dir"), cuda_available=False)


def test_interpolation_error_names_the_key():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["rl.steps=${oops}"])
    with pytest.raises(ConfigError, match=r"^rl.steps: Interpolation key 'oops' not found$"):
        resolve_config(cfg)


@pytest.mark.parametrize(
    "override, message",
    [
        ("rl.foo=1", "rl.foo: unknown key; Could not override 'rl.foo'; To append to your config use +rl.foo=1"),
        ("job=nope", "Could not find 'job/nope'; Available options in 'job': bench, eval, parity, plot, retriever, rl, sft, smoke"),
        ("rl.steps=[", "no viable alternative at input '['"),
    ],
)
def test_hydra_errors_as_one_line(override, message):
    with pytest.raises(HydraException) as e:
        _compose(override)
    assert hydra_error_line(e.value) == message


# ------------------------------------------------------------------------------------------- run.py


def _run(cwd: Path, *args: str, debug: bool = False) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    if debug:
        env["HYDRA_FULL_ERROR"] = "1"  # run.py's debug flag
    cmd = [sys.executable, str(ROOT / "run.py"), *args, f"hydra.run.dir={cwd / 'hydra'}"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    return r, time.perf_counter() - t0


@pytest.mark.parametrize(
    "args, message",
    [
        (["rl.steps=abc"], "error: rl.steps='abc': expected an integer >= 1 (conf/rl/default.yaml)"),
        (["rl.offpolicy=-3"], "error: rl.offpolicy=-3: expected an integer >= 0 (conf/rl/default.yaml)"),
        (["+exp=agent_op4_bi"], "error: file not found: data/agent/train.jsonl (task.rows.train)"),
        (["+exp=search_op4_bi"], "error: file not found: data/search_r1/train.parquet (task.files.train)"),
        (["rl.foo=1"], "error: rl.foo: unknown key; Could not override 'rl.foo'; To append to your config use +rl.foo=1"),
        (["rl.disaggregated=true"], f"error: {REMOVED_DISAGGREGATED}"),
    ],
)
def test_run_py_fails_fast_with_one_line_and_builds_nothing(tmp_path, args, message):
    r, seconds = _run(tmp_path, *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith(message) and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    assert not any((tmp_path / d).exists() for d in ("data", ".cache", "runs")), sorted(os.listdir(tmp_path))
    assert seconds < 60, seconds  # import + compose + check: a few seconds on an idle machine


def test_run_py_debug_flag_shows_the_traceback(tmp_path):
    r, _ = _run(tmp_path, "rl.steps=abc", debug=True)
    assert r.returncode != 0 and "Traceback" in r.stderr
    assert "zeromismatch.errors.ConfigError: rl.steps='abc': expected an integer >= 1" in r.stderr


@pytest.mark.parametrize("override,message", [
    ("ray.trainer_ranks=3", r"^ray.trainer_ranks=3: expected a power of two >= 1 \(conf/ray/default.yaml\)$"),
    ("ray.generators=0", r"^ray.generators=0: expected an integer >= 1 \(conf/ray/default.yaml\)$"),
    ("ray.generator_resources.num_gpus=-0.5", r"^ray.generator_resources.num_gpus=-0.5: expected a number >= 0 "),
    ("ray.weight_sync=tcp", r"^ray.weight_sync='tcp': expected one of auto, gloo, nccl, cuda_ipc "),
    ("rl.backend=mpi", r"^rl.backend='mpi': expected one of threaded, ray "),
])  # fmt: skip
def test_ray_settings_bad_values_are_one_line(override, message):
    assert re.search(message, _error(override)), _error(override)


def test_ray_gpu_resources_need_a_cuda_device():
    pytest.importorskip("ray")
    assert _error("rl.backend=ray", "ray.trainer_resources.num_gpus=0.5").startswith(
        "ray.*_resources.num_gpus=0.5 with device=cpu: set device=cuda or num_gpus=0")


def test_ray_on_cuda_needs_gpu_shares_the_cluster_has():
    """device=cuda on Ray: each actor sees only the GPUs it reserves, so each role reserves a share; trainer ranks
    never share a GPU (NCCL); a local cluster advertises enough GPUs (else the actors wait forever)."""
    pytest.importorskip("ray")
    cuda = lambda *o: _error("rl.backend=ray", "device=cuda", *o, cuda_available=True)  # noqa: E731
    assert cuda() == ("ray.generator_resources.num_gpus=0 with device=cuda: reserve a GPU share per actor "
                      "(ray=one_gpu: every role on one GPU, conf/ray/one_gpu.yaml)")
    assert cuda("ray.generator_resources.num_gpus=0.5", "ray.trainer_resources.num_gpus=0.5").startswith(
        "ray.trainer_ranks=2 with ray.trainer_resources.num_gpus=0.5: trainer ranks would share a GPU, which NCCL refuses")
    assert cuda("ray=one_gpu", "ray.num_gpus=0").startswith("ray.num_gpus=0: the actors reserve 1 GPUs of the local cluster")
    check_config(_compose("rl.backend=ray", "device=cuda", "ray=one_gpu"), cuda_available=True)
