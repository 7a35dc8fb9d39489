"""The SFT warm start is a function of its settings, not of the machine: the same run beside a CPU-bound
process, under another ambient thread count and with a clock running 1000x fast stores bitwise-equal weights;
a run that stops early stores nothing; an entry appears whole (a concurrent run waits and loads it); every
setting that shapes the weights is in the key and nothing else is."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from zeromismatch import sft
from zeromismatch.config import config_hash
from zeromismatch.sft import train as sft_train
from zeromismatch.sft import warm_start
from zeromismatch.tasks.math.task import ensure_offline_math, get_tokenizer
from zeromismatch.tasks.tokenizer import load_tokenizer

CONF = Path(__file__).resolve().parents[2] / "conf"
# a few small steps; short measurements
MICRO = {
    "steps": 4,
    "batch_size": 3,
    "warmup_steps": 1,
    "train_reward_prompts": 2,
    "max_new_tokens": 4,
    "progress": False,
}


def _cfg(tmp: Path, cache: str, *overrides: str):
    base = [
        "job=sft",
        "task.offline.n_train=200",
        f"task.offline.dir={tmp / 'offline'}",
        f"task.tokenizer_cache={tmp / 'tok'}",
        f"logging.root={tmp / 'runs'}",
        "logging.wandb.mode=disabled",
        f"job.cache_dir={tmp / cache}",
        *(f"job.{k}={v}" for k, v in MICRO.items()),
    ]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=base + list(overrides))


def _hash(cfg) -> str:
    cfg = sft.sft_job_config(cfg)
    return config_hash(sft.sft_key(cfg, sft.settings_from_cfg(cfg), get_tokenizer(cfg), Path(cfg.job.data)))


def _entries(cache: Path) -> list[str]:
    """What a cache dir holds besides lock files: entries and (leaked) temporary dirs."""
    return sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) if cache.exists() else []


def _file_digests(entry: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(entry.glob("*.safetensors"))}


class _FastClock:
    """time.perf_counter for sft/train.py that jumps 1000 s per call: every step looks very slow."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1000.0
        return self.now


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("sft_warm_start")


@pytest.fixture(scope="module")
def reference(tmp):
    """The micro SFT on a quiet process (the ambient thread count of the test run)."""
    return sft.run_sft(_cfg(tmp, "quiet"))


def test_busy_machine_same_bits(reference, tmp, monkeypatch):
    assert not reference.cache_hit and reference.summary["train"]["steps"] == MICRO["steps"]
    before = torch.get_num_threads()
    ambient = 2 if before != 2 else 3
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        monkeypatch.setattr(sft_train, "time", _FastClock())
        torch.set_num_threads(ambient)
        busy = sft.run_sft(_cfg(tmp, "busy"))
        assert torch.get_num_threads() == ambient  # the pin is undone afterwards
    finally:
        torch.set_num_threads(before)
        burner.kill()
        burner.wait()
    assert not busy.cache_hit and busy.path.name == reference.path.name  # same key, the other cache_dir
    assert busy.path.parent == tmp / "busy" and busy.summary["train"]["steps"] == MICRO["steps"]
    a, b = reference.model.state_dict(), busy.model.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert _file_digests(busy.path) == _file_digests(reference.path) != {}


@pytest.mark.parametrize("stop", ["exception", "time_limit"])
def test_interrupted_run_caches_nothing(tmp, monkeypatch, stop):
    cache = f"interrupted_{stop}"
    if stop == "exception":

        def log_fn(metrics, step):
            if step == 2:
                raise KeyboardInterrupt  # Ctrl-C mid-training

        with pytest.raises(KeyboardInterrupt):
            sft.run_sft(_cfg(tmp, cache), log_fn=log_fn)
    else:
        monkeypatch.setattr(sft_train, "time", _FastClock())
        with pytest.raises(sft.SFTTimeLimitError) as err:
            sft.run_sft(_cfg(tmp, cache, "job.time_limit_s=1500"))
        msg = str(err.value)
        assert "\n" not in msg and "job.time_limit_s=1500" in msg and "after 1/4 steps" in msg and "cached nothing" in msg
    assert _entries(tmp / cache) == []


