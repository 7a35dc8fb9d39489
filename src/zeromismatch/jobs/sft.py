"""Supervised warm-up of a (tiny) preset on the offline worked solutions, cached, so that RL starts from a
model that is sometimes right (train reward at temperature 1.0 in [0.1, 0.7]: groups have variance).

    python run.py job=sft model=tiny                     # train (or hit the cache), measure, copy to the run dir
    ensure_sft_checkpoint(cfg) -> Path                   # what the RL / eval jobs call, whatever cfg.job is

Training: random init of cfg.model.preset (+ overrides) from job.seed; AdamW (lr job.lr; betas, eps,
weight decay, grad clip from cfg.trainer); linear warm-up then cosine decay to min_lr_ratio * lr over the
run's progress = max(step / steps, train seconds / time_budget_s), so the schedule completes whichever
budget ends the run. Each step packs batch_size examples of sft.jsonl (chat-formatted prompt exactly as
the RL prompts are rendered, then the worked solution + eos) into one varlen forward
``model(ids, cu_seqlens, logits_rows=...)``; the loss is the mean NLL of the solution tokens only.
Examples come from job.levels (null = all levels), shuffled by job.seed, cycled if needed.

Numerics: SFT always trains under ``stock`` (plain torch, chunked GDN: the fastest trainer forward on
CPU). That is irrelevant to RL parity: parity concerns the RL trainer and generator running the SAME
weights; SFT only picks the starting weights, which every numerics arm then loads identically. The
numerics are therefore not part of the cache key: bi, bi_chunk and stock runs share one SFT checkpoint.

Measured after training (stored in summary.json; not part of the cache key): train reward at temperature
``train_reward_temperature`` on the first ``train_reward_prompts`` prompts of the RL prompt order
(``task.train_prompts()`` with cfg.seed: the prompts an RL run of that seed starts on), one sample each, and
greedy accuracy on the held-out set, both generated under ``measure_numerics``. A reward outside
[0.1, 0.7] is warned about.

Seed: job.seed (init and example order) is fixed to 0 in conf/job/sft.yaml rather than tied to cfg.seed,
so RL runs of every seed start from the same weights. The budget sits close to where the loss drops: with
seed 1 the same 130 steps ended at loss 0.41 and train reward 0.02 (seed 0: 0.19 / 0.19-0.27).

Cache: ``<job.cache_dir>/<16 hex of sha256(key)>/`` with the checkpoint (config.json + safetensors, from
``save_checkpoint``), the tokenizer files and summary.json. key = model preset and overrides, init seed,
sha256 of the SFT data file, levels, the tokenizer's fingerprint, the training hyperparameters, device and
a code version. A run whose key exists loads it ("SFT cache hit"); parallel runs build an entry once (lock).
A run cut short by time_budget_s (a busy machine) is stored too, with a warning: delete it to retrain.

Tuning (conf/job/sft.yaml defaults, tiny preset, 2-core CPU). Learning arithmetic is what costs: on an H200
sweep (same code, 256 prompts at T=1.0) all-level SFT reached a train reward of 0.07 / 0.18 / 0.23 after
200 / 300 / 400 steps x 32 at lr 1e-3 (2e-3 and 5e-3 were worse, 5e-4 no better; batch 16 with twice the
steps equal), i.e. ~10 CPU minutes at ~1.7 s/step (2 threads; ~2.7 s with 1). Level-2 problems (a*b +- c,
a*b) are learned fastest, so the default trains on and RL samples from task.offline.levels = [2]:
130 steps x 32, lr 1e-3, seed 0 -> 207 s training, 214 s total with OMP_NUM_THREADS=2 on a quiet machine
(~345 s with 1 thread); train reward at T=1.0 0.19 on the 64 measured prompts (0.18 on 256; greedy 0.34)
with the levels 3-4 held-out set (greedy 0.0 there); 0.27 and held-out 0.07 after the held-out set moved
to levels 2-4 (which changes the train draw).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

SFT_VERSION = 1  # bump when training code changes what a key produces
REWARD_RANGE = (0.1, 0.7)  # starting train reward at which RL groups have variance (warned about otherwise)
CACHE_FILES = ("summary.json", "config.json")


@dataclass
class SFTSettings:
    """The SFT job's knobs (conf/job/sft.yaml), as plain values. Those in ``KEY_FIELDS`` shape the weights."""

    steps: int = 300
    batch_size: int = 32
    max_seq_len: int = 512
    lr: float = 3e-3
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1
    time_budget_s: float | None = None
    levels: list[int] | None = None
    seed: int = 0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01
    grad_clip: float | None = 1.0
    # not in the key: measurement and bookkeeping
    eval_every: int = 0
    train_reward_prompts: int = 64
    train_reward_temperature: float = 1.0
    max_new_tokens: int = 128
    measure_numerics: str = "bi"
    progress: bool = True
    extra: dict = field(default_factory=dict)

    KEY_FIELDS = (
        "steps", "batch_size", "max_seq_len", "lr", "warmup_steps", "min_lr_ratio", "time_budget_s",
        "levels", "seed", "betas", "eps", "weight_decay", "grad_clip",
    )  # fmt: skip

    def key(self) -> dict:
        return {name: getattr(self, name) for name in self.KEY_FIELDS}


