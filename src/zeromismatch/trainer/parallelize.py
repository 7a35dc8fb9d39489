"""Model-specific FSDP2 wrapping (torchtitan style: one `parallelize_*` function per model family).

Only torch.distributed primitives are used (torch.distributed.fsdp.fully_shard, DTensor): they exist and
behave the same on torch 2.11 (H200 image) and 2.13 (CPU machines). torchtitan's own `apply_fsdp` helpers
target its model classes and its job config; they add nothing we need here (see docs/distributed.md).
"""

from __future__ import annotations

import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def parallelize_qwen3_5(
    model: nn.Module,
    *,
    mesh=None,
    reshard_after_forward: bool = True,
    mp_policy: MixedPrecisionPolicy | None = None,
) -> nn.Module:
    """FSDP2 for Qwen35ForCausalLM: one FSDP unit per decoder layer, the embedding its own unit (untied
    only), and the root unit holding the final norm and lm_head.

    Why lm_head stays in the root unit: the model's forward reads `self.lm_head.weight` directly (fp32 lm_head
    whatever the activation dtype) instead of calling lm_head's forward, so hooks on lm_head would never
    unshard it. The root's pre-forward hook unshards the root unit's parameters, which covers it.
    With tied embeddings the embedding weight IS lm_head's weight, so it stays in the root unit too.

    Wrapping order: children first, root last (FSDP2 requirement). Parameter names (state_dict keys) do
    not change: fully_shard swaps the module class in place, it adds no wrapper module.
    """
    kw = dict(mesh=mesh, reshard_after_forward=reshard_after_forward)
    if mp_policy is not None:
        kw["mp_policy"] = mp_policy
    layers = list(model.model.layers)
    for i, layer in enumerate(layers):
        # the last layer's parameters are needed again right away by the backward: keep them gathered
        last = i == len(layers) - 1
        fully_shard(layer, **{**kw, "reshard_after_forward": reshard_after_forward and not last})
    if not model.config.tie_word_embeddings:
        fully_shard(model.model.embed_tokens, **kw)
    fully_shard(model, **kw)
    return model


def parallelize_generic(model: nn.Module, *, mesh=None, reshard_after_forward: bool = True, mp_policy=None) -> nn.Module:
    """Fallback: one FSDP unit for the whole model (correct for any module, no overlap, peak memory of the
    full model during forward/backward)."""
    kw = dict(mesh=mesh, reshard_after_forward=reshard_after_forward)
    if mp_policy is not None:
        kw["mp_policy"] = mp_policy
    fully_shard(model, **kw)
    return model
