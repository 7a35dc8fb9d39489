"""SFT examples: the worked solutions of the offline math data (sft.jsonl), packed into varlen batches."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import InputFileError, parse_json
from ..tasks.base import cycle_shuffled
from ..tasks.math.prompts import render_prompt


def load_sft_records(path: str | Path, levels: list[int] | None = None) -> list[dict]:
    """Lines of an SFT jsonl (``prompt`` = user message, ``response`` = worked solution, ``answer``,
    ``level``), restricted to ``levels`` when given."""
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
    first use. Prompt = ``render_prompt(tok, record['prompt'], dapo_template=False)`` (the same ids
    MathTask gives RL), target = solution tokens + eos."""

    def __init__(self, records: list[dict], tokenizer, batch_size: int, max_seq_len: int, seed: int, template_kwargs=None):
        self.records, self.tok = records, tokenizer
        self.batch_size, self.max_seq_len = batch_size, max_seq_len
        self.template_kwargs = dict(template_kwargs or {})
        self.eos = tokenizer.eos_token_id
        if self.eos is None:
            raise ValueError("SFT needs a tokenizer with an eos token (the solution's end)")
        self._order = cycle_shuffled(len(records), seed)
        self._cache: dict[int, tuple[list[int], list[int]]] = {}
        self.skipped = 0

    def example(self, i: int) -> tuple[list[int], list[int]]:
        if i not in self._cache:
            r = self.records[i]
            prompt = render_prompt(self.tok, r["prompt"], dapo_template=False, **self.template_kwargs)
            target = self.tok.encode(r["response"], add_special_tokens=False) + [self.eos]
            self._cache[i] = (prompt, target)
        return self._cache[i]

    def next_batch(self):
        """(ids [N], cu_seqlens, rows, targets, n_target_tokens) as CPU tensors / lists."""
        seqs = []
        while len(seqs) < self.batch_size:
            prompt, target = self.example(next(self._order))
            if len(prompt) + len(target) > self.max_seq_len:
                self.skipped += 1
                if self.skipped > 100 * self.batch_size and not seqs:
                    raise ValueError(f"SFT examples do not fit max_seq_len={self.max_seq_len}")
                continue
            seqs.append((prompt, target))
        ids, cu, rows = [], [0], []
        for prompt, target in seqs:
            start = cu[-1]
            ids.extend(prompt + target)
            # position j predicts token j + 1: rows from the last prompt token to the one before eos
            rows.extend(range(start + len(prompt) - 1, start + len(prompt) + len(target) - 1))
            cu.append(len(ids))
        ids_t = torch.tensor(ids, dtype=torch.long)
        rows_t = torch.tensor(rows, dtype=torch.long)
        return ids_t, cu, rows_t, ids_t[rows_t + 1], len(rows)
