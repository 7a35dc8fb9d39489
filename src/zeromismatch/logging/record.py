"""Result records (results/*.json): what ran, where, with which numerics, and what it measured, so a number
in results/ can be traced to the command and machine that produced it."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import torch

from ..config import cfg_get, to_plain


def machine_description() -> str:
    cpu = platform.processor() or "CPU"
    where = f"{platform.machine()} {cpu} ({os.cpu_count()} cores), torch threads={torch.get_num_threads()}"
    if torch.cuda.is_available():
        where += f", {torch.cuda.get_device_name()}"
    return where


def results_record(cfg: Any, **fields) -> dict:
    """The record's header (command line, machine, torch version, model preset, the whole cfg.numerics node:
    mode and kernel policies) followed by ``fields``."""
    return {
        "command": "python run.py " + " ".join(sys.argv[1:]),
        "machine": machine_description(),
        "torch": torch.__version__,
        "model": cfg_get(cfg_get(cfg, "model"), "preset"),
        "numerics": to_plain(cfg_get(cfg, "numerics")),
        **fields,
    }


def write_record(path: str | Path, record: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, default=str))
