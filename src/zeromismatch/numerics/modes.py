"""Numerics modes: each is one coherent set of choices for trainer AND generator.

| mode     | GDN backend (ops/gdn)       | trainer fwd / bwd  | generator prefill / decode             | linear, acts, attention  |
|----------|-----------------------------|--------------------|----------------------------------------|--------------------------|
| stock    | ChunkGDN (chunk.py)         | chunked / chunked  | chunked / recurrent step               | plain torch, SDPA        |
| bi       | RecurrentGDN (recurrent.py) | recurrent / chunked| recurrent / recurrent step             | batch-invariant, blocked |
| bi_chunk | AlignedChunkGDN             | chunked / chunked  | chunked, aligned to 64-token chunks    | batch-invariant, blocked |
|          | (aligned_chunk.py)          |                    | from the sequence start; decode = the  |                          |
|          |                             |                    | chunked form's row t                   |                          |

`bi` is the published method. `bi_chunk` is ours: the trainer keeps the chunked forward and the generator
decodes chunk-consistently. Measured cost (README, results/): on the CPU the trainer pays the same as `bi`; on
CUDA with tf32 chunked products (chunk_dots) bi_chunk's trainer step is the cheaper of the two (1.30x stock vs bi's
1.39x, qwen3_5_mid), its decode step the dearer.

Routed experts (MoE, ops/moe): stock groups them for torch._grouped_mm on CUDA; bi / bi_chunk run the
batch-invariant Triton grouped GEMMs on CUDA and per-group invariant GEMMs on the CPU.

Every invariant op dispatches by device itself (ops/device.py): the plain-torch CPU form, or the Triton form on
CUDA. Three kernel policies come from conf/numerics and travel in the Numerics object (`describe()` lists them):
- gemm_policy (ops/linear/triton.py): the CUDA GEMM's tile policy, fixed | adaptive | hybrid
- chunk_dots (ops/gdn/chunk_triton.py): bi_chunk's CUDA chunked arithmetic, trainer and generator alike: tf32
  (tensor-core products) | ieee (every sum an fp32 FMA chain)
- lm_head (ops/linear/head.py): the fp32 logits' CUDA form: tensor_core (bf16 operands, fp32 accumulator) | fp32
  (the fp32 GEMM of the casts)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ..ops import activations
from ..ops import linear as invariant_linear
from ..ops import moe
from ..ops.attention import invariant_attention, sdpa_attention
from ..ops.gdn import CHUNK_DOTS, DEFAULT_CHUNK_DOTS, AlignedChunkGDN, ChunkGDN, GDNBackend, RecurrentGDN
from ..ops.linear import DEFAULT_GEMM_POLICY, DEFAULT_HEAD, GEMM_POLICIES, HEAD_FORMS

MODES = ("stock", "bi", "bi_chunk")
POLICY_KEYS = ("gemm_policy", "chunk_dots", "lm_head")


@dataclass(frozen=True)
class Numerics:
    name: str
    gdn: GDNBackend  # the model calls it for every GDN layer (train without a cache, cached with one)
    linear: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    silu: Callable[[torch.Tensor], torch.Tensor]
    sigmoid: Callable[[torch.Tensor], torch.Tensor]
    softplus: Callable[[torch.Tensor], torch.Tensor]
    attention: Callable[..., torch.Tensor]
    # the fp32 lm_head (h, weight, weight_fp32 thunk) -> fp32 logits (ops/linear/head.py)
    logits: Callable[..., torch.Tensor] = invariant_linear.stock_logits
    # routed experts (x, top_w, top_i, gate_up, down) -> [N, H]; ops/moe (a `.name` attribute for describe())
    experts: Callable[..., torch.Tensor] = moe.stock
    gemm_policy: str = DEFAULT_GEMM_POLICY
    chunk_dots: str = DEFAULT_CHUNK_DOTS
    lm_head: str = DEFAULT_HEAD

    def describe(self) -> dict[str, str]:
        """The mode and its kernel policies, as plain values (for run logs and results JSON)."""
        return {"name": self.name, "gdn": self.gdn.name, "experts": self.experts.name, "gemm_policy": self.gemm_policy,
                "chunk_dots": self.chunk_dots, "lm_head": self.lm_head}


def get_numerics(spec: str | Numerics | Mapping[str, Any] = "stock") -> Numerics:
    """A Numerics from a mode name, a Numerics (returned as is), or a mapping like conf/numerics/<mode>.yaml
    (`{name, gemm_policy, chunk_dots}`; a DictConfig works)."""
    if isinstance(spec, Numerics):
        return spec
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, Mapping):
        raise TypeError(f"numerics must be a mode name, a Numerics or a mapping, got {type(spec).__name__}")
    options = dict(spec)
    name = options.pop("name", None)
    unknown = sorted(set(options) - set(POLICY_KEYS))
    if unknown:
        raise ValueError(f"unknown numerics keys {unknown}; known: name, {', '.join(POLICY_KEYS)}")
    gemm_policy = options.get("gemm_policy") or DEFAULT_GEMM_POLICY
    chunk_dots = options.get("chunk_dots") or DEFAULT_CHUNK_DOTS
    lm_head = options.get("lm_head") or DEFAULT_HEAD
    if gemm_policy not in GEMM_POLICIES:
        raise ValueError(f"gemm_policy must be one of {GEMM_POLICIES}, got {gemm_policy!r}")
    if chunk_dots not in CHUNK_DOTS:
        raise ValueError(f"chunk_dots must be one of {CHUNK_DOTS}, got {chunk_dots!r}")
    if lm_head not in HEAD_FORMS:
        raise ValueError(f"lm_head must be one of {HEAD_FORMS}, got {lm_head!r}")
    policies = dict(gemm_policy=gemm_policy, chunk_dots=chunk_dots, lm_head=lm_head)
    if name == "stock":
        return Numerics("stock", ChunkGDN(), F.linear, F.silu, torch.sigmoid, F.softplus, sdpa_attention,
                        partial(invariant_linear.stock_logits, form=lm_head), **policies)
    if name in ("bi", "bi_chunk"):
        gdn = RecurrentGDN() if name == "bi" else AlignedChunkGDN(dots=chunk_dots)
        return Numerics(
            name,
            gdn,
            partial(invariant_linear.linear, policy=gemm_policy),
            activations.silu,
            activations.sigmoid,
            activations.softplus,
            invariant_attention,
            partial(invariant_linear.invariant_logits, form=lm_head, policy=gemm_policy),
            moe.invariant,
            **policies,
        )
    raise ValueError(f"numerics must be one of {MODES}, got {name!r}")
