"""KV cache manager: the slot and the KV blocks each sequence holds, and the prefix cache over them.

A running sequence owns one slot of CacheStorage (its fp32 GDN state) and a block table of 64-token attention
KV blocks. Blocks are ref-counted: a prefix-cache entry and every sequence that reuses it each hold a
reference. A prefix hit shares the cached blocks and restores the GDN state snapshot of the prefix's end into
the sequence's slot, so the sequence resumes at that block boundary as if it had computed the prefix itself.

When the blocks run out, the engine preempts a sequence: `preempt` gives back its blocks and slot and resets it
to be recomputed from its tokens. Its blocks already published to the prefix cache stay there, so the
recompute usually resumes from its own last snapshot.
"""

from __future__ import annotations

from .cache import BLOCK_SIZE, CacheStorage
from .prefix_cache import PrefixCache, block_hashes
from .sequence import Sequence


class BlockAllocator:
    """Free list with reference counts (a block shared by the prefix cache and several sequences)."""

    def __init__(self, num_blocks: int):
        self.free = list(range(num_blocks - 1, -1, -1))
        self.ref = [0] * num_blocks

    def num_free(self) -> int:
        return len(self.free)

    def allocate(self) -> int:
        if not self.free:
            raise RuntimeError("out of KV blocks")
        b = self.free.pop()
        self.ref[b] = 1
        return b

    def incref(self, b: int) -> None:
        self.ref[b] += 1

    def decref(self, b: int) -> None:
        self.ref[b] -= 1
        if self.ref[b] == 0:
            self.free.append(b)


class KVCacheManager:
    def __init__(self, storage: CacheStorage, max_slots: int, num_blocks: int, prefix_caching: bool = True):
        self.storage = storage
        self.alloc = BlockAllocator(num_blocks)
        self.prefix = PrefixCache(self.alloc, max_entries=num_blocks // 2) if prefix_caching else None
        self.free_slots = list(range(max_slots - 1, -1, -1))

    # ---------------------------------------------------------------------------------------- slots
    def has_free_slot(self) -> bool:
        return bool(self.free_slots)

    def admit(self, s: Sequence) -> None:
        """Give a new sequence a slot with zeroed GDN state."""
        s.slot = self.free_slots.pop()
        self.storage.reset_slot(s.slot)

    def release(self, s: Sequence) -> None:
        """Give back the sequence's blocks and its slot (a preempted sequence holds neither)."""
        for b in s.block_table:
            self.alloc.decref(b)
        s.block_table = []
        if s.slot >= 0:
            self.free_slots.append(s.slot)
        s.slot = -1

    def reset_computed(self, s: Sequence) -> None:
        """Compute the sequence again from its first token: its GDN state is zeroed; its blocks stay held and
        are overwritten as the tokens are recomputed."""
        if s.slot >= 0:
            self.storage.reset_slot(s.slot)
        s.num_computed = 0
        s.stale_cache = False

    def preempt(self, s: Sequence) -> None:
        """Drop the sequence's cache (blocks and slot back) so that it is recomputed from its tokens once
        admitted again; the recompute may hit the prefix cache like a fresh prompt."""
        self.release(s)
        s.num_computed = 0
        s.looked_up = False
        s.stale_cache = False  # the recompute runs under the weights of its time only

    # --------------------------------------------------------------------------------------- blocks
    @staticmethod
    def blocks_needed(s: Sequence, n_tokens: int) -> int:
        """How many blocks the sequence's table lacks to hold n_tokens (<= 0: none)."""
        return (n_tokens + BLOCK_SIZE - 1) // BLOCK_SIZE - len(s.block_table)

    def allocate_blocks(self, s: Sequence, n_tokens: int) -> bool:
        """Grow the block table to hold n_tokens, evicting prefix-cache entries when the free list runs short.
        Returns False, allocating nothing, when even that leaves too few blocks (the caller preempts)."""
        need = self.blocks_needed(s, n_tokens)
        if need > 0 and self.prefix is not None:
            self.prefix.evict_for_space(need)
        if need > self.alloc.num_free():
            return False
        for _ in range(need):
            s.block_table.append(self.alloc.allocate())
        return True

    # --------------------------------------------------------------------------------- prefix cache
    def lookup_prefixes(self, running: list[Sequence]) -> tuple[list[Sequence], dict[Sequence, int]]:
        """Fresh sequences take their longest cached prefix. Of several fresh sequences that miss on the same
        first block, one computes it while the others wait a step, then hit the cache.
        Returns (the sequences that may be scheduled this step, the prefix tokens each hit)."""
        out, inflight, hits = [], set(), {}
        for s in running:
            if s.num_computed == 0 and not s.looked_up and self.prefix is not None and s.num_tokens > BLOCK_SIZE:
                blocks, snap = self.prefix.lookup(s.tokens)
                if blocks:
                    for b in blocks:
                        self.alloc.incref(b)
                    for b in s.block_table:  # a parked sequence reset by a 'recompute' swap still holds its blocks
                        self.alloc.decref(b)
                    s.block_table = list(blocks)
                    self.storage.restore(s.slot, snap)
                    s.num_computed = len(blocks) * BLOCK_SIZE
                    hits[s] = s.num_computed
                    s.looked_up = True
                else:
                    h = block_hashes(s.tokens, 1)[0]
                    if h in inflight:
                        continue
                    inflight.add(h)
            out.append(s)
        return out, hits

    def cache_prefix(self, s: Sequence) -> None:
        """After a step: when the sequence's computed tokens end on a block boundary (there the GDN state is
        the snapshot's conv + ssm alone), publish its blocks. A cache that mixes weight versions is never
        published."""
        if self.prefix is None or s.num_computed % BLOCK_SIZE or s.num_computed == 0:
            return
        s.looked_up = True
        if s.stale_cache:
            return
        self.prefix.insert(s.tokens, s.block_table, s.num_computed // BLOCK_SIZE, lambda: self.storage.snapshot(s.slot))

    def clear_prefix_cache(self) -> None:
        if self.prefix is not None:
            self.prefix.clear()
