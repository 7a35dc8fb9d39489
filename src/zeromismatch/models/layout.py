"""How a forward call's tokens map onto sequences.

Every forward call (the trainer's packed batch, a generator prefill, a decode step) is a set of B sequences,
each contributing n_b NEW tokens that start at absolute position start_pos_b (tokens before it live in the
cache). Tokens are packed along one axis [N = sum n_b]. Linear layers work on packed rows; the sequence
mixers (conv, GDN, attention) work on a right-padded [B, L] view built here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch


@dataclass
class SeqLayout:
    cu_seqlens: list[int]
    start_pos: torch.Tensor  # [B] long
    lengths: torch.Tensor  # [B] long, n_b
    positions: torch.Tensor  # [N] absolute positions
    pad_index: torch.Tensor  # [B, L] index into the packed axis; N = padding (a zero row)
    valid: torch.Tensor  # [B, L] bool

    @classmethod
    def build(cls, cu_seqlens, start_pos=None, device=None) -> "SeqLayout":
        cu = [int(c) for c in (cu_seqlens.tolist() if torch.is_tensor(cu_seqlens) else cu_seqlens)]
        lens = [cu[i + 1] - cu[i] for i in range(len(cu) - 1)]
        if any(n <= 0 for n in lens):
            raise ValueError(f"every sequence needs at least one new token, got lengths {lens}")
        b, n_tok, width = len(lens), cu[-1], max(lens)
        lengths = torch.tensor(lens, device=device)
        start = torch.zeros(b, dtype=torch.long, device=device) if start_pos is None else start_pos.to(device).long()
        ar = torch.arange(width, device=device)
        valid = ar[None, :] < lengths[:, None]
        pad_index = torch.where(valid, torch.tensor(cu[:-1], device=device)[:, None] + ar[None, :], n_tok)
        positions = (start[:, None] + ar[None, :])[valid]
        return cls(cu, start, lengths, positions, pad_index, valid)

    @property
    def num_seqs(self) -> int:
        return len(self.cu_seqlens) - 1

    @property
    def padded_positions(self) -> torch.Tensor:
        """[B, L] absolute positions, -1 at padding."""
        ar = torch.arange(self.valid.shape[1], device=self.valid.device)
        return torch.where(self.valid, self.start_pos[:, None] + ar[None, :], -1)

    def to_padded(self, x: torch.Tensor) -> torch.Tensor:
        """[N, ...] -> [B, L, ...] with zeros at padding (differentiable)."""
        ext = torch.cat([x, x.new_zeros(1, *x.shape[1:])], dim=0)
        return ext[self.pad_index]

    def to_packed(self, y: torch.Tensor) -> torch.Tensor:
        """[B, L, ...] -> [N, ...]."""
        return y[self.valid]


class CacheView(Protocol):
    """What a model layer may ask of the generator's cache for the B sequences of one call."""

    def gdn_state(self, layer_idx: int) -> dict[str, torch.Tensor]: ...

    def set_gdn_state(self, layer_idx: int, state: dict[str, torch.Tensor]) -> None: ...

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