@dataclass
class SFTResult:
    path: Path
    summary: dict
    cache_hit: bool
    model: Any = None  # the trained (miss) or loaded (hit) model, stock numerics; None when not asked for


# ------------------------------------------------------------------------------------------ config


def sft_job_config(cfg):
    """``cfg`` with cfg.job = the SFT job's knobs: cfg.job itself in `job=sft`; otherwise conf/job/sft.yaml
    merged with ``cfg.job.sft`` (optional overrides a calling job may carry), resolved against ``cfg``."""
    from omegaconf import OmegaConf

    from zeromismatch.jobs.common import CONF_DIR

    if cfg.job.get("name") == "sft":
        return cfg
    knobs = OmegaConf.load(CONF_DIR / "job" / "sft.yaml")
    over = cfg.job.get("sft")
    if over:
        knobs = OmegaConf.merge(knobs, over)
    out = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    OmegaConf.set_struct(out, False)
    out.job = knobs
    return out


def settings_from_cfg(cfg) -> SFTSettings:
    """SFTSettings from cfg.job (an SFT job config, see ``sft_job_config``) and cfg.trainer."""
    from omegaconf import OmegaConf

    job, tr = cfg.job, cfg.trainer
    names = {f.name for f in fields(SFTSettings)} - {"betas", "eps", "weight_decay", "grad_clip", "extra"}
    kw = {n: job.get(n) for n in names if job.get(n) is not None or n in ("time_budget_s", "levels")}
    kw = {k: (OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v) for k, v in kw.items()}
    if kw.get("levels") is not None:
        kw["levels"] = sorted(int(x) for x in kw["levels"])
    s = SFTSettings(**kw)
    s.betas = tuple(float(b) for b in tr.betas)
    s.eps, s.weight_decay = float(tr.eps), float(tr.weight_decay)
    s.grad_clip = float(tr.grad_clip) if tr.get("grad_clip") else None
    return s


# --------------------------------------------------------------------------------------------- data


def load_sft_records(path: str | Path, levels: list[int] | None = None) -> list[dict]:
    """Lines of an SFT jsonl (``prompt`` = user message, ``response`` = worked solution, ``answer``,
    ``level``), restricted to ``levels`` when given."""
    records = []
    with open(path) as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            r = json.loads(line)
            if not isinstance(r.get("prompt"), str) or not isinstance(r.get("response"), str):
                raise ValueError(f"{path}, line {i + 1}: needs string 'prompt' and 'response'")
            if levels is None or r.get("level") in levels:
                records.append(r)
    if not records:
        raise ValueError(f"{path}: no SFT records" + (f" at levels {levels}" if levels else ""))
    return records


