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

One folder per run (run_dir.py): Hydra's output dir is the run dir; status.json marks it running, completed,
failed (with a one-line error) or interrupted; a resume continues the folder and the W&B run.
"""

from .metrics import MetricsLogger, metric_series, read_jsonl, read_wandb_offline, resolve_wandb_mode
from .run_dir import pin_run_dir, read_status, run_status, write_status

__all__ = ["MetricsLogger", "metric_series", "pin_run_dir", "read_jsonl", "read_status", "read_wandb_offline",
           "resolve_wandb_mode", "run_status", "write_status"]
