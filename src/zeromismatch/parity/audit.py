"""Per-op activation audit: where, in forward order, the generator's activations first differ from the
trainer's for the same (sequence, position)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch


def _rows(layout) -> list[tuple[int, int]]:
    """(sequence index in the call, absolute position) of every row of a forward call."""
    seq = torch.repeat_interleave(torch.arange(layout.num_seqs), layout.lengths.cpu()).tolist()
    return list(zip(seq, layout.positions.tolist()))


@dataclass
class ActivationAudit:
    """Trainer activations by (sequence, position) first (``trainer_tap``), then generator activations
    compared against them as they are computed (``generator_tap_for``)."""

    rows: dict = field(default_factory=dict)  # name -> {(seq, pos): tensor}
    stats: dict = field(default_factory=lambda: defaultdict(lambda: {"max": 0.0, "sum": 0.0, "n": 0, "ndiff": 0}))
    order: list = field(default_factory=list)  # op names in forward order
    first: dict | None = None  # earliest divergence seen (generation order)
    first_op: dict = field(default_factory=dict)  # (seq, pos) -> first op in forward order that differs

    def trainer_tap(self, name, x, layout):
        if name not in self.rows:
            self.rows[name] = {}
            self.order.append(name)
        for r, key in enumerate(_rows(layout)):
            self.rows[name][key] = x[r].detach().float().clone()

    def generator_tap_for(self, index_of_request: dict):
        """The engine tap; ``index_of_request`` maps request id -> trainer sequence index (filled as requests
        are added, before they run)."""

        def tap(name, x, layout, request_ids):
            ref = self.rows.get(name)
            if ref is None:
                return
            st = self.stats[name]
            for r, (s, p) in enumerate(_rows(layout)):
                key = (index_of_request[request_ids[s]], p)
                if key not in ref:  # last sampled token is never fed back: no trainer row needed
                    continue
                d = (x[r].detach().float() - ref[key]).abs()
                m = float(d.max())
                st["max"] = max(st["max"], m)
                st["sum"] += float(d.mean())
                st["n"] += 1
                st["ndiff"] += int(m > 0)
                if m > 0:
                    # taps arrive in forward order within a call, and a token is computed in one call
                    self.first_op.setdefault(key, name)
                    if self.first is None:
                        self.first = {"op": name, "sequence": key[0], "position": key[1], "max_abs_diff": m}

        return tap

    def first_op_counts(self) -> dict[str, int]:
        """op -> number of tokens whose first differing op it is."""
        counts: dict[str, int] = defaultdict(int)
        for name in self.first_op.values():
            counts[name] += 1
        return dict(counts)

    def table(self) -> str:
        lines = [f"{'op (forward order)':<28} {'max_abs_diff':>13} {'mean_abs_diff':>14} {'tokens differing':>18}"]
        for name in self.order:
            st = self.stats.get(name)
            if not st or not st["n"]:
                continue
            lines.append(f"{name:<28} {st['max']:>13.3e} {st['sum'] / st['n']:>14.3e} {st['ndiff']:>9}/{st['n']:<8}")
        if self.first:
            f = self.first
            lines.append(f"first divergence: {f['op']} (sequence {f['sequence']}, position {f['position']}, |diff| {f['max_abs_diff']:.3e})")
            where = ", ".join(f"{n}: {c}" for n, c in sorted(self.first_op_counts().items(), key=lambda kv: -kv[1]))
            lines.append(f"first diverging op per token: {where}")
        else:
            lines.append("first divergence: none (every activation equal bit for bit)")
        return "\n".join(lines)

    def layer_summary(self) -> dict:
        return {name: dict(self.stats[name]) for name in self.order if name in self.stats}
