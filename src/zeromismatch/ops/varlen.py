"""How a varlen call's tokens map onto sequences: packed along one axis [N] (delimited by cu_seqlens) or
right-padded [B, L] (zeros at padding).

Every forward call (the trainer's packed batch, a generator prefill, a decode step) is a set of B sequences,
each contributing n_b NEW tokens that start at absolute position start_pos_b (tokens before it live in the
cache). Linear layers work on packed rows; the sequence mixers (conv, GDN, attention) on the padded view.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

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
    """Device tensors of the call's layout plus the host-side facts ops branch on (lengths, the longest context,
    decode-only), so no op reads a device tensor back to decide a shape or a path."""

    cu_seqlens: list[int]
    start_pos: torch.Tensor  # [B] long
    lengths: torch.Tensor  # [B] long, n_b
    positions: torch.Tensor  # [N] absolute positions
    pad_index: torch.Tensor  # [B, L] index into the packed axis; N = padding (a zero row)
    valid: torch.Tensor  # [B, L] bool
    packed_index: torch.Tensor  # [N] index of each packed token into the flattened [B * L] padded view
    seq_index: torch.Tensor  # [N] the sequence of each packed token
    cu_device: torch.Tensor  # [B+1] int32 cu_seqlens on the device (the kernels' varlen argument)
    max_ctx: int  # an upper bound of max_b (start_pos_b + n_b): the longest context any op must cover
    start_host: list[int] | None = None  # start_pos on the host (None: a decode layout of device buffers)
    payload: torch.Tensor | None = None  # the caller's int64 metadata, moved in the same transfer
    memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)  # see once()

    @classmethod
    def build(cls, cu_seqlens, start_pos=None, device=None, max_ctx: int | None = None,
              payload: torch.Tensor | None = None) -> "SeqLayout":
        """From host values (cu_seqlens a list, start_pos a list or a CPU tensor; a device tensor is read back
        once): every index tensor is computed on the host and moved in one transfer, with the caller's int64
        `payload` (the generator's token ids, slots, block tables: `layout.payload` on the device). max_ctx: a
        larger bound, default the exact one."""
        cu = [int(c) for c in (cu_seqlens.tolist() if torch.is_tensor(cu_seqlens) else cu_seqlens)]
        lens = [cu[i + 1] - cu[i] for i in range(len(cu) - 1)]
        if not lens:
            raise ValueError("a forward call needs at least one sequence")
        if any(n <= 0 for n in lens):
            raise ValueError(f"every sequence needs at least one new token, got lengths {lens}")
        if start_pos is None:
            start = [0] * len(lens)
        else:
            start = [int(s) for s in (start_pos.tolist() if torch.is_tensor(start_pos) else start_pos)]
        b, n = len(lens), cu[-1]
        lengths = torch.tensor(lens)
        start_t = torch.tensor(start)
        pad_index, valid = padded_index(cu)
        width = valid.shape[1]
        ar = torch.arange(width)
        positions = (start_t[:, None] + ar[None, :])[valid]
        packed_index = torch.arange(b * width).view(b, width)[valid]
        seq_index = torch.repeat_interleave(torch.arange(b), lengths)
        extra = torch.zeros(0, dtype=torch.long) if payload is None else payload.long().flatten()
        parts = [start_t, lengths, positions, pad_index.flatten(), valid.flatten().long(), packed_index, seq_index,
                 torch.tensor(cu), extra]
        flat = torch.cat(parts).to(device or "cpu", non_blocking=True)
        sizes = [b, b, n, b * width, b * width, n, n, b + 1, extra.numel()]
        d_start, d_len, d_pos, d_pad, d_valid, d_packed, d_seq, d_cu, d_extra = torch.split(flat, sizes)
        ctx = max(s + m for s, m in zip(start, lens))
        return cls(cu, d_start, d_len, d_pos, d_pad.view(b, width), d_valid.view(b, width).bool(), d_packed, d_seq,
                   d_cu.to(torch.int32), max(ctx, max_ctx or 0), start, None if payload is None else d_extra)

    @classmethod
    def decode(cls, start_pos: torch.Tensor, max_ctx: int) -> "SeqLayout":
        """One new token for each of B sequences, over device buffers (the CUDA-graph runner's static inputs):
        start_pos [B] is read only on the device, max_ctx bounds every start_pos + 1."""
        b, dev = start_pos.shape[0], start_pos.device
        ar = torch.arange(b, device=dev)
        return cls(list(range(b + 1)), start_pos, torch.ones(b, dtype=torch.long, device=dev), start_pos, ar[:, None],
                   torch.ones(b, 1, dtype=torch.bool, device=dev), ar, ar, torch.arange(b + 1, device=dev, dtype=torch.int32),
                   max_ctx, None)

    def once(self, key: str, compute: Callable[[], Any]) -> Any:
        """A value derived from this layout, computed by the first op of a forward call that asks and shared by
        the call's layers (attention's padded positions, the KV cache rows, bi_chunk's open-chunk offsets). The
        model's forward empties the memo when a call starts: a layout whose device buffers are refilled between
        calls (the CUDA-graph runner's) recomputes it in every call, inside the capture."""
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]

    @property
    def num_seqs(self) -> int:
        return len(self.cu_seqlens) - 1

    @property
    def lengths_host(self) -> list[int]:
        cu = self.cu_seqlens
        return [cu[i + 1] - cu[i] for i in range(len(cu) - 1)]

    @property
    def decode_only(self) -> bool:
        """Every sequence brings one new token (host fact: cu_seqlens)."""
        return self.cu_seqlens[-1] == self.num_seqs

    @property
    def from_start(self) -> bool:
        """Every sequence starts at position 0 (host fact): its padded positions are 0..n-1, then padding."""
        return self.start_host is not None and not any(self.start_host)

    @property
    def padded_positions(self) -> torch.Tensor:
        """[B, L] absolute positions, -1 at padding (once per call)."""

        def compute():
            ar = torch.arange(self.valid.shape[1], device=self.valid.device)
            return torch.where(self.valid, self.start_pos[:, None] + ar[None, :], -1)

        return self.once("padded_positions", compute)

    @property
    def unpadded(self) -> bool:
        """Every sequence brings as many new tokens as the longest (host fact): a decode step, the trainer's
        one-sequence microbatch. The padded view is then the packed rows reshaped: no padding, no gather. (B rows
        of width L hold the N tokens without padding exactly when B * L == N: O(1) on every mixer's call.)"""
        return self.num_seqs * self.valid.shape[1] == self.cu_seqlens[-1]

    def to_padded(self, x: torch.Tensor) -> torch.Tensor:
        """[N, ...] -> [B, L, ...] with zeros at padding (differentiable; a view when `unpadded`)."""
        if self.unpadded:
            return x.reshape(self.num_seqs, -1, *x.shape[1:])
        return to_padded(x, self.pad_index)

    def to_packed(self, y: torch.Tensor) -> torch.Tensor:
        """[B, L, ...] -> [N, ...] (a gather by packed_index: no device-to-host read, unlike a boolean mask; a
        reshape when `unpadded`)."""
        if self.unpadded:
            return y.flatten(0, 1)
        return y.flatten(0, 1)[self.packed_index]
