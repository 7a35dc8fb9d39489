"""RL checkpoints at step boundaries: what a resumed run needs to continue with the offpolicy-N semantics
intact, and nothing else.

    step                 steps done (the resumed run's first step)
    trainer              model, optimizer, version, and only the weight-history versions that rescore tokens
                         still waiting in the run-ahead buffer (the staleness split); the current version is
                         the model itself and is rebuilt from it on load
    buffer               the RunAheadBuffer: complete groups not yet trained (with their admission versions),
                         slot accounting, the next step
    in_flight            the groups still generating at the boundary: (ticket, PromptItem, stream position).
                         Their partial rollouts are not kept; a resume regenerates them from the same prompts
                         and sampling seeds under the checkpoint's weights (RolloutWorker.restore_in_flight)
    prompts_consumed     the data position (in-flight prompts included)
    torch_rng, py_rng    RNG states

The weight history dominated the file (one full copy of the weights per kept version, offpolicy + 2 of them);
keeping only the versions the buffer's tokens came from is what makes a checkpoint model + optimizer sized.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from ..errors import InputFileError
from ..models.qwen3_5.checkpoint import merged_half
from ..rl.offpolicy import RunAheadBuffer

CHECKPOINT_NAME = "checkpoint.pt"


def versions_to_rescore(buffer: RunAheadBuffer) -> set[int]:
    """Weight versions that produced a loss token of a complete group still to be trained."""
    out: set[int] = set()
    for group in buffer.untrained_groups():
        for s in group.samples:
            out.update(int(v) for v in torch.unique(s.gen_version[s.loss_mask.bool()]).tolist())
    return out


def trainer_state(trainer, buffer: RunAheadBuffer) -> dict:
    sd = trainer.state_dict()
    keep = versions_to_rescore(buffer) - {sd["version"]}
    sd["history"] = {v: w for v, w in sd["history"].items() if v in keep}
    return sd


def save_rl_checkpoint(path: Path, step: int, trainer, generator_state: dict) -> None:
    """Write atomically (a reader never sees half a file). ``step`` = steps done; ``generator_state`` is
    RolloutWorker.state() (buffer, in_flight, prompts_consumed), taken at the same step boundary."""
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "step": step,
            "trainer": trainer_state(trainer, generator_state["buffer"]),
            **generator_state,
            "torch_rng": torch.get_rng_state(),
            "py_rng": random.getstate(),
        },
        tmp,
    )
    tmp.replace(path)


def checkpoint_file(resume: str | Path) -> Path:
    """job.resume names a checkpoint file or the run dir that holds it."""
    p = Path(resume)
    return p / CHECKPOINT_NAME if p.is_dir() else p


def load_rl_checkpoint(resume: str | Path | None) -> dict | None:
    """The checkpoint named by ``resume`` (None: a fresh run), on the CPU: its weights and optimizer state are
    copied into the run's model and optimizer wherever they live (load_state_dict), the RNG states must be
    CPU tensors, and a run saved on a GPU resumes on any machine."""
    if not resume:
        return None
    path = checkpoint_file(resume)
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    old = [k for k in ckpt["trainer"]["model"] if merged_half(k) is not None]
    if old:  # its optimizer state is laid out per parameter too: no in-place conversion
        raise InputFileError(f"{path}: its model stores {old[0]} on its own, as runs before the merged gate_up_proj / "
                             "in_proj_ba did (commit a569049); resume it from a checkout before that commit, or start a "
                             "new run")
    return ckpt


def restore_trainer(trainer, ckpt: dict) -> None:
    """Load the trainer's state; the current version's history entry is the model itself."""
    trainer.load_state_dict(ckpt["trainer"])
    if trainer.staleness_split:
        trainer.history[trainer.version] = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def restore_rng(ckpt: dict) -> None:
    torch.set_rng_state(ckpt["torch_rng"])
    random.setstate(ckpt["py_rng"])


def trained_weights(ckpt: dict) -> tuple[int, dict]:
    """(version, model state dict) the trainer had at the checkpoint: what a generator resumes with."""
    return ckpt["trainer"]["version"], ckpt["trainer"]["model"]
