"""The trainer's state as full (unsharded) tensors, and back: checkpoints of a data-parallel trainer that
any number of ranks can resume from.

    sd = full_trainer_state(trainer)        # COLLECTIVE under FSDP (every rank calls); the same dict on every rank
    load_full_trainer_state(trainer, sd)    # every rank, from its own copy of sd (no communication)

The optimizer state is keyed by parameter names (torch.distributed.checkpoint.state_dict), with or without
FSDP, so one format serves one rank or several; the weight history (staleness split) is gathered to full
tensors and cut back into each rank's shards on load.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict, set_optimizer_state_dict
from torch.distributed.tensor import DTensor, distribute_tensor

from .distributed import full_state_dict, reshard

__all__ = ["full_trainer_state", "load_full_trainer_state"]


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t.detach()).cpu()


def full_trainer_state(trainer) -> dict:
    model = trainer.model
    reshard(model)
    optim = get_optimizer_state_dict(model, trainer.opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    history = {v: {k: _full(t) for k, t in w.items()} for v, w in trainer.history.items()}
    return {"model": full_state_dict(model, to_cpu=True), "optimizer": optim, "optimizer_keys": "names",
            "version": trainer.version, "history": history}


def _like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``full`` laid out as ``like``: this rank's shard of it for a DTensor (every rank holds ``full``)."""
    if isinstance(like, DTensor):
        return distribute_tensor(full.to(like.device), like.device_mesh, like.placements, src_data_rank=None)
    return full.to(like.device).clone()


def load_full_trainer_state(trainer, sd: dict) -> None:
    model = trainer.model
    reshard(model)
    current = model.state_dict()
    model.load_state_dict({k: _like(sd["model"][k], current[k]) for k in current})
    set_optimizer_state_dict(model, trainer.opt, sd["optimizer"], options=StateDictOptions(full_state_dict=True))
    trainer.version = sd["version"]
    trainer.history = OrderedDict(
        (v, {k: _like(w[k], current[k]) for k in current}) for v, w in sorted(sd["history"].items()))
    if trainer.staleness_split:  # the current version's entry is the model itself
        trainer.history[trainer.version] = {k: v.detach().clone() for k, v in model.state_dict().items()}