class SFTBatches:
    """Endless packed batches: records in an order shuffled by ``seed`` (reshuffled per epoch), tokenized on
    first use. Prompt = ``render_prompt(tok, record['prompt'], dapo_template=False)`` (the same ids
    MathTask gives RL), target = solution tokens + eos."""

    def __init__(self, records: list[dict], tokenizer, batch_size: int, max_seq_len: int, seed: int, template_kwargs=None):
        from zeromismatch.tasks.base import cycle_shuffled

        self.records, self.tok = records, tokenizer
        self.batch_size, self.max_seq_len = batch_size, max_seq_len
        self.template_kwargs = dict(template_kwargs or {})
        self.eos = tokenizer.eos_token_id
        if self.eos is None:
            raise ValueError("SFT needs a tokenizer with an eos token (the solution's end)")
        self._order = cycle_shuffled(len(records), seed)
        self._cache: dict[int, tuple[list[int], list[int]]] = {}
        self.skipped = 0

    def example(self, i: int) -> tuple[list[int], list[int]]:
        if i not in self._cache:
            from zeromismatch.tasks.tokenizer import render_prompt

            r = self.records[i]
            prompt = render_prompt(self.tok, r["prompt"], dapo_template=False, **self.template_kwargs)
            target = self.tok.encode(r["response"], add_special_tokens=False) + [self.eos]
            self._cache[i] = (prompt, target)
        return self._cache[i]

    def next_batch(self):
        """(ids [N], cu_seqlens, rows, targets, n_target_tokens) as CPU tensors / lists."""
        import torch

        seqs = []
        while len(seqs) < self.batch_size:
            prompt, target = self.example(next(self._order))
            if len(prompt) + len(target) > self.max_seq_len:
                self.skipped += 1
                if self.skipped > 100 * self.batch_size and not seqs:
                    raise ValueError(f"SFT examples do not fit max_seq_len={self.max_seq_len}")
                continue
            seqs.append((prompt, target))
        ids, cu, rows = [], [0], []
        for prompt, target in seqs:
            start = cu[-1]
            ids.extend(prompt + target)
            # position j predicts token j + 1: rows from the last prompt token to the one before eos
            rows.extend(range(start + len(prompt) - 1, start + len(prompt) + len(target) - 1))
            cu.append(len(ids))
        ids_t = torch.tensor(ids, dtype=torch.long)
        rows_t = torch.tensor(rows, dtype=torch.long)
        return ids_t, cu, rows_t, ids_t[rows_t + 1], len(rows)


# ------------------------------------------------------------------------------------------ training


def lr_factor(step: int, progress: float, s: SFTSettings) -> float:
    """Linear warm-up over warmup_steps, then cosine from 1 to min_lr_ratio over progress in [0, 1]."""
    if s.warmup_steps and step < s.warmup_steps:
        return (step + 1) / s.warmup_steps
    p = min(max(progress, 0.0), 1.0)
    return s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p))