def test_failed_write_leaves_no_entry_and_stale_temporaries_go(reference, tmp, monkeypatch):
    cache = tmp / "failed_write"
    real_save = warm_start.save_checkpoint

    def save_then_fail(model, out_dir):
        real_save(model, out_dir)
        raise OSError("disk full")

    monkeypatch.setattr(warm_start, "save_checkpoint", save_then_fail)
    with pytest.raises(OSError, match="disk full"):
        sft.run_sft(_cfg(tmp, "failed_write"))
    assert _entries(cache) == []
    monkeypatch.undo()
    stale = cache / f".{reference.path.name}.tmp-killed"  # left by a writer killed before its rename
    stale.mkdir()
    (stale / "config.json").write_text("{}")
    res = sft.run_sft(_cfg(tmp, "failed_write"))
    assert not res.cache_hit and _entries(cache) == [reference.path.name]
    assert _file_digests(res.path) == _file_digests(reference.path)


def test_concurrent_run_waits_for_the_entry_then_loads_it(reference, tmp):
    cache = tmp / "concurrent"
    entry = cache / reference.path.name
    training, release = threading.Event(), threading.Event()
    seen_mid_training: list[list[str]] = []
    results: dict[str, object] = {}

    def log_fn(metrics, step):
        if step == 2:
            seen_mid_training.append(_entries(cache))
            training.set()
            release.wait(60)

    def run(name, **kw):
        try:
            results[name] = sft.run_sft(_cfg(tmp, "concurrent"), **kw)
        except BaseException as e:  # reported by the asserts below
            results[name] = e

    first = threading.Thread(target=run, args=("first",), kwargs={"log_fn": log_fn})
    first.start()
    assert training.wait(120)
    second = threading.Thread(target=run, args=("second",))
    second.start()
    time.sleep(3)
    try:
        assert second.is_alive() and not entry.exists()  # the second run waits on the lock; nothing visible yet
    finally:
        release.set()
        first.join(120)
        second.join(120)
    assert seen_mid_training == [[]]
    a, b = results["first"], results["second"]
    assert isinstance(a, sft.SFTResult) and not a.cache_hit, a
    assert isinstance(b, sft.SFTResult) and b.cache_hit and b.path == a.path == entry, b
    assert _entries(cache) == [entry.name]
    for name, t in a.model.state_dict().items():
        assert torch.equal(t, b.model.state_dict()[name]), name


KEYED = [
    "job.steps=5", "job.batch_size=4", "job.max_seq_len=256", "job.lr=0.002", "job.warmup_steps=2",
    "job.min_lr_ratio=0.2", "job.levels=[1,2]", "job.seed=1", "job.threads=2", "trainer.betas=[0.9,0.99]",
    "trainer.eps=1e-7", "trainer.weight_decay=0.0", "trainer.grad_clip=null", "+model.overrides.rms_norm_eps=1e-5",
    "+task.chat_template_kwargs.enable_thinking=false",
]  # fmt: skip
NOT_KEYED = [
    "job.time_limit_s=100", "job.eval_every=2", "job.progress=true", "job.measure_numerics=stock",
    "job.train_reward_prompts=8", "job.train_reward_temperature=0.5", "numerics=stock", "seed=3",
]  # fmt: skip


def test_key_follows_what_shapes_the_weights(tmp, monkeypatch):
    ensure_offline_math(_cfg(tmp, "keys").task)
    base = _hash(_cfg(tmp, "keys"))
    assert _hash(_cfg(tmp, "elsewhere")) == base  # where the cache lives is not part of the key
    for override in NOT_KEYED:
        assert _hash(_cfg(tmp, "keys", override)) == base, override
    hashes = {override: _hash(_cfg(tmp, "keys", override)) for override in KEYED}
    for override, h in hashes.items():
        assert h != base, override
    assert len(set(hashes.values())) == len(KEYED)

    cfg = sft.sft_job_config(_cfg(tmp, "keys"))
    s, tok, data = sft.settings_from_cfg(cfg), get_tokenizer(cfg), Path(cfg.job.data)
    key = sft.sft_key(cfg, s, tok, data)
    assert key["platform"] == {"device": "cpu", "kernels": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__}
    assert key["numerics"] == {"mode": "stock", "dtype": "float32"}
    # the data and the tokenizer by content
    changed_data = tmp / "sft_changed.jsonl"
    lines = data.read_text().splitlines(keepends=True)
    changed_data.write_text("".join(lines[1:] + lines[:1]))
    assert config_hash(sft.sft_key(cfg, s, tok, changed_data)) != base
    changed_tok = tmp / "tok_changed"
    shutil.copytree(tok.name_or_path, changed_tok)
    with open(changed_tok / "tokenizer_config.json", "a") as f:
        f.write("\n")
    assert config_hash(sft.sft_key(cfg, s, load_tokenizer(changed_tok), data)) != base
    # the torch build and the kernels it picks
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    assert config_hash(sft.sft_key(cfg, s, tok, data)) != base
