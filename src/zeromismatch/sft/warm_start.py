"""The cached SFT checkpoint of a config: trained, measured and stored once, loaded on every later run.

An entry appears only whole: it is written into a temporary directory beside it, fsynced and renamed into
place under the entry's lock, after a run that trained every step. A run that stops early (an exception, the
time guard, a kill) leaves no entry, and a concurrent run of the same key waits on the lock and then loads
what the first one stored."""

from __future__ import annotations

import contextlib
import json
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ..config import config_hash, file_sha256, model_overrides
from ..evaluation import evaluate
from ..models.qwen3_5 import build_model, load_checkpoint, save_checkpoint
from ..tasks.base import locked, publish_dir
from ..tasks.registry import build_task, get_tokenizer, prepare_task_data, sft_render_key
from ..tasks.tokenizer import TOKENIZER_FILES, tokenizer_fingerprint
from .data import SFTBatches, load_sft_records
from .settings import SFTSettings, settings_from_cfg, sft_job_config
from .train import pinned_threads, train_sft

# Bump when training code changes what a key produces. 2: the lr schedule follows the steps only and the
# thread count is pinned (entries of 1 may be cut short by a time budget or trained on another thread count).
# 3: the MLP's gate / up and GDN's b / a projections are one GEMM each (their sums may round differently).
SFT_VERSION = 3
SFT_NUMERICS = "stock"  # the fastest trainer forward on CPU; SFT only picks the starting weights every arm loads
SFT_DTYPE = torch.float32
REWARD_RANGE = (0.1, 0.7)  # starting train reward at which RL groups have variance (warned about otherwise)
CACHE_FILES = ("summary.json", "config.json")


@dataclass
class SFTResult:
    path: Path
    summary: dict
    cache_hit: bool
    model: Any = None  # the trained (miss) or loaded (hit) model, stock numerics; None when not asked for


@contextlib.contextmanager
def _numerics(model, name: str):
    """Generate under ``name`` for the block; the model's own numerics afterwards."""
    old = model.numerics
    model.set_numerics(name)
    try:
        yield model
    finally:
        model.set_numerics(old)


def measure(model, task, s: SFTSettings, cfg_generator: Any = None) -> dict:
    """Train reward (temperature, first prompts of the RL order, one sample each) and held-out greedy
    accuracy, generated under s.measure_numerics."""
    with _numerics(model, s.measure_numerics):
        train = evaluate(
            model, task, n=s.train_reward_prompts, greedy=s.train_reward_temperature == 0,
            max_new_tokens=s.max_new_tokens, temperature=s.train_reward_temperature, seed=s.seed,
            split="train", cfg_generator=cfg_generator,
        )  # fmt: skip
        heldout = evaluate(model, task, greedy=True, max_new_tokens=s.max_new_tokens, cfg_generator=cfg_generator)
    return {"train_reward": train, "heldout": heldout, "measure_numerics": s.measure_numerics}


def _complete(path: Path) -> bool:
    return all((path / f).is_file() for f in CACHE_FILES)


def _platform(device: torch.device) -> dict:
    """What picks the kernels for a given thread count: the torch build, and the CPU's vector ISA (ATen and
    MKL dispatch on it) or the GPU model."""
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else torch.backends.cpu.get_cpu_capability()
    return {"device": device.type, "kernels": where, "torch": torch.__version__}


def sft_key(cfg, s: SFTSettings, tokenizer, data_path: Path) -> dict:
    """What the SFT weights depend on: the model, the data and tokenizer (by content), the training settings
    (steps, batch, lr schedule, seed, levels, threads, optimizer), the fixed SFT numerics and dtype, and the
    platform. The run's own numerics are not in it: SFT trains under SFT_NUMERICS whatever they are, so bi,
    bi_chunk and stock runs share one checkpoint. Where it is stored (job.cache_dir), the time guard and the
    measurement settings are not in it either."""
    key = {
        "version": SFT_VERSION,
        "model": {"preset": cfg.model.preset, "overrides": model_overrides(cfg)},
        "data_sha256": file_sha256(data_path),
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "chat_template_kwargs": dict(cfg.task.get("chat_template_kwargs") or {}),
        "hparams": s.key(),
        "numerics": {"mode": SFT_NUMERICS, "dtype": str(SFT_DTYPE).removeprefix("torch.")},
        "platform": _platform(torch.device(cfg.get("device", "cpu"))),
    }
    render = sft_render_key(cfg)
    if render:  # absent for math, whose records hold the whole prompt: its keys stay what they were
        key["render"] = render
    return key


