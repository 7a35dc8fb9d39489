"""Prefix cache for a hybrid model. Attention needs the KV blocks of the shared prefix; GDN layers need their
state at the end of it. Entries are keyed by the hash chain of full 64-token blocks and hold the KV block id
(shared, ref-counted) and a snapshot of every GDN layer's state at that block boundary. A hit restores the
snapshot and skips the prefix's prefill; because boundaries are multiples of the GDN chunk, the resumed
computation is the one a cold prefill would have done (bi / bi_chunk: bit for bit)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from .cache import BLOCK_SIZE


def block_hashes(tokens: list[int], n_blocks: int) -> list[int]:
    out, h = [], 0
    for i in range(n_blocks):
        h = hash((h, tuple(tokens[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE])))
        out.append(h)
    return out


@dataclass
class Entry:
    block: int
    snapshot: dict | None  # GDN state at the block's end; None when no computation stopped there


class PrefixCache:
    """allocator: the KV cache manager's BlockAllocator; an entry holds one reference on its block."""

    def __init__(self, allocator, max_entries: int):
        self.alloc = allocator
        self.max_entries = max_entries
        self.entries: OrderedDict[int, Entry] = OrderedDict()
        self.hits_tokens = 0
        self.queries_tokens = 0
        self.evictions = 0  # entries dropped for room (not by clear)

    def lookup(self, tokens: list[int]) -> tuple[list[int], dict | None]:
        """Longest cached prefix of whole blocks, leaving at least one token to compute (its logits are
        needed). Returns (block ids, GDN snapshot at its end or None)."""
        n = (len(tokens) - 1) // BLOCK_SIZE
        chain, blocks, snap = [], [], None
        for h in block_hashes(tokens, n):
            e = self.entries.get(h)
            if e is None:
                break
            self.entries.move_to_end(h)
            chain.append(e.block)
            if e.snapshot is not None:  # resumable here: KV of the chain so far + GDN state
                blocks, snap = list(chain), e.snapshot
        self.queries_tokens += len(tokens)
        self.hits_tokens += len(blocks) * BLOCK_SIZE
        return blocks, snap

    def insert(self, tokens: list[int], block_table: list[int], n_blocks: int, snapshot_fn) -> None:
        """Register the first n_blocks blocks of a sequence whose computed tokens just reached n_blocks * 64;
        the GDN snapshot belongs to the last of them (earlier ones were passed inside one prefill piece)."""
        for i, h in enumerate(block_hashes(tokens, n_blocks)):
            last = i == n_blocks - 1
            e = self.entries.get(h)
            if e is None:
                self.alloc.incref(block_table[i])
                self.entries[h] = Entry(block_table[i], snapshot_fn() if last else None)
            elif last and e.snapshot is None:
                e.snapshot = snapshot_fn()
        while len(self.entries) > self.max_entries:
            self._drop(next(iter(self.entries)))

    def _drop(self, h: int) -> None:
        self.alloc.decref(self.entries.pop(h).block)
        self.evictions += 1

    def evict_for_space(self, need: int) -> None:
        """Evict least recently used entries until `need` blocks are free, skipping those whose block a
        sequence still holds: evicting them frees nothing now and loses what a preempted sequence would hit."""
        for h in [h for h, e in self.entries.items() if self.alloc.ref[e.block] == 1]:
            if self.alloc.num_free() >= need:
                return
            self._drop(h)

    def clear(self) -> None:
        for e in self.entries.values():
            self.alloc.decref(e.block)
        self.entries.clear()
