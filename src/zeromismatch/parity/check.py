"""The parity check: generate with the engine (continuous batching), rescore every sequence with the
trainer's packed forward, compare the logprobs token by token.

    res = check_parity(model, prompts, params, max_slots=5, order=..., arrivals=...)
    res.stats["max_abs_diff"], res.bitwise           # 0 / True in bi and bi_chunk
    report = run_parity(model)                       # `job=parity`: 16 random prompts + the activation audit

One piece of code for both sides' view: the generator's raw sampled logprobs (GenerationOutput) against
trainer.scoring.next_token_logprobs, the function the RL loss uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..generator import Engine, SamplingParams
from ..generator.engine import GenerationOutput
from ..trainer.scoring import next_token_logprobs
from .audit import ActivationAudit

__all__ = ["ParityCheck", "check_parity", "compare_logprobs", "generate", "random_prompts", "run_parity"]


PROMPT_MAX_LEN = 150  # run_parity's longest prompt


def random_prompts(n: int, vocab: int, seed: int, min_len: int = 3, max_len: int = PROMPT_MAX_LEN) -> list[list[int]]:
    """``n`` prompts of random token ids, lengths uniform in [min_len, max_len], fixed by ``seed``."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(min_len, max_len + 1, (n,), generator=g)
    return [torch.randint(0, vocab, (int(n_),), generator=g).tolist() for n_ in lens]


def generate(model, prompts, params, *, max_slots=8, max_batched_tokens=256, order=None, arrivals=None,
             prefix_caching=True, tap=None, engine=None, request_index: dict | None = None):
    """Run requests through the engine; `order` permutes arrival, `arrivals[i]` = engine step at which the
    i-th request (in that order) arrives (continuous batching with staggered arrivals). Returns (outputs in
    prompt order, engine). ``request_index``, when given, is filled with request id -> prompt index as
    requests are added (a ``tap`` can read it)."""
    eng = engine or Engine(model, max_slots=max_slots, max_batched_tokens=max_batched_tokens, prefix_caching=prefix_caching)
    eng.tap = tap
    order = list(range(len(prompts))) if order is None else list(order)
    arrivals = arrivals or [0] * len(order)
    pending = sorted(zip(arrivals, order))
    rid_of = request_index if request_index is not None else {}
    done, step = {}, 0
    while pending or eng.has_work():
        while pending and pending[0][0] <= step:
            _, i = pending.pop(0)
            rid_of[eng.add_request(prompts[i], params[i])] = i
        for out in eng.step():
            done[rid_of[out.request_id]] = out
        step += 1
    eng.tap = None
    return [done[i] for i in range(len(prompts))], eng


def _compare(model, outputs: list[GenerationOutput], temperature: float | None = None) -> tuple[dict, list[bool]]:
    with torch.no_grad():
        lps = next_token_logprobs(model, [o.all_tokens for o in outputs], temperature=temperature)
    diffs, equal = [], []
    for o, lp in zip(outputs, lps):
        p = len(o.prompt_ids)
        trainer = lp[p - 1 : p - 1 + len(o.tokens)]
        generator = o.logprob_tensor.to(trainer.device)
        equal.append(torch.equal(trainer, generator))
        diffs.append(trainer - generator)
    d = torch.cat(diffs)
    stats = {
        "max_abs_diff": float(d.abs().max()),
        "abs_mean": float(d.abs().mean()),
        "tokens": int(d.numel()),
        "sequences_equal": sum(equal),
        "sequences": len(outputs),
    }
    return stats, equal


def compare_logprobs(model, outputs: list[GenerationOutput]) -> dict:
    """Trainer rescoring vs generator logprobs over the generated tokens: max_abs_diff, abs_mean, tokens,
    sequences_equal (torch.equal per sequence), sequences."""
    return _compare(model, outputs)[0]


@dataclass
class ParityCheck:
    """One generate -> rescore -> compare pass."""

    outputs: list[GenerationOutput]  # in prompt order
    engine: Engine
    stats: dict  # compare_logprobs' numbers
    equal: list[bool]  # per sequence: trainer logprobs torch.equal the generator's

    @property
    def bitwise(self) -> bool:
        return all(self.equal)

    def unequal_requests(self) -> list[int]:
        return [o.request_id for o, eq in zip(self.outputs, self.equal) if not eq]


def check_parity(model, prompts: list[list[int]], params: list[SamplingParams], **generate_kw) -> ParityCheck:
    """Generate ``prompts`` (``generate``'s schedule knobs: max_slots, max_batched_tokens, order, arrivals,
    prefix_caching), rescore with the trainer's packed forward, compare. Requests with tempered_logprobs are
    rescored at their temperature (one for the whole check, as in an RL run)."""
    temps = {p.temperature if p.tempered_logprobs and p.temperature > 0 else 1.0 for p in params}
    if len(temps) > 1:
        raise ValueError(f"logprobs at several temperatures {sorted(temps)}: the trainer side scores at one")
    t = temps.pop() if temps else 1.0
    outputs, engine = generate(model, prompts, params, **generate_kw)
    stats, equal = _compare(model, outputs, None if t == 1.0 else t)
    return ParityCheck(outputs, engine, stats, equal)


def run_parity(model, *, n_prompts=16, max_new_tokens=24, seed=0, max_slots=8, audit=True, temperature=1.0,
               make_engine=None) -> dict:
    """The mismatch audit of `job=parity`: ``check_parity`` on ``n_prompts`` random prompts (3-150 tokens),
    then, with ``audit``, the same generation replayed with activation taps against the trainer's
    activations (``ActivationAudit``). Returns compare_logprobs' numbers, the generator's throughput and
    the audit (table, first divergence, first diverging op per token, per-op stats). ``make_engine``: a
    callable returning the engine of each pass (generator=vllm / vllm_native); default the embedded Engine."""
    prompts = random_prompts(n_prompts, model.config.vocab_size, seed)
    params = [SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed * 1000 + i) for i in range(n_prompts)]
    schedule = {"max_slots": max_slots, "max_batched_tokens": 256}
    if make_engine is not None:
        schedule["engine"] = make_engine()
    res = check_parity(model, prompts, params, **schedule)
    result = {**res.stats, "generator": dict(res.engine.throughput())}
    if audit:
        aud = ActivationAudit()
        with torch.no_grad():
            next_token_logprobs(model, [o.all_tokens for o in res.outputs], tap=aud.trainer_tap)
        # replay: same engine settings, same seeds -> the same schedule and samples, now tapped
        index_of: dict[int, int] = {}
        if make_engine is not None:
            schedule["engine"] = make_engine()
        replay, _ = generate(model, prompts, params, **schedule, tap=aud.generator_tap_for(index_of), request_index=index_of)
        if any(r.tokens != o.tokens for r, o in zip(replay, res.outputs)):
            raise RuntimeError("replay sampled different tokens: the engine is not deterministic")
        result["audit_table"] = aud.table()
        result["first_divergence"] = aud.first
        result["first_op_counts"] = aud.first_op_counts()
        result["per_op"] = aud.layer_summary()
    return result
