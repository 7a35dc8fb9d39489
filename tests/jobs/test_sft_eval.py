"""SFT warm start: the cache (a second run loads bitwise-identical weights without training; other jobs find
the same entry; another hyperparameter makes another entry), the sft and eval jobs, and evaluate()."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from zeromismatch import sft
from zeromismatch.config import config_hash
from zeromismatch.evaluation import evaluate
from zeromismatch.jobs import eval as eval_job
from zeromismatch.jobs import sft as sft_job
from zeromismatch.models.qwen3_5 import build_model, load_checkpoint
from zeromismatch.sft import warm_start
from zeromismatch.tasks.math.task import get_tokenizer
from zeromismatch.tasks.registry import build_task

CONF = Path(__file__).resolve().parents[2] / "conf"
# a very short SFT: few steps, small batches, short measurements
SFT_KNOBS = {
    "steps": 3,
    "batch_size": 4,
    "warmup_steps": 1,
    "train_reward_prompts": 4,
    "max_new_tokens": 6,
    "progress": False,
}


def _compose(tmp: Path, *overrides: str):
    base = [
        "task.offline.n_train=200",
        f"task.offline.dir={tmp / 'offline'}",
        f"task.tokenizer_cache={tmp / 'tok'}",
        f"logging.root={tmp / 'runs'}",
        "logging.wandb.mode=disabled",
    ]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=base + list(overrides))


def _sft_cfg(tmp: Path, *extra: str):
    knobs = [f"job.{k}={v}" for k, v in SFT_KNOBS.items()]
    return _compose(tmp, "job=sft", f"job.cache_dir={tmp / 'sft'}", *knobs, *extra)


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("sft_eval")


@pytest.fixture(scope="module")
def first(tmp):
    return sft.run_sft(_sft_cfg(tmp))


def test_sft_trains_and_stores(first, tmp):
    assert not first.cache_hit
    assert first.path.parent == tmp / "sft" and len(first.path.name) == 16
    for f in ("config.json", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json", "summary.json"):
        assert (first.path / f).is_file(), f
    s = first.summary
    assert s["train"]["steps"] == SFT_KNOBS["steps"] and s["train"]["threads"] == 1
    assert s["key"]["hparams"]["steps"] == SFT_KNOBS["steps"]
    for part, n in (("train_reward", SFT_KNOBS["train_reward_prompts"]), ("heldout", 30)):
        m = s["measured"][part]
        assert m["n"] == n and 0.0 <= m["accuracy"] <= 1.0 and 0 < m["mean_len"] <= SFT_KNOBS["max_new_tokens"]
    assert first.model.numerics.name == "stock"


def test_second_run_is_a_cache_hit_with_identical_weights(first, tmp, monkeypatch, capsys):
    def no_training(*a, **k):
        raise AssertionError("a cache hit must not train")

    monkeypatch.setattr(warm_start, "train_sft", no_training)
    second = sft.run_sft(_sft_cfg(tmp))
    assert "SFT cache hit" in capsys.readouterr().out
    assert second.cache_hit and second.path == first.path
    assert second.summary == first.summary  # the stored summary, not a new measurement
    a, b = first.model.state_dict(), second.model.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
    # other jobs (RL, eval) resolve the same entry from conf/job/sft.yaml + cfg.job.sft overrides
    other = _compose(tmp, "job=eval", f"+job.sft={{{','.join(f'{k}:{v}' for k, v in SFT_KNOBS.items())},cache_dir:{tmp / 'sft'}}}")
    assert sft.ensure_sft_checkpoint(other) == first.path
    # the SFT numerics are not part of the key: a stock run shares the bi run's checkpoint
    assert sft.ensure_sft_checkpoint(_sft_cfg(tmp, "numerics=stock")) == first.path


def test_other_hyperparameters_other_entry(first, tmp):
    cfg = _sft_cfg(tmp, "job.lr=0.002")
    key = sft.sft_key(sft.sft_job_config(cfg), sft.settings_from_cfg(cfg), get_tokenizer(cfg), Path(cfg.job.data))
    assert config_hash(key) != first.path.name


def test_sft_main_copies_checkpoint(first, tmp):
    res = sft_job.main(_sft_cfg(tmp))
    assert res["cache_hit"] and res["checkpoint"] == str(first.path)
    assert (Path(res["copied_to"]) / "config.json").is_file()
    assert 0.0 <= res["validation_reward/_mean"] <= 1.0


def test_evaluate_random_model(tmp):
    cfg = _compose(tmp, "job=eval")
    model = build_model("tiny", "bi", seed=3).eval()
    with build_task(cfg) as task:
        res = evaluate(model, task, n=3, max_new_tokens=5)
        assert res["n"] == 3 and res["samples"] == 3
        assert 0.0 <= res["accuracy"] <= 1.0 and 0 < res["mean_len"] <= 5
        assert evaluate(model, task, n=3, max_new_tokens=5)["accuracy"] == res["accuracy"]
        sampled = evaluate(model, task, n=2, greedy=False, samples_per_prompt=2, max_new_tokens=5, split="train")
        assert sampled["n"] == 2 and sampled["samples"] == 4 and 0.0 <= sampled["accuracy"] <= 1.0


def test_eval_main_on_checkpoint(first, tmp, capsys):
    cfg = _compose(tmp, "job=eval", f"model.checkpoint={first.path}", "job.n=3", "job.max_new_tokens=5", "job.temperature=0")
    res = eval_job.main(cfg)
    assert res["n"] == 3 and 0.0 <= res["accuracy"] <= 1.0 and res["checkpoint"] == str(first.path)
    assert "eval: accuracy" in capsys.readouterr().out
    model = load_checkpoint(first.path)
    assert model.config.vocab_size == 2048
