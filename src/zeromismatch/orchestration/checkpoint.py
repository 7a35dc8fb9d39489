"""RL checkpoints at step boundaries: the trainer (model, optimizer, weight history, version), the
run-ahead buffer, the data position and the RNG states; enough to continue a run (bit for bit in the
lockstep schedule)."""

from __future__ import annotations

import random
from pathlib import Path

import torch


def save_rl_checkpoint(path: Path, step: int, trainer, buffer, prompts_consumed: int) -> None:
    """Write atomically (a reader never sees half a file). ``step`` = steps done."""
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "step": step,
            "trainer": trainer.state_dict(),
            "buffer": buffer,
            "prompts_consumed": prompts_consumed,
            "torch_rng": torch.get_rng_state(),
            "py_rng": random.getstate(),
        },
        tmp,
    )
    tmp.replace(path)


def load_rl_checkpoint(path: str | Path | None) -> dict | None:
    """The checkpoint at ``path`` (None: a fresh run)."""
    return torch.load(path, weights_only=False) if path else None


def restore_rng(ckpt: dict) -> None:
    torch.set_rng_state(ckpt["torch_rng"])
    random.setstate(ckpt["py_rng"])


def trained_weights(ckpt: dict) -> tuple[int, dict]:
    """(version, model state dict) the trainer had at the checkpoint: what a generator resumes with."""
    return ckpt["trainer"]["version"], ckpt["trainer"]["model"]
