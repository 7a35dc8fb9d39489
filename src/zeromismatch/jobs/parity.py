"""`python run.py job=parity model=tiny numerics=bi`: the mismatch audit.

Generate with the engine under continuous batching, rescore every sequence with the trainer's packed
forward, and compare logprobs token by token. Then replay the same generation with activation taps and
report, per op in forward order, how far the generator's activations are from the trainer's for the same
(sequence, position), and where they first diverge. Ends with the line

    parity: max_abs_diff=<x> abs_mean=<y> tokens=<n>

Run it to exonerate (or convict) the infra before blaming the algorithm.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch

from ..generator import Engine, SamplingParams
from ..trainer.scoring import next_token_logprobs


def random_prompts(n: int, vocab: int, seed: int, min_len: int = 3, max_len: int = 150) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(min_len, max_len + 1, (n,), generator=g)
    return [torch.randint(0, vocab, (int(n_),), generator=g).tolist() for n_ in lens]


def generate(model, prompts, params, *, max_slots=8, max_batched_tokens=256, order=None, arrivals=None,
             prefix_caching=True, tap=None, engine=None):
    """Run requests through the engine; `order` permutes arrival, `arrivals[i]` = engine step at which the
    i-th request (in that order) arrives (continuous batching with staggered arrivals). Outputs in prompt
    order."""
    eng = engine or Engine(model, max_slots=max_slots, max_batched_tokens=max_batched_tokens, prefix_caching=prefix_caching)
    eng.tap = tap
    order = list(range(len(prompts))) if order is None else list(order)
    arrivals = arrivals or [0] * len(order)
    pending = sorted(zip(arrivals, order))
    rid_of, done, step = {}, {}, 0
    while pending or eng.has_work():
        while pending and pending[0][0] <= step:
            _, i = pending.pop(0)
            rid_of[eng.add_request(prompts[i], params[i])] = i
        for out in eng.step():
            done[rid_of[out.request_id]] = out
        step += 1
    eng.tap = None
    return [done[i] for i in range(len(prompts))], eng


def compare_logprobs(model, outputs) -> dict:
    """Trainer rescoring vs generator logprobs, over generated tokens only."""
    with torch.no_grad():
        lps = next_token_logprobs(model, [o.all_tokens for o in outputs])
    diffs, n_equal = [], 0
    for o, lp in zip(outputs, lps):
        p = len(o.prompt_ids)
        t = lp[p - 1 : p - 1 + len(o.tokens)]
        n_equal += int(torch.equal(t, o.logprob_tensor))
        diffs.append(t - o.logprob_tensor)
    d = torch.cat(diffs)
    return {
        "max_abs_diff": float(d.abs().max()),
        "abs_mean": float(d.abs().mean()),
        "tokens": int(d.numel()),
        "sequences_equal": n_equal,
        "sequences": len(outputs),
    }


@dataclass
class ActivationAudit:
    """Trainer activations by (sequence, position), then generator activations compared against them."""

    rows: dict = field(default_factory=dict)  # name -> {(seq, pos): tensor}
    stats: dict = field(default_factory=lambda: defaultdict(lambda: {"max": 0.0, "sum": 0.0, "n": 0, "ndiff": 0}))
    order: list = field(default_factory=list)  # op names in forward order
    first: dict | None = None  # earliest divergence seen (generation order)
    first_op: dict = field(default_factory=dict)  # (seq, pos) -> first op in forward order that differs

    def trainer_tap(self, name, x, layout):
        if name not in self.rows:
            self.rows[name] = {}
            self.order.append(name)
        pos = layout.positions.tolist()
        seq = torch.repeat_interleave(torch.arange(layout.num_seqs), layout.lengths.cpu()).tolist()
        for r, (s, p) in enumerate(zip(seq, pos)):
            self.rows[name][(s, p)] = x[r].detach().float().clone()

    def generator_tap_for(self, index_of_request):
        def tap(name, x, layout, request_ids):
            ref = self.rows.get(name)
            if ref is None:
                return
            pos = layout.positions.tolist()
            seq = torch.repeat_interleave(torch.arange(layout.num_seqs), layout.lengths.cpu()).tolist()
            st = self.stats[name]
            for r, (s, p) in enumerate(zip(seq, pos)):
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
            counts: dict[str, int] = defaultdict(int)
            for name in self.first_op.values():
                counts[name] += 1
            where = ", ".join(f"{n}: {c}" for n, c in sorted(counts.items(), key=lambda kv: -kv[1]))
            lines.append(f"first diverging op per token: {where}")
        else:
            lines.append("first divergence: none (every activation equal bit for bit)")
        return "\n".join(lines)

    def layer_summary(self) -> dict:
        return {name: dict(self.stats[name]) for name in self.order if name in self.stats}


def run_parity(model, *, n_prompts=16, max_new_tokens=24, seed=0, max_slots=8, audit=True, temperature=1.0) -> dict:
    vocab = model.config.vocab_size
    prompts = random_prompts(n_prompts, vocab, seed)
    params = [SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed * 1000 + i) for i in range(n_prompts)]
    outs, eng = generate(model, prompts, params, max_slots=max_slots)
    result = compare_logprobs(model, outs)
    result["generator"] = {k: v for k, v in eng.throughput().items()}
    if audit:
        aud = ActivationAudit()
        with torch.no_grad():
            next_token_logprobs(model, [o.all_tokens for o in outs], tap=aud.trainer_tap)
        # replay: same engine settings, same seeds -> the same schedule and samples, now tapped
        index_of = {}
        eng2 = Engine(model, max_slots=max_slots, max_batched_tokens=256)
        replay_tap = aud.generator_tap_for(index_of)
        eng2.tap = replay_tap
        for i, (p, sp) in enumerate(zip(prompts, params)):
            index_of[eng2.add_request(p, sp)] = i
        replay = {}
        while eng2.has_work():
            for o in eng2.step():
                replay[index_of[o.request_id]] = o
        if any(replay[i].tokens != outs[i].tokens for i in range(n_prompts)):
            raise RuntimeError("replay sampled different tokens: the engine is not deterministic")
        result["audit_table"] = aud.table()
        result["first_divergence"] = aud.first
        result["first_op_counts"] = {n: list(aud.first_op.values()).count(n) for n in set(aud.first_op.values())}
        result["per_op"] = aud.layer_summary()
    return result


def main(cfg) -> dict:
    from ..models.qwen3_5 import build_model

    torch.manual_seed(int(cfg.get("seed", 0)))
    job = cfg.job
    model = build_model(cfg.model.preset, cfg.numerics.name, seed=int(job.get("seed", 0)))
    if cfg.model.get("checkpoint"):
        from ..models.qwen3_5.checkpoint import load_checkpoint

        model = load_checkpoint(cfg.model.checkpoint, numerics=cfg.numerics.name)
    model.eval()
    res = run_parity(
        model,
        n_prompts=int(job.get("n_prompts", 16)),
        max_new_tokens=int(job.get("max_new_tokens", 24)),
        seed=int(job.get("seed", 0)),
        max_slots=int(job.get("max_slots", 8)),
        audit=bool(job.get("audit", True)),
    )
    print(f"model={cfg.model.preset} numerics={cfg.numerics.name} sequences={res['sequences']} "
          f"equal={res['sequences_equal']} generator={res['generator']['generated_tokens_per_s']:.0f} tok/s")
    if "audit_table" in res:
        print(res["audit_table"])
    print(f"parity: max_abs_diff={res['max_abs_diff']:.6g} abs_mean={res['abs_mean']:.6g} tokens={res['tokens']}")
    out = {k: v for k, v in res.items() if k != "audit_table"}
    if job.get("out"):  # results/ record: what ran, where, and what it measured
        import json
        import os
        import platform
        import sys
        from pathlib import Path

        record = {
            "command": "python run.py " + " ".join(sys.argv[1:]),
            "machine": f"{platform.machine()} CPU ({os.cpu_count()} cores), torch threads={torch.get_num_threads()}",
            "torch": torch.__version__,
            "model": cfg.model.preset,
            "numerics": cfg.numerics.name,
            **out,
        }
        Path(job.out).parent.mkdir(parents=True, exist_ok=True)
        Path(job.out).write_text(json.dumps(record, indent=2, default=str))
    return out
