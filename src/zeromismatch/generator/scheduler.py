"""Which sequences run in the next forward and how many of their uncomputed tokens.

Policy: every running sequence with exactly one uncomputed token (decode) runs; the remaining token budget
goes to prefill work in admission order (unless the engine holds prefill back this step: ``prefill=False``).
A prefill piece stops at the last 64-token block boundary before the end of the known tokens (and, when the
budget cuts it, at a boundary), so the prefix cache can snapshot the GDN state there: that boundary is the one
a group of samples sharing the prompt reuses."""

from __future__ import annotations

from dataclasses import dataclass, field

from .cache import BLOCK_SIZE
from .sequence import Sequence


@dataclass
class Work:
    seq: Sequence
    n_tokens: int
    # the piece ends on the last known token: its last row's logits sample the next one (fixed when scheduled,
    # before the sequence's num_computed moves past the piece)
    samples: bool = field(init=False)

    def __post_init__(self):
        self.samples = self.seq.num_computed + self.n_tokens == self.seq.num_tokens


def schedule(running: list, max_batched_tokens: int, max_seqs: int, prefill: bool = True) -> list[Work]:
    work: list[Work] = []
    budget = max_batched_tokens
    pending = [(s, s.num_uncomputed) for s in running]
    for s, left in pending:
        if left == 1 and len(work) < max_seqs:
            work.append(Work(s, 1))
            budget -= 1
    for s, left in pending if prefill else ():
        if left <= 1 or len(work) >= max_seqs or budget <= 0:
            continue
        n = min(left, budget)
        if n < left:  # cut by the budget: stop at a block boundary
            end = (s.num_computed + n) // BLOCK_SIZE * BLOCK_SIZE
            if end <= s.num_computed:
                continue
            n = end - s.num_computed
        last_boundary = (s.num_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE
        if s.num_computed < last_boundary < s.num_computed + n:
            n = last_boundary - s.num_computed
        work.append(Work(s, n))
        budget -= n
    return work