def train_sft(
    model,
    batches: SFTBatches,
    s: SFTSettings,
    log_fn: Callable[[dict, int], None] | None = None,
    eval_fn: Callable[[Any], dict] | None = None,
) -> dict:
    """Train ``model`` in place until s.steps or s.time_budget_s (training seconds: time spent in
    ``eval_fn(model)``, called every s.eval_every steps, does not count). Returns stats."""
    import torch
    import torch.nn.functional as F
    from tqdm.auto import tqdm

    device = next(model.parameters()).device
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, betas=tuple(s.betas), eps=s.eps, weight_decay=s.weight_decay)
    max_norm = s.grad_clip if s.grad_clip else math.inf
    losses, tokens, step = [], 0, 0
    stopped_by = "steps"
    bar = tqdm(total=s.steps, desc="sft", unit="step", disable=not s.progress, dynamic_ncols=True, mininterval=1.0)
    t0 = time.perf_counter()
    while step < s.steps:
        elapsed = time.perf_counter() - t0
        if s.time_budget_s and elapsed >= s.time_budget_s:
            stopped_by = "time"
            break
        progress = max(step / s.steps, elapsed / s.time_budget_s if s.time_budget_s else 0.0)
        lr = s.lr * lr_factor(step, progress, s)
        for group in opt.param_groups:
            group["lr"] = lr
        ids, cu, rows, targets, n = batches.next_batch()
        ids, rows, targets = ids.to(device), rows.to(device), targets.to(device)
        logits = model(ids, cu, logits_rows=rows)
        loss = F.cross_entropy(logits, targets, reduction="sum") / n
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        loss_v = loss.item()
        if not math.isfinite(loss_v):
            raise RuntimeError(f"SFT: non-finite loss {loss_v} at step {step}")
        losses.append(loss_v)
        tokens += ids.numel()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss_v:.3f}", lr=f"{lr:.2e}", refresh=False)
        metrics = {"sft/loss": loss_v, "sft/lr": lr, "sft/grad_norm": float(grad_norm)}
        if eval_fn is not None and s.eval_every and step % s.eval_every == 0 and step < s.steps:
            t_eval = time.perf_counter()
            res = eval_fn(model)
            t0 += time.perf_counter() - t_eval  # the clock stops during evals
            metrics["sft/heldout_accuracy"] = res["accuracy"]
            bar.write(f"sft step {step}: held-out greedy accuracy {res['accuracy']:.3f}")
        if log_fn is not None:
            log_fn(metrics, step)
    bar.close()
    seconds = time.perf_counter() - t0
    tail = losses[-10:] or [float("nan")]
    return {
        "steps": step,
        "stopped_by": stopped_by,
        "train_seconds": round(seconds, 2),
        "examples": step * s.batch_size,
        "tokens": tokens,
        "tokens_per_second": round(tokens / seconds, 1) if seconds > 0 else None,
        "loss_first": losses[0] if losses else None,
        "loss_last10": sum(tail) / len(tail),
        "loss_curve": [round(x, 4) for x in losses[:: max(1, len(losses) // 50)]],
    }


def measure(model, task, s: SFTSettings, cfg_generator: Any = None) -> dict:
    """Train reward (temperature, first prompts of the RL order, one sample each) and held-out greedy
    accuracy, generated under s.measure_numerics (the model's numerics are restored afterwards)."""
    from zeromismatch.jobs.eval import evaluate

    old = model.numerics
    model.set_numerics(s.measure_numerics)
    try:
        train = evaluate(
            model, task, n=s.train_reward_prompts, greedy=s.train_reward_temperature == 0,
            max_new_tokens=s.max_new_tokens, temperature=s.train_reward_temperature, seed=s.seed,
            split="train", cfg_generator=cfg_generator,
        )  # fmt: skip
        heldout = evaluate(model, task, greedy=True, max_new_tokens=s.max_new_tokens, cfg_generator=cfg_generator)
    finally:
        model.set_numerics(old)
    return {"train_reward": train, "heldout": heldout, "measure_numerics": s.measure_numerics}


# --------------------------------------------------------------------------------------------- cache


def _complete(path: Path) -> bool:
    return all((path / f).is_file() for f in CACHE_FILES)


def sft_key(cfg, s: SFTSettings, tokenizer, data_path: Path) -> dict:
    from zeromismatch.jobs.common import file_sha256, model_overrides, tokenizer_fingerprint

    import torch

    return {
        "version": SFT_VERSION,
        "model": {"preset": cfg.model.preset, "overrides": model_overrides(cfg)},
        "data_sha256": file_sha256(data_path),
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "chat_template_kwargs": dict(cfg.task.get("chat_template_kwargs") or {}),
        "hparams": s.key(),
        "device": torch.device(cfg.get("device", "cpu")).type,
    }


def run_sft(cfg, *, load: bool = True, log_fn: Callable[[dict, int], None] | None = None) -> SFTResult:
    """The SFT checkpoint of this config: from the cache, or trained, measured and stored. With ``load`` the
    result carries the model (stock numerics, fp32): the trained one on a miss, the stored one on a hit."""
    import torch

    from zeromismatch.jobs.common import build_task, config_hash, get_tokenizer, model_overrides
    from zeromismatch.jobs.eval import evaluate
    from zeromismatch.models.qwen3_5 import build_model, load_checkpoint, save_checkpoint
    from zeromismatch.tasks.base import locked
    from zeromismatch.tasks.math.task import TOKENIZER_FILES, ensure_offline_math

    cfg = sft_job_config(cfg)
    if cfg.model.get("checkpoint"):
        raise ValueError("SFT trains cfg.model.preset from random init; unset model.checkpoint")
    s = settings_from_cfg(cfg)
    if cfg.task.name == "math" and cfg.task.get("offline"):
        ensure_offline_math(cfg.task)
    data_path = Path(cfg.job.data)
    tokenizer = get_tokenizer(cfg)
    key = sft_key(cfg, s, tokenizer, data_path)
    out = Path(cfg.job.get("cache_dir") or ".cache/sft") / config_hash(key)

    def hit() -> SFTResult:
        summary = json.loads((out / "summary.json").read_text())
        model = load_checkpoint(out, numerics="stock", device=cfg.get("device", "cpu")) if load else None
        tr, ho = summary["measured"]["train_reward"], summary["measured"]["heldout"]
        print(
            f"SFT cache hit: {out} ({summary['train']['steps']} steps, {summary['train']['train_seconds']:.0f} s "
            f"when trained; train reward {tr['accuracy']:.3f}, held-out greedy {ho['accuracy']:.3f})",
            flush=True,
        )
        return SFTResult(out, summary, True, model)

    if _complete(out):
        return hit()
    with locked(out):
        if _complete(out):
            return hit()
        t_start = time.perf_counter()
        device = torch.device(cfg.get("device", "cpu"))
        model = build_model(cfg.model.preset, "stock", seed=s.seed, device=device, dtype=torch.float32, **model_overrides(cfg))
        if len(tokenizer) > model.config.vocab_size:
            raise ValueError(f"tokenizer has {len(tokenizer)} tokens, model vocab_size {model.config.vocab_size}")
        records = load_sft_records(data_path, s.levels)
        batches = SFTBatches(
            records, tokenizer, s.batch_size, s.max_seq_len, s.seed, cfg.task.get("chat_template_kwargs")
        )
        print(
            f"SFT: training {cfg.model.preset} ({model.num_parameters():,} parameters, stock numerics, "
            f"{torch.get_num_threads()} threads, {device}) on {len(records)} worked solutions"
            f"{f' (levels {s.levels})' if s.levels else ''}: {s.steps} steps x {s.batch_size}, lr {s.lr}"
            f"{f', time budget {s.time_budget_s} s' if s.time_budget_s else ''} -> {out}",
            flush=True,
        )
        with build_task(cfg, tokenizer, seed=int(cfg.get("seed", 0))) as task:

            def eval_fn(m):
                old = m.numerics
                m.set_numerics(s.measure_numerics)
                try:
                    return evaluate(m, task, greedy=True, max_new_tokens=s.max_new_tokens, cfg_generator=cfg.get("generator"))
                finally:
                    m.set_numerics(old)

            stats = train_sft(model, batches, s, log_fn, eval_fn)
            measured = measure(model, task, s, cfg.get("generator"))
        summary = {
            "key": key,
            "hash": out.name,
            "train": stats,
            "measured": measured,
            "threads": torch.get_num_threads(),
            "parameters": model.num_parameters(),
            "sft_records": len(records),
            "total_seconds": round(time.perf_counter() - t_start, 2),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        summary = json.loads(json.dumps(summary))  # what a cache hit will read back (tuples -> lists)
        tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        save_checkpoint(model, tmp)
        src = Path(tokenizer.name_or_path)
        for f in TOKENIZER_FILES:
            if (src / f).is_file():
                shutil.copy2(src / f, tmp / f)
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        shutil.rmtree(out, ignore_errors=True)  # an incomplete entry (a killed run)
        os.replace(tmp, out)
    tr, ho = measured["train_reward"], measured["heldout"]
    if not REWARD_RANGE[0] <= tr["accuracy"] <= REWARD_RANGE[1]:
        warnings.warn(
            f"SFT train reward {tr['accuracy']:.3f} (T={s.train_reward_temperature}) is outside {REWARD_RANGE}: RL "
            "groups will have little reward variance. Below: raise job.steps (an H200 sweep reached 0.39 on level 2 "
            "after 200 steps) or try another job.seed; above: lower it.",
            stacklevel=2,
        )
    if stats["stopped_by"] == "time":
        warnings.warn(
            f"SFT stopped by time_budget_s={s.time_budget_s} after {stats['steps']}/{s.steps} steps (a slow or "
            f"busy machine): {out} holds a less trained model than this config means. Delete it and rerun on a "
            "quieter machine (or with OMP_NUM_THREADS=1 when other processes share the cores).",
            stacklevel=2,
        )
    print(
        f"SFT done: {stats['steps']} steps ({stats['stopped_by']} budget) in {stats['train_seconds']:.0f} s train / "
        f"{summary['total_seconds']:.0f} s total, {summary['threads']} threads; loss {stats['loss_first']:.3f} -> "
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


def main(cfg) -> dict:
    from zeromismatch.logging import MetricsLogger

    with MetricsLogger.from_cfg(cfg) as log:
        res = run_sft(cfg, load=False, log_fn=log.log)
        m = res.summary["measured"]
        final = {
            "sft/train_reward": m["train_reward"]["accuracy"],
            "validation_reward/_mean": m["heldout"]["accuracy"],
            "sft/steps": res.summary["train"]["steps"],
            "sft/train_seconds": res.summary["train"]["train_seconds"],
        }
        log.summary({**final, "sft/cache_hit": res.cache_hit})
        dest = Path(cfg.job.save_to) if cfg.job.get("save_to") else log.run_dir / "checkpoint"
        shutil.copytree(res.path, dest, dirs_exist_ok=True)
        run_dir = str(log.run_dir)
    print(f"sft: checkpoint {res.path} (copied to {dest})", flush=True)
    return {
        **final,
        "heldout_accuracy": m["heldout"]["accuracy"],
        "cache_hit": res.cache_hit,
        "checkpoint": str(res.path),
        "copied_to": str(dest),
        "run_dir": run_dir,
    }


__all__ = [
    "SFTBatches",
    "SFTResult",
    "SFTSettings",
    "ensure_sft_checkpoint",
    "load_sft_records",
    "main",
    "measure",
    "run_sft",
    "sft_job_config",
    "train_sft",
]
