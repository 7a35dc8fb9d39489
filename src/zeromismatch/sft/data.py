"""SFT examples: the task's demonstrations (its SFT jsonl, tokenized by ``Task.sft_example``), packed into
varlen batches. The loss covers the tokens the mask marks: the model's turns, never the prompt or tool output."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from ..errors import InputFileError, parse_json
from ..tasks.base import cycle_shuffled

Encode = Callable[[dict], tuple[list[int], list[int]]]  # record -> (token ids, loss mask)


def load_sft_records(path: str | Path, levels: list[int] | None = None) -> list[dict]:
    """Lines of an SFT jsonl (``prompt`` = user message, ``response`` = the demonstration, plus task fields such
    as ``answer`` and ``level``), restricted to ``levels`` when given."""
    records = []
    with open(path) as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            r = parse_json(line, path, i + 1)
            if not isinstance(r, dict) or not isinstance(r.get("prompt"), str) or not isinstance(r.get("response"), str):
                raise InputFileError(f"{path}:{i + 1}: needs a JSON object with string 'prompt' and 'response'")
            if levels is None or r.get("level") in levels:
                records.append(r)
    if not records:
        raise ValueError(f"{path}: no SFT records" + (f" at levels {levels}" if levels else ""))
    return records


class SFTBatches:
    """Endless packed batches: records in an order shuffled by ``seed`` (reshuffled per epoch), tokenized on
    first use by ``encode`` (the task's ``sft_example``: the prompt ids RL gives, then the demonstration, with a
    loss mask)."""

    def __init__(self, records: list[dict], encode: Encode, batch_size: int, max_seq_len: int, seed: int):
        self.records, self.encode = records, encode
        self.batch_size, self.max_seq_len = batch_size, max_seq_len
        self._order = cycle_shuffled(len(records), seed)
        self._cache: dict[int, tuple[list[int], list[int]]] = {}
        self.skipped = 0

    def example(self, i: int) -> tuple[list[int], list[int]]:
        if i not in self._cache:
            ids, mask = self.encode(self.records[i])
            if len(ids) != len(mask) or not any(mask[1:]) or mask[0]:
                raise ValueError(f"SFT record {i}: loss mask must match the ids, skip the first token and mark some")
            self._cache[i] = (list(ids), list(mask))
        return self._cache[i]

    def next_batch(self):
        """(ids [N], cu_seqlens, rows, targets, n_target_tokens) as CPU tensors / lists."""
        seqs = []
        while len(seqs) < self.batch_size:
            ids, mask = self.example(next(self._order))
            if len(ids) > self.max_seq_len:
                self.skipped += 1
                if self.skipped > 100 * self.batch_size and not seqs:
                    raise ValueError(f"SFT examples do not fit max_seq_len={self.max_seq_len}")
                continue
            seqs.append((ids, mask))
        flat, cu, rows = [], [0], []
        for ids, mask in seqs:
            start = cu[-1]
            flat.extend(ids)
            # position j - 1 predicts token j: one row per trained token
            rows.extend(start + j - 1 for j in range(1, len(ids)) if mask[j])
            cu.append(len(flat))
        ids_t = torch.tensor(flat, dtype=torch.long)
        rows_t = torch.tensor(rows, dtype=torch.long)
        return ids_t, cu, rows_t, ids_t[rows_t + 1], len(rows)
