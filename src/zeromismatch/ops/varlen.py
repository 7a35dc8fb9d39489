"""How a varlen call's tokens map onto sequences: packed along one axis [N] (delimited by cu_seqlens) or
right-padded [B, L] (zeros at padding).

Every forward call (the trainer's packed batch, a generator prefill, a decode step) is a set of B sequences,
each contributing n_b NEW tokens that start at absolute position start_pos_b (tokens before it live in the
cache). Linear layers work on packed rows; the sequence mixers (conv, GDN, attention) on the padded view.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def padded_index(cu_seqlens: list[int], device=None, multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, L] index into the packed axis, N = padding; [B, L] bool valid) with L the longest sequence rounded up
    to `multiple`."""
    lens = [cu_seqlens[i + 1] - cu_seqlens[i] for i in range(len(cu_seqlens) - 1)]
    width = max(lens) if lens else 0
    width += (-width) % multiple
    ar = torch.arange(width, device=device)
    valid = ar[None, :] < torch.tensor(lens, device=device)[:, None]
    index = torch.where(valid, torch.tensor(cu_seqlens[:-1], device=device)[:, None] + ar[None, :], cu_seqlens[-1])
    return index, valid


def to_padded(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """[N, ...] packed -> [B, L, ...] by a `padded_index` index, zeros at padding (differentiable)."""
    ext = torch.cat([x, x.new_zeros(1, *x.shape[1:])], dim=0)
    return ext[index]


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
        if not lens:
            raise ValueError("a forward call needs at least one sequence")
        if any(n <= 0 for n in lens):
            raise ValueError(f"every sequence needs at least one new token, got lengths {lens}")
        lengths = torch.tensor(lens, device=device)
        start = torch.zeros(len(lens), dtype=torch.long, device=device) if start_pos is None else start_pos.to(device).long()
        pad_index, valid = padded_index(cu, device)
        ar = torch.arange(valid.shape[1], device=device)
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
        return to_padded(x, self.pad_index)

    def to_packed(self, y: torch.Tensor) -> torch.Tensor:
        """[B, L, ...] -> [N, ...]."""
        return y[self.valid]