def run_sft(cfg, *, load: bool = True, log_fn: Callable[[dict, int], None] | None = None) -> SFTResult:
    """The SFT checkpoint of this config: from the cache, or trained, measured and stored. With ``load`` the
    result carries the model (stock numerics, fp32): the trained one on a miss, the stored one on a hit."""
    cfg = sft_job_config(cfg)
    if cfg.model.get("checkpoint"):
        raise ValueError("SFT trains cfg.model.preset from random init; unset model.checkpoint")
    s = settings_from_cfg(cfg)
    prepare_task_data(cfg)  # the offline data sets the SFT file belongs to, written once
    data_path = Path(cfg.job.data)
    tokenizer = get_tokenizer(cfg)
    key = sft_key(cfg, s, tokenizer, data_path)
    out = Path(cfg.job.get("cache_dir") or ".cache/sft") / config_hash(key)

    def hit() -> SFTResult:
        summary = json.loads((out / "summary.json").read_text())
        model = load_checkpoint(out, numerics=SFT_NUMERICS, device=cfg.get("device", "cpu")) if load else None
        tr, ho = summary["measured"]["train_reward"], summary["measured"]["heldout"]
        print(
            f"SFT cache hit: {out} ({summary['train']['steps']} steps, {summary['train']['train_seconds']:.0f} s "
            f"when trained; train reward {tr['accuracy']:.3f}, held-out greedy {ho['accuracy']:.3f})",
            flush=True,
        )
        return SFTResult(out, summary, True, model)

    if _complete(out):
        return hit()
    with locked(out), pinned_threads(s.threads):
        if _complete(out):
            return hit()
        t_start = time.perf_counter()
        device = torch.device(cfg.get("device", "cpu"))
        model = build_model(cfg.model.preset, SFT_NUMERICS, seed=s.seed, device=device, dtype=SFT_DTYPE, **model_overrides(cfg))
        if len(tokenizer) > model.config.vocab_size:
            raise ValueError(f"tokenizer has {len(tokenizer)} tokens, model vocab_size {model.config.vocab_size}")
        records = load_sft_records(data_path, s.levels)
        print(
            f"SFT: training {cfg.model.preset} ({model.num_parameters():,} parameters, {SFT_NUMERICS} numerics, "
            f"{s.threads} thread{'s' if s.threads > 1 else ''} (job.threads), {device}) on {len(records)} "
            f"{cfg.task.name} demonstrations{f' (levels {s.levels})' if s.levels else ''}: {s.steps} steps x "
            f"{s.batch_size}, lr {s.lr}{f', time limit {s.time_limit_s:g} s' if s.time_limit_s else ''} -> {out}",
            flush=True,
        )
        with build_task(cfg, tokenizer, seed=int(cfg.get("seed", 0))) as task:
            batches = SFTBatches(records, task.sft_example, s.batch_size, s.max_seq_len, s.seed)

            def eval_fn(m):
                with _numerics(m, s.measure_numerics):
                    return evaluate(m, task, greedy=True, max_new_tokens=s.max_new_tokens, cfg_generator=cfg.get("generator"))

            stats = train_sft(model, batches, s, log_fn, eval_fn)
            measured = measure(model, task, s, cfg.get("generator"))
        summary = {
            "key": key,
            "hash": out.name,
            "train": stats,
            "measured": measured,
            "parameters": model.num_parameters(),
            "sft_records": len(records),
            "total_seconds": round(time.perf_counter() - t_start, 2),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        summary = json.loads(json.dumps(summary))  # what a cache hit will read back (tuples -> lists)

        def write(tmp: Path) -> None:
            save_checkpoint(model, tmp)
            src = Path(tokenizer.name_or_path)
            for f in TOKENIZER_FILES:
                if (src / f).is_file():
                    shutil.copy2(src / f, tmp / f)
            (tmp / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

        publish_dir(out, write)
    tr, ho = measured["train_reward"], measured["heldout"]
    if not REWARD_RANGE[0] <= tr["accuracy"] <= REWARD_RANGE[1]:
        warnings.warn(
            f"SFT train reward {tr['accuracy']:.3f} (T={s.train_reward_temperature}) is outside {REWARD_RANGE}: RL "
            "groups will have little reward variance. Below: raise job.steps or try another job.seed; above: "
            "lower job.steps.",
            stacklevel=2,
        )
    print(
        f"SFT done: {stats['steps']} steps in {stats['train_seconds']:.0f} s train / "
        f"{summary['total_seconds']:.0f} s total, {stats['threads']} thread(s); loss {stats['loss_first']:.3f} -> "
        f"{stats['loss_last10']:.3f}; train reward (T={s.train_reward_temperature}, {tr['n']} prompts) "
        f"{tr['accuracy']:.3f}; held-out greedy {ho['accuracy']:.3f} ({ho['n']}); saved {out}",
        flush=True,
    )
    return SFTResult(out, summary, False, model if load else None)


def ensure_sft_checkpoint(cfg) -> Path:
    """Directory of the SFT checkpoint for this config (trained first on a cache miss). Works from any job:
    outside `job=sft` the knobs are conf/job/sft.yaml's, overridden by cfg.job.sft when present.
    Load it with ``load_checkpoint(path, numerics=...)``; its tokenizer is in the same directory."""
    return run_sft(cfg, load=False).path
