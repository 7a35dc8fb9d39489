"""Cache storage: fp32 GDN state per sequence slot and attention KV in fixed 64-token blocks.

GDN state per slot (per GDN layer): conv = last W-1 conv inputs; ssm = fp32 state (bi_chunk: the state at
the last 64-token boundary); the open chunk's rows (bi_chunk only): on CPU buf_* = per-token inputs (conv
outputs, g, beta), recomputed through the chunked form each call; on CUDA ck/cv/cg/cb/ct/cu = the rows the
fused decode kernel reads and appends (prepared k, v, g, beta, rows of (I + A)^-1, u; fp32, allocated on first
use). A bf16 state would be rounded at every decode token; the state stays fp32 in every mode.

Snapshots (prefix cache) are taken at 64-token boundaries, where the open chunk is empty: they hold conv and
ssm only.
"""

from __future__ import annotations

import torch

from ..models.layout import SeqLayout
from ..ops.gdn import CHUNK

BLOCK_SIZE = 64  # multiple of the GDN chunk, so prefix-cache hits land on chunk boundaries
SNAPSHOT_KEYS = ("conv", "ssm")  # at a chunk boundary nothing else is read


class CacheStorage:
    def __init__(self, cfg, max_slots: int, num_blocks: int, device="cpu", dtype=torch.float32):
        self.max_slots, self.num_blocks = max_slots, num_blocks
        self.gdn: dict[int, dict[str, torch.Tensor]] = {}
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}
        conv_dim = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim + cfg.linear_num_value_heads * cfg.linear_value_head_dim
        hv = cfg.linear_num_value_heads
        for i, kind in enumerate(cfg.layer_types):
            if kind == "linear_attention":
                self.gdn[i] = {
                    "conv": torch.zeros(max_slots, cfg.linear_conv_kernel_dim - 1, conv_dim, device=device, dtype=dtype),
                    "ssm": torch.zeros(max_slots, hv, cfg.linear_key_head_dim, cfg.linear_value_head_dim, device=device, dtype=torch.float32),
                    "buf_qkv": torch.zeros(max_slots, CHUNK, conv_dim, device=device, dtype=dtype),
                    "buf_g": torch.zeros(max_slots, CHUNK, hv, device=device, dtype=torch.float32),
                    "buf_beta": torch.zeros(max_slots, CHUNK, hv, device=device, dtype=torch.float32),
                }
            else:
                shape = (num_blocks, BLOCK_SIZE, cfg.num_key_value_heads, cfg.head_dim)
                self.k[i] = torch.zeros(shape, device=device, dtype=dtype)
                self.v[i] = torch.zeros(shape, device=device, dtype=dtype)

    def open_chunk_rows(self, layer_idx: int) -> None:
        """Allocate the CUDA bi_chunk open-chunk rows of one layer (fp32 [slots, HV, 64, ...])."""
        st = self.gdn[layer_idx]
        if "ck" in st:
            return
        slots, hv, dk, dv = st["ssm"].shape
        f32 = dict(device=st["ssm"].device, dtype=torch.float32)
        st.update(
            ck=torch.zeros(slots, hv, CHUNK, dk, **f32), cv=torch.zeros(slots, hv, CHUNK, dv, **f32),
            cg=torch.zeros(slots, hv, CHUNK, **f32), cb=torch.zeros(slots, hv, CHUNK, **f32),
            ct=torch.zeros(slots, hv, CHUNK, CHUNK, **f32), cu=torch.zeros(slots, hv, CHUNK, dv, **f32),
        )

    def reset_slot(self, slot: int) -> None:
        for state in self.gdn.values():
            for t in state.values():
                t[slot].zero_()

    def snapshot(self, slot: int) -> dict[int, dict[str, torch.Tensor]]:
        return {i: {n: st[n][slot].clone() for n in SNAPSHOT_KEYS} for i, st in self.gdn.items()}

    def restore(self, slot: int, snap: dict[int, dict[str, torch.Tensor]]) -> None:
        for i, st in snap.items():
            for n, t in st.items():
                self.gdn[i][n][slot].copy_(t)

    def memory_bytes(self) -> int:
        ts = [t for st in self.gdn.values() for t in st.values()] + list(self.k.values()) + list(self.v.values())
        return sum(t.numel() * t.element_size() for t in ts)


class _Gather(dict):
    """Gathers a state tensor for the batch's slots on first access (modes read only what they use)."""

    def __init__(self, tensors: dict[str, torch.Tensor], slots: torch.Tensor):
        super().__init__()
        self.tensors, self.slots = tensors, slots

    def __missing__(self, name: str) -> torch.Tensor:
        value = self[name] = self.tensors[name][self.slots]
        return value


class BatchCacheView:
    """The slice of CacheStorage for the B sequences of one forward call (implements models.layout.CacheView)."""

    def __init__(self, storage: CacheStorage, slots: list[int], block_tables: list[list[int]], device="cpu"):
        self.s = storage
        self.slots = torch.tensor(slots, device=device)
        width = max(1, max(len(t) for t in block_tables))
        self.tables = torch.tensor([t + [0] * (width - len(t)) for t in block_tables], device=device)

    def gdn_state(self, layer_idx: int) -> dict[str, torch.Tensor]:
        return _Gather(self.s.gdn[layer_idx], self.slots)

    def gdn_inplace(self, layer_idx: int, open_chunk: bool = False) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """(the layer's whole per-slot tensors, this batch's slot indices): for kernels that read and update the
        state in place (the GPU recurrent GDN, the bi_chunk decode) instead of gather + scatter. open_chunk:
        make sure the bi_chunk open-chunk rows exist."""
        if open_chunk:
            self.s.open_chunk_rows(layer_idx)
        return self.s.gdn[layer_idx], self.slots

    def set_gdn_state(self, layer_idx: int, state: dict[str, torch.Tensor]) -> None:
        for n, t in state.items():
            dst = self.s.gdn[layer_idx][n]
            dst[self.slots] = t.detach().to(dst.dtype)

    def write_kv(self, layer_idx, k, v, layout: SeqLayout) -> None:
        seq = torch.repeat_interleave(torch.arange(layout.num_seqs, device=k.device), layout.lengths)
        pos = layout.positions
        blocks = self.tables[seq, pos // BLOCK_SIZE]
        self.s.k[layer_idx][blocks, pos % BLOCK_SIZE] = k.detach().to(self.s.k[layer_idx].dtype)
        self.s.v[layer_idx][blocks, pos % BLOCK_SIZE] = v.detach().to(self.s.v[layer_idx].dtype)

    def read_kv(self, layer_idx, layout: SeqLayout):
        """[B, nb*64, Hkv, D] per sequence. Positions past a sequence's context hold whatever the block held
        before (finite values): every attention form masks keys beyond the query, so they add exact zeros."""
        ctx = layout.start_pos + layout.lengths
        nb = (int(ctx.max()) + BLOCK_SIZE - 1) // BLOCK_SIZE
        tab = self.tables[:, :nb]
        return self.s.k[layer_idx][tab].flatten(1, 2), self.s.v[layer_idx][tab].flatten(1, 2)
