"""Model runner: one forward of the model over a step's scheduled work.

It packs the work's pieces into one varlen batch (input ids, cu_seqlens, start positions), hands the model a
BatchCacheView of the pieces' slots and block tables, and asks for logits only at the rows that sample. The
Engine sees `execute(work) -> logits` and `load_weights(state_dict)`: a CUDA-graph runner or a vLLM backend
plugs in behind these two methods.
"""

from __future__ import annotations

import torch

from .cache import BatchCacheView, CacheStorage
from .scheduler import Work


class ModelRunner:
    def __init__(self, model, storage: CacheStorage, device):
        self.model, self.storage, self.device = model, storage, device

    def execute(self, work: list[Work], tap=None) -> torch.Tensor:
        """fp32 logits [R, V], one row per piece that samples (Work.samples), in work order.
        tap(name, activation [N, ...], layout, request_ids): the audit hook, called by every tapped op."""
        ids, cu, start, rows = [], [0], [], []
        for w in work:
            s = w.seq
            ids.extend(s.tokens[s.num_computed : s.num_computed + w.n_tokens])
            cu.append(cu[-1] + w.n_tokens)
            start.append(s.num_computed)
            if w.samples:
                rows.append(cu[-1] - 1)
        view = BatchCacheView(self.storage, [w.seq.slot for w in work], [w.seq.block_table for w in work], self.device)
        model_tap = None
        if tap is not None:
            rids = [w.seq.request_id for w in work]
            model_tap = lambda name, x, lay: tap(name, x, lay, rids)
        with torch.no_grad():
            return self.model(
                torch.tensor(ids, device=self.device),
                cu,
                start_pos=torch.tensor(start, device=self.device),
                cache=view,
                logits_rows=torch.tensor(rows, device=self.device, dtype=torch.long),
                tap=model_tap,
            )

    @torch.no_grad()
    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Copy every parameter from state_dict; checks names and shapes before copying anything, so a failed
        load never leaves half-new weights."""
        params = dict(self.model.named_parameters())
        missing = set(params) - set(state_dict)
        if missing:
            raise KeyError(f"update_weights: missing tensors {sorted(missing)[:5]}")
        bad = sorted(n for n, p in params.items() if tuple(state_dict[n].shape) != tuple(p.shape))
        if bad:
            raise ValueError(f"update_weights: shape mismatch for {bad[:5]}")
        for name, p in params.items():
            p.copy_(state_dict[name].to(p.dtype))
