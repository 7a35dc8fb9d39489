"""Metrics logging: every record goes to a local JSONL file and to W&B (offline unless a key is set).

    with MetricsLogger(cfg.logging, cfg.run_name, OmegaConf.to_container(cfg, resolve=True)) as log:
        log.log({"train/loss": 1.23, "perf/trainer/tokens_per_second_fwd_bwd": 4e3}, step=0)
        log.summary({"final/loss": 0.9})

    rows = read_jsonl(log.jsonl_path)           # [{"step": 0, "_time": ..., "train/loss": 1.23, ...}, ...]
    rows = read_wandb_offline(log.run_dir)      # same shape, read back from the .wandb file offline
    steps, values = metric_series(rows, "train/loss")

The JSONL is the record of truth (plain, greppable, never lost); W&B is for viewing. Both readers return
rows of {"step", "_time", <metric>: value}. JSONL keeps one row per `log` call; W&B merges calls made with
the same step into one row, so read series with `metric_series`, which is the same for both.
"""

from .metrics import MetricsLogger, metric_series, read_jsonl, read_wandb_offline, resolve_wandb_mode

__all__ = ["MetricsLogger", "metric_series", "read_jsonl", "read_wandb_offline", "resolve_wandb_mode"]
