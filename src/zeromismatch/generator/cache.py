"""Cache storage: per-slot GDN state and attention KV in fixed 64-token blocks.

GDN state per slot and GDN layer: conv = the last W-1 conv inputs, plus exactly the tensors the mode's GDN
backend declares (`cache_spec`, ops/gdn): the fp32 ssm state for every mode; for bi_chunk also the open
chunk (aligned_chunk.py says what each device path keeps). A bf16 state would be rounded at every decode
token; the state stays fp32 in every mode.

Snapshots (prefix cache) are taken at 64-token boundaries, where the open chunk is empty: they hold conv and
ssm only.
"""

from __future__ import annotations

import torch

from ..ops.attention import BLOCK as ATTENTION_BLOCK
from ..ops.gdn import CHUNK, GDNBackend, GDNHeads
from ..ops.varlen import SeqLayout

BLOCK_SIZE = 64
# a prefix-cache hit lands on a GDN chunk boundary (the open chunk is empty there: snapshots hold conv + ssm),
# and the blocks read for a query cover its whole attention key block (read_kv's keys need no padding)
assert BLOCK_SIZE % CHUNK == 0 and BLOCK_SIZE % ATTENTION_BLOCK == 0, (BLOCK_SIZE, CHUNK, ATTENTION_BLOCK)
SNAPSHOT_KEYS = ("conv", "ssm")  # at a chunk boundary nothing else is read


class CacheStorage:
    """Per-slot GDN state of every GDN layer and the paged KV blocks of every attention layer, allocated up front.
    gdn: the mode's GDN backend (model.numerics.gdn), which declares its per-slot state. spare: one more slot and
    block than the cache manager hands out (slot `max_slots`, block `num_blocks`), which the CUDA-graph runner's
    padding rows read and write so that padding never touches a real sequence's cache."""

    def __init__(self, cfg, gdn: GDNBackend, max_slots: int, num_blocks: int, device="cpu", dtype=torch.float32,
                 spare: bool = False):
        self.max_slots, self.num_blocks, self.spare = max_slots, num_blocks, spare
        max_slots, num_blocks = max_slots + spare, num_blocks + spare
        self.gdn: dict[int, dict[str, torch.Tensor]] = {}
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}
        heads = GDNHeads.from_config(cfg)
        spec = {"conv": ((cfg.linear_conv_kernel_dim - 1, heads.conv_dim), dtype), **gdn.cache_spec(heads, device, dtype)}
        for i, kind in enumerate(cfg.layer_types):
            if kind == "linear_attention":
                self.gdn[i] = {n: torch.zeros(max_slots, *shape, device=device, dtype=dt) for n, (shape, dt) in spec.items()}
            else:
                shape = (num_blocks, BLOCK_SIZE, cfg.num_key_value_heads, cfg.head_dim)
                self.k[i] = torch.zeros(shape, device=device, dtype=dtype)
                self.v[i] = torch.zeros(shape, device=device, dtype=dtype)

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

    def __init__(self, storage: CacheStorage, slots: list[int] | torch.Tensor, block_tables: list[list[int]] | torch.Tensor,
                 device="cpu"):
        """slots [B] and block_tables [B, W] as lists (moved here) or as device tensors (used as they are: the
        model runner moves them with the rest of the step's metadata)."""
        self.s = storage
        if torch.is_tensor(slots):
            self.slots, self.tables = slots, block_tables
            return
        self.slots = torch.tensor(slots, device=device)
        width = max(1, max(len(t) for t in block_tables))
        self.tables = torch.tensor([t + [0] * (width - len(t)) for t in block_tables], device=device)

    def gdn_state(self, layer_idx: int) -> dict[str, torch.Tensor]:
        """This batch's rows of the layer's state tensors, each gathered on first access."""
        return _Gather(self.s.gdn[layer_idx], self.slots)

    def gdn_slots(self, layer_idx: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """(the layer's whole per-slot tensors, this batch's slot indices): for kernels that read and update the
        state in place (the CUDA recurrent GDN, the bi_chunk decode) instead of gather + scatter."""
        return self.s.gdn[layer_idx], self.slots

    def set_gdn_state(self, layer_idx: int, state: dict[str, torch.Tensor]) -> None:
        for n, t in state.items():
            dst = self.s.gdn[layer_idx][n]
            dst[self.slots] = t.detach().to(dst.dtype)

    def write_kv(self, layer_idx, k, v, layout: SeqLayout) -> None:
        """k, v [N, Hkv, D] of the call's new tokens into their blocks. Every attention layer writes the same rows:
        the row of each token in the flattened [blocks * 64] cache is computed once per call, so a layer's write
        is one indexed copy per tensor."""
        rows = layout.once("kv_rows", lambda: self._rows(layout))
        for cache, x in ((self.s.k[layer_idx], k), (self.s.v[layer_idx], v)):
            cache.view(-1, *cache.shape[2:]).index_copy_(0, rows, x.detach().to(cache.dtype))

    def _rows(self, layout: SeqLayout) -> torch.Tensor:
        pos = layout.positions
        return self.tables[layout.seq_index, pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE

    def read_kv(self, layer_idx, layout: SeqLayout):
        """[B, nb*64, Hkv, D] per sequence, nb the blocks of layout.max_ctx (the table holds at least nb columns).
        Positions past a sequence's context hold whatever the block held before (finite values): every attention
        form masks keys beyond the query, so they add exact zeros."""
        nb = (layout.max_ctx + BLOCK_SIZE - 1) // BLOCK_SIZE  # a host bound: no read of the lengths
        tab = self.tables[:, :nb]
        return self.s.k[layer_idx][tab].flatten(1, 2), self.s.v[layer_idx][tab].flatten(1, 2)
