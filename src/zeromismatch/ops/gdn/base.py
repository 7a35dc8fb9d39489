"""The GDN backend interface: one backend per GDN form (chunk.py, recurrent.py, aligned_chunk.py), each running
its CPU and CUDA implementations behind the same three methods.

A backend sees the GDN core's inputs after the conv, packed over the call's tokens: mixed [N, 2*H*K + HV*V] (the
conv's q | k | v channels), g [N, HV] (log decay) and beta [N, HV], both fp32. It returns o [N, HV, V] fp32.

- `train`: no cache, every sequence starts at position 0 (the trainer, cache-free scoring); differentiable
  where the mode trains through it.
- `cached`: prefill pieces and decode rows of the generator, from and into the cache (GDNStateView); each
  sequence continues at layout.start_pos.
- `cache_spec`: the per-slot tensors `cached` needs besides the conv state, so the cache allocates exactly those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from ..varlen import SeqLayout
from .. import fused

# {name: (per-slot shape, dtype)}
StateSpec = dict[str, tuple[tuple[int, ...], torch.dtype]]


@dataclass(frozen=True)
class GDNHeads:
    """Head counts and dims of a GDN layer; value head hv reads key head hv // (HV / H)."""

    num_k_heads: int
    num_v_heads: int
    k_dim: int
    v_dim: int

    @classmethod
    def from_config(cls, cfg) -> "GDNHeads":
        """From a model config with the published field names (linear_num_key_heads, ...)."""
        return cls(cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim)

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.v_dim

    @property
    def conv_dim(self) -> int:
        """Channels of mixed: q | k | v."""
        return 2 * self.key_dim + self.value_dim

    def split(self, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[..., C] -> q, k [..., H, K], v [..., HV, V] (views)."""
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        lead = mixed.shape[:-1]
        return (q.reshape(*lead, self.num_k_heads, self.k_dim), k.reshape(*lead, self.num_k_heads, self.k_dim),
                v.reshape(*lead, self.num_v_heads, self.v_dim))

    def prepare(self, mixed_p: torch.Tensor, g_p: torch.Tensor, beta_p: torch.Tensor):
        """Padded [B, L, C], [B, L, HV] -> q, k, v, g, beta in the kernel layout [B, HV, L, D] fp32 (q, k
        normalized and expanded to the value heads)."""
        q, k, v = self.split(mixed_p)
        q, k = fused.qk_l2norm(q, k, self.num_v_heads)  # one kernel per tensor on CUDA
        v, g, beta = (t.float().transpose(1, 2).contiguous() for t in (v, g_p, beta_p))
        return q, k, v, g, beta

    def prepare_packed(self, mixed: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, layout: SeqLayout):
        """`prepare` of a call's packed inputs, padded by its layout."""
        return self.prepare(layout.to_padded(mixed), layout.to_padded(g), layout.to_padded(beta))


def ssm_spec(heads: GDNHeads) -> StateSpec:
    """The fp32 recurrent state [HV, K, V] per slot (a bf16 state would be rounded at every decode token)."""
    return {"ssm": ((heads.num_v_heads, heads.k_dim, heads.v_dim), torch.float32)}


class GDNStateView(Protocol):
    """The generator cache's GDN state for the B sequences of one call (generator/cache.py BatchCacheView)."""

    def gdn_state(self, layer_idx: int) -> dict[str, torch.Tensor]:
        """This call's rows [B, ...] of each of the layer's state tensors (copies)."""
        ...

    def set_gdn_state(self, layer_idx: int, state: dict[str, torch.Tensor]) -> None:
        """Write rows [B, ...] back to this call's slots."""
        ...

    def gdn_slots(self, layer_idx: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """(the layer's whole [slots, ...] state tensors, this call's slot indices [B]): for kernels that read and
        update the state in place."""
        ...


class GDNBackend:
    """Base of the GDN backends; the model calls the instance (train without a cache, cached with one)."""

    name: ClassVar[str]

    def cache_spec(self, heads: GDNHeads, device, dtype: torch.dtype) -> StateSpec:
        """Per-slot state tensors `cached` needs on this device (dtype: the cache's activation dtype); by
        default the fp32 recurrent state alone."""
        return ssm_spec(heads)

    def train(self, mixed, g, beta, heads: GDNHeads, layout: SeqLayout) -> torch.Tensor:
        raise NotImplementedError

    def cached(self, mixed, g, beta, heads: GDNHeads, layout: SeqLayout, view: GDNStateView, layer_idx: int) -> torch.Tensor:
        raise NotImplementedError

    def __call__(self, mixed, g, beta, heads: GDNHeads, layout: SeqLayout, view: GDNStateView | None = None,
                 layer_idx: int = -1) -> torch.Tensor:
        if view is None:
            return self.train(mixed, g, beta, heads, layout)
        return self.cached(mixed, g, beta, heads, layout, view, layer_idx)
