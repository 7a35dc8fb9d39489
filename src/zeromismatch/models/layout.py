"""What a model layer sees of one forward call: the token layout (ops.varlen.SeqLayout), the generator's cache
for the call's sequences (None in the trainer), and an audit tap."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from ..ops.gdn.base import GDNStateView
from ..ops.varlen import SeqLayout


class CacheView(GDNStateView, Protocol):
    """What a model layer may ask of the generator's cache for the B sequences of one call: the GDN layers' state
    (GDNStateView: gathered rows, scatter back, or the whole per-slot tensors for in-place kernels) and the
    attention layers' paged KV."""

    def write_kv(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor, layout: SeqLayout) -> None: ...

    def read_kv(self, layer_idx: int, layout: SeqLayout) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass
class ForwardContext:
    layout: SeqLayout
    cache: CacheView | None = None
    # audit hook: called with (name, packed activation [N, ...], layout) at fixed points of the forward
    tap: Callable[[str, torch.Tensor, SeqLayout], None] | None = None

    def record(self, name: str, x: torch.Tensor) -> None:
        if self.tap is not None:
            self.tap(name, x, self.layout)


__all__ = ["CacheView", "ForwardContext", "SeqLayout"]
