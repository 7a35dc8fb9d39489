"""The SFT warm start's knobs: conf/job/sft.yaml (overridable from any job through cfg.job.sft) and the
optimizer settings of cfg.trainer, as plain values."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from omegaconf import OmegaConf

from ..config import CONF_DIR


@dataclass
class SFTSettings:
    """The SFT job's knobs (conf/job/sft.yaml), as plain values. Those in ``KEY_FIELDS`` shape the weights
    and so make the cache key; ``threads`` is one of them because the CPU kernels split their sums by thread
    count, so 1 and 2 threads train different bits."""

    steps: int = 300
    batch_size: int = 32
    max_seq_len: int = 512
    lr: float = 3e-3
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1
    levels: list[int] | None = None
    seed: int = 0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01
    grad_clip: float | None = 1.0
    threads: int = 1
    # not in the key: a guard, measurement and bookkeeping
    time_limit_s: float | None = None
    eval_every: int = 0
    train_reward_prompts: int = 64
    train_reward_temperature: float = 1.0
    max_new_tokens: int = 128
    measure_numerics: str = "bi"
    progress: bool = True
    extra: dict = field(default_factory=dict)

    KEY_FIELDS = (
        "steps", "batch_size", "max_seq_len", "lr", "warmup_steps", "min_lr_ratio", "levels", "seed",
        "betas", "eps", "weight_decay", "grad_clip", "threads",
    )  # fmt: skip

    def key(self) -> dict:
        return {name: getattr(self, name) for name in self.KEY_FIELDS}


def sft_job_config(cfg):
    """``cfg`` with cfg.job = the SFT job's knobs: cfg.job itself in `job=sft`; otherwise conf/job/sft.yaml
    merged with ``cfg.job.sft`` (optional overrides a calling job may carry), resolved against ``cfg``."""
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
    job, tr = cfg.job, cfg.trainer
    names = {f.name for f in fields(SFTSettings)} - {"betas", "eps", "weight_decay", "grad_clip", "extra"}
    kw = {n: job.get(n) for n in names if job.get(n) is not None or n in ("time_limit_s", "levels")}
    kw = {k: (OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v) for k, v in kw.items()}
    if kw.get("levels") is not None:
        kw["levels"] = sorted(int(x) for x in kw["levels"])
    s = SFTSettings(**kw)
    s.betas = tuple(float(b) for b in tr.betas)
    s.eps, s.weight_decay = float(tr.eps), float(tr.weight_decay)
    s.grad_clip = float(tr.grad_clip) if tr.get("grad_clip") else None
    return s
