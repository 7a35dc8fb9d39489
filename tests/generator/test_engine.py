"""Engine mechanics on a micro hybrid: finish order, stop / length, continuous batching (prefill + decode in
one forward, token budget, mid-flight arrivals), seeds, multi-turn bookkeeping, errors, throughput.

Batch invariance ('bi' numerics) is what lets these tests compare token lists and fp32 logprob tensors
with == / torch.equal across different schedules."""

import math
from dataclasses import replace

import pytest
import torch

import zeromismatch.generator.engine as engine_mod
from gen_helpers import MICRO, VOCAB, assert_same_outputs, prompts_of, run_all
from zeromismatch.generator import Engine, SamplingParams
from zeromismatch.generator.cache import BLOCK_SIZE
from zeromismatch.models.qwen3_5 import build_model
from zeromismatch.parity import generate


def make(model, **kw):
    kw.setdefault("max_model_len", 512)
    return Engine(model, **kw)


# ------------------------------------------------------------------------------------------ finishing
def test_finish_order_and_exact_lengths(micro_model):
    eng = make(micro_model(), max_slots=4)
    prompts = prompts_of([20, 20, 20, 20], seed=1)
    lens = [7, 2, 11, 4]
    rids = [eng.add_request(p, SamplingParams(max_new_tokens=n, seed=i)) for i, (p, n) in enumerate(zip(prompts, lens))]
    done = run_all(eng)
    # step 0 prefills all four and samples their first token, then one token per step: a request with
    # max_new_tokens = n finishes in step n - 1, so shorter requests finish strictly earlier
    assert [done[r][1] for r in rids] == [n - 1 for n in lens]
    for r, p, n in zip(rids, prompts, lens):
        o = done[r][0]
        assert o.finish_reason == "length"
        assert len(o.tokens) == len(o.logprobs) == len(o.versions) == n
        assert o.all_tokens == p + o.tokens and o.prompt_ids == p
        assert o.logprob_tensor.dtype == torch.float32 and o.logprob_tensor.tolist() == o.logprobs
        assert o.versions == [0] * n and o.admission_version == 0
        assert all(0 <= t < VOCAB for t in o.tokens) and all(lp < 0 for lp in o.logprobs)
    assert not eng.has_work() and sorted(eng.free_slots) == [0, 1, 2, 3]


def test_stop_tokens_end_the_sequence_at_the_first_stop(micro_model):
    model = micro_model()
    stop = tuple(range(0, VOCAB, 2))  # half the vocab: a near-uniform model stops after ~2 tokens
    prompts = prompts_of([5, 30, 70, 12, 40, 3], seed=2)
    free = [SamplingParams(max_new_tokens=24, seed=10 + i) for i in range(6)]
    stopping = [SamplingParams(max_new_tokens=24, seed=10 + i, stop_token_ids=stop) for i in range(6)]
    ref, _ = generate(model, prompts, free, max_slots=6)
    outs, eng = generate(model, prompts, stopping, max_slots=6)
    assert max(len(o.tokens) for o in outs) > 1, "the check below needs some multi-token runs"
    for o, r in zip(outs, ref):
        assert o.finish_reason == "stop"
        assert o.tokens[-1] in stop and not any(t in stop for t in o.tokens[:-1])
        # stopping truncates: same seed -> the same draws as without stop tokens, up to the first stop
        k = next(i for i, t in enumerate(r.tokens) if t in stop) + 1
        assert o.tokens == r.tokens[:k] and torch.equal(o.logprob_tensor, r.logprob_tensor[:k])
        assert o.all_tokens == o.prompt_ids + o.tokens  # nothing after the stop token
    assert eng.stats["tokens_generated"] == sum(len(o.tokens) for o in outs)
    assert sorted(eng.free_slots) == list(range(6)) and not eng.running


def test_max_new_tokens_wins_when_no_stop_is_hit(micro_model):
    stop = (VOCAB - 1,)  # rare
    out = make(micro_model(), max_slots=2).generate(prompts_of([9], seed=3), SamplingParams(max_new_tokens=5, seed=0, stop_token_ids=stop))[0]
    assert out.finish_reason == "length" and len(out.tokens) == 5 and stop[0] not in out.tokens


# -------------------------------------------------------------------------------- continuous batching
def test_one_forward_mixes_decode_and_prefill(micro_model):
    eng = make(micro_model(), max_slots=4)
    forwards = []
    eng.tap = lambda name, x, lay, rids: forwards.append((list(rids), lay.lengths.tolist(), lay.start_pos.tolist())) if name == "embed" else None
    a = eng.add_request(prompts_of([10], seed=4)[0], SamplingParams(max_new_tokens=6, seed=0))
    eng.step()
    eng.step()  # a: prefill, then one decode
    b = eng.add_request(prompts_of([100], seed=5)[0], SamplingParams(max_new_tokens=3, seed=1))
    eng.step()
    eng.step()
    assert forwards[0] == ([a], [10], [0])
    assert forwards[1] == ([a], [1], [10])
    # a decodes (1 token) in the same forward as b's first prefill piece (up to the last block boundary)
    assert forwards[2] == ([a, b], [1, 64], [11, 0])
    assert forwards[3] == ([a, b], [1, 36], [12, 64])  # b's remainder: b samples its first token here
    outs = {o.request_id: o for o, _ in run_all(eng).values()}
    assert len(outs[a].tokens) == 6 and len(outs[b].tokens) == 3
    # mixing changed nothing: each request alone gives the same tokens and logprobs
    for rid, p, sp in ((a, outs[a].prompt_ids, SamplingParams(max_new_tokens=6, seed=0)), (b, outs[b].prompt_ids, SamplingParams(max_new_tokens=3, seed=1))):
        assert_same_outputs([outs[rid]], make(micro_model(), max_slots=1).generate([p], sp))


def test_token_budget_and_decode_first_inside_the_engine(micro_model, monkeypatch):
    model = micro_model()
    plans = []
    real = engine_mod.schedule

    def spy(running, budget, max_seqs, prefill=True):
        assert prefill  # piece_interval 1: pieces are never held back
        work = real(running, budget, max_seqs, prefill)
        plans.append([(w.seq.num_uncomputed == 1, w.n_tokens, w.seq.num_computed, w.seq.num_tokens) for w in work])
        return work

    monkeypatch.setattr(engine_mod, "schedule", spy)
    prompts = prompts_of([5, 200, 90, 150, 33, 140], seed=6)
    params = [SamplingParams(max_new_tokens=6, seed=i) for i in range(6)]
    outs, eng = generate(model, prompts, params, max_slots=4, max_batched_tokens=96, arrivals=[0, 0, 1, 2, 4, 4])
    plans = [p for p in plans if p]  # steps without work run no forward
    assert len(plans) == eng.stats["steps"]
    mixed = 0
    for plan in plans:
        n_dec = sum(d for d, *_ in plan)
        assert all(d for d, *_ in plan[:n_dec]) and not any(d for d, *_ in plan[n_dec:]), "decode rows first"
        assert sum(n for _, n, *_ in plan) <= max(96, n_dec)
        for dec, n, comp, tot in plan:
            if not dec and n < tot - comp:
                assert (comp + n) % BLOCK_SIZE == 0, "a cut prefill piece ends on a block boundary"
        mixed += n_dec > 0 and n_dec < len(plan)
    assert mixed > 0
    assert eng.stats["tokens_computed"] == sum(n for plan in plans for _, n, *_ in plan)
    monkeypatch.setattr(engine_mod, "schedule", real)
    # pieces of 96 tokens gave the same results as one-shot prefill with a large budget
    big, _ = generate(model, prompts, params, max_slots=6, max_batched_tokens=4096)
    assert_same_outputs(outs, big)


def test_requests_arriving_mid_flight_are_served(micro_model):
    model = micro_model()
    prompts = prompts_of([12, 80, 7, 130, 40, 66, 3, 100], seed=7)
    params = [SamplingParams(max_new_tokens=5 + i % 3, seed=20 + i) for i in range(8)]
    at_once, _ = generate(model, prompts, params, max_slots=8)
    eng = make(model, max_slots=3, max_batched_tokens=128)
    done, pending = {}, list(range(8))
    step = 0
    while pending or eng.has_work():
        if pending and step % 2 == 0:  # one arrival every other step, while others are mid-decode
            i = pending.pop(0)
            if step > 0:
                assert eng.running, "arrival should land while requests are in flight"
            done[eng.add_request(prompts[i], params[i])] = None
        for o in eng.step():
            done[o.request_id] = o
        step += 1
    outs = [done[r] for r in sorted(done)]
    assert all(o is not None for o in outs)
    assert_same_outputs(outs, at_once)


# ---------------------------------------------------------------------------------------------- seeds
@pytest.mark.parametrize("numerics", ["stock", "bi", "bi_chunk"])
def test_same_seed_same_tokens_across_runs(micro_model, numerics):
    model = micro_model(numerics)
    prompts = prompts_of([17, 70, 140], seed=8)
    params = [SamplingParams(max_new_tokens=6, seed=s) for s in (5, 6, 7)]
    a, _ = generate(model, prompts, params, max_slots=3)
    b, _ = generate(model, prompts, params, max_slots=3)
    assert_same_outputs(a, b)


def test_same_seed_same_tokens_across_batch_compositions_and_orders(micro_model):
    model = micro_model("bi")
    prompts = prompts_of([17, 70, 140, 5, 99, 64], seed=9)
    params = [SamplingParams(max_new_tokens=6, seed=1000 + i, temperature=0.9, top_k=50, top_p=0.95) for i in range(6)]
    ref, _ = generate(model, prompts, params, max_slots=6)
    for kw in (
        dict(max_slots=1),
        dict(max_slots=2, order=[5, 4, 3, 2, 1, 0]),
        dict(max_slots=4, order=[3, 0, 5, 1, 4, 2], arrivals=[0, 0, 2, 2, 5, 9], max_batched_tokens=64),
    ):
        outs, _ = generate(model, prompts, params, **kw)
        assert_same_outputs(outs, ref)
    # alone in an engine that has unrelated traffic before it
    eng = make(model, max_slots=4)
    for p in prompts_of([30, 50], seed=99):
        eng.add_request(p, SamplingParams(max_new_tokens=3, seed=0))
    eng.step()
    rid = eng.add_request(prompts[2], params[2])
    outs = {o.request_id: o for o, _ in run_all(eng).values()}
    assert_same_outputs([outs[rid]], [ref[2]])


def test_different_seeds_different_tokens(micro_model):
    prompt = prompts_of([40], seed=10)[0]
    outs, _ = generate(micro_model(), [prompt] * 6, [SamplingParams(max_new_tokens=8, seed=s) for s in range(6)], max_slots=6)
    assert len({tuple(o.tokens) for o in outs}) == 6


# ----------------------------------------------------------------------------------------- multi-turn
def test_multi_turn_continues_from_the_kept_cache(micro_model):
    model = micro_model()
    eng = make(model, max_slots=2)
    prompt, tool = prompts_of([50, 37], seed=11)
    rid = eng.add_request(prompt, SamplingParams(max_new_tokens=4, temperature=0, keep_cache=True))
    (t1, _), = run_all(eng).values()
    assert rid in eng.parked and eng.running == []
    before = eng.stats["tokens_computed"]
    eng.continue_request(rid, tool, SamplingParams(max_new_tokens=5, temperature=0))
    (t2, _), = run_all(eng).values()
    # only the last turn-1 token (sampled, never fed), the tool tokens and 4 decodes are computed
    assert eng.stats["tokens_computed"] - before == 1 + len(tool) + 4
    assert t2.tokens[:4] == t1.tokens and len(t2.tokens) == 9 and len(t2.logprob_tensor) == 5
    assert t2.all_tokens == prompt + t1.tokens + tool + t2.tokens[4:]
    assert t2.logprobs[:4] == t1.logprobs and t2.logprob_tensor.tolist() == t2.logprobs[4:]
    assert rid not in eng.parked and sorted(eng.free_slots) == [0, 1]  # turn 2 did not keep the cache
    # greedy turn 2 == a fresh engine fed the whole conversation as a prompt (bit for bit)
    fresh = make(model, max_slots=1).generate([prompt + t1.tokens + tool], SamplingParams(max_new_tokens=5, temperature=0))[0]
    assert fresh.tokens == t2.tokens[4:] and torch.equal(fresh.logprob_tensor, t2.logprob_tensor)


# --------------------------------------------------------------------------------------------- errors
def test_request_errors(micro_model):
    eng = make(micro_model(), max_slots=2, max_model_len=100)
    with pytest.raises(ValueError, match="empty"):
        eng.add_request([], SamplingParams())
    with pytest.raises(ValueError, match="max_model_len"):
        eng.add_request([1] * 90, SamplingParams(max_new_tokens=11))
    eng.add_request([1] * 90, SamplingParams(max_new_tokens=10))  # exactly max_model_len is fine
    with pytest.raises(ValueError, match="token ids"):
        eng.add_request([1, VOCAB], SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="token ids"):
        eng.add_request([-1, 3], SamplingParams(max_new_tokens=4))
    with pytest.raises(KeyError, match="not parked"):
        eng.continue_request(12345, [1, 2])
    with pytest.raises(KeyError, match="not parked"):
        eng.release(12345)
    run_all(eng)  # the rejected requests left nothing behind
    assert eng.stats["tokens_generated"] == 10


def test_request_ids_are_unique(micro_model):
    eng = make(micro_model(), max_slots=2)
    assert eng.add_request([1, 2], SamplingParams(max_new_tokens=1), request_id=1) == 1
    with pytest.raises(ValueError, match="already in use"):
        eng.add_request([3, 4], SamplingParams(max_new_tokens=1), request_id=1)
    auto = [eng.add_request([5], SamplingParams(max_new_tokens=1)) for _ in range(3)]
    assert auto == [0, 2, 3]  # the counter skips the id taken explicitly
    assert sorted(run_all(eng)) == [0, 1, 2, 3]
    assert eng.add_request([1, 2], SamplingParams(max_new_tokens=1), request_id=1) == 1  # reusable once finished


def test_continue_request_errors_leave_the_request_parked(micro_model):
    eng = make(micro_model(), max_slots=2, max_model_len=100)
    rid = eng.add_request([7] * 30, SamplingParams(max_new_tokens=2, keep_cache=True))
    run_all(eng)
    with pytest.raises(KeyError, match="not parked"):
        eng.continue_request(rid + 1, [1])
    with pytest.raises(ValueError, match="max_model_len"):
        eng.continue_request(rid, [1] * 60, SamplingParams(max_new_tokens=20))
    with pytest.raises(ValueError, match="token ids"):
        eng.continue_request(rid, [VOCAB + 5])
    assert rid in eng.parked and eng.parked[rid].params.max_new_tokens == 2 and len(eng.parked[rid].tokens) == 32
    eng.continue_request(rid, [1] * 10, SamplingParams(max_new_tokens=3))
    (o, _), = run_all(eng).values()
    assert len(o.tokens) == 5 and len(o.logprob_tensor) == 3
    assert sorted(eng.free_slots) == [0, 1]


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=math.nan), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.01), "top_p"),
        (dict(top_p=math.nan), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(max_new_tokens=math.nan), "max_new_tokens"),
    ],
)
def test_bad_sampling_params(kw, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kw)


def test_engine_rejects_unknown_swap_policy(micro_model):
    with pytest.raises(ValueError, match="swap_policy"):
        make(micro_model(), swap_policy="sometimes")


# ------------------------------------------------------------------------------------------ throughput
def test_throughput_and_stats(micro_model):
    outs, eng = generate(micro_model(), prompts_of([20, 90, 45], seed=12), [SamplingParams(max_new_tokens=4, seed=i) for i in range(3)], max_slots=3)
    tp = eng.throughput()
    assert tp["generated_tokens_per_s"] > 0 and tp["computed_tokens_per_s"] >= tp["generated_tokens_per_s"]
    assert tp["tokens_generated"] == 12 and tp["forward_s"] > 0 and tp["steps"] > 0
    # every known token is computed once except each request's last sampled one (no prefix sharing here)
    assert tp["tokens_computed"] == sum(len(o.all_tokens) - 1 for o in outs)


def _multi_turn_trace(mode: str, piece_interval: int) -> tuple[dict, int, int]:
    """Six requests of three model turns each, with tool output arriving a few engine steps after a turn ends
    (as an environment answers), on one engine; every turn's output per request, the steps, the steps with a
    prefill piece."""
    import random

    model = build_model("tiny", mode, seed=3, **MICRO).eval()
    eng = Engine(model, max_slots=6, max_batched_tokens=256, max_model_len=512, cuda_graphs=True,
                 piece_interval=piece_interval)
    execute, with_pieces = eng.runner.execute, [0]

    def counted(work, tap=None):
        with_pieces[0] += any(w.n_tokens > 1 for w in work)
        return execute(work, tap)

    eng.runner.execute = counted
    rng = random.Random(0)
    params = SamplingParams(temperature=1.0, max_new_tokens=6, keep_cache=True)
    rids = [eng.add_request(p, replace(params, seed=i)) for i, p in enumerate(prompts_of([9, 30, 17, 70, 5, 44]))]
    turns = {r: [] for r in rids}
    tools = {r: [prompts_of([rng.randint(2, 20)], seed=10 * r + t)[0] for t in range(2)] for r in rids}
    delays = {r: [rng.randint(0, 6) for _ in range(2)] for r in rids}
    due: list[tuple[int, int]] = []  # (step at which the tool output arrives, request)
    step = 0
    while eng.has_work() or due:
        for at, r in [d for d in due if d[0] <= step]:
            due.remove((at, r))
            t = len(turns[r])
            eng.continue_request(r, tools[r][t - 1], replace(params, seed=r, keep_cache=t < 2))
        if eng.has_work():
            for out in eng.step():
                turns[out.request_id].append((out.tokens[-len(out.logprob_tensor):], out.logprob_tensor))
                t = len(turns[out.request_id])
                if t < 3:
                    due.append((step + 1 + delays[out.request_id][t - 1], out.request_id))
        step += 1
    assert all(len(v) == 3 for v in turns.values())
    return turns, eng.stats["steps"], with_pieces[0]


@pytest.mark.parametrize("mode", ["bi", "bi_chunk"])
def test_holding_prefill_pieces_back_changes_no_bit_and_runs_fewer_piece_steps(mode):
    """piece_interval: tool output and prompts wait up to N-1 steps while decode rows run, then join one step
    together. Every turn's tokens and fp32 logprobs are the same bits as with pieces in every step (batch
    invariance), and fewer steps carry a piece (each such step is an eager forward on CUDA)."""
    every, n_every, pieces_every = _multi_turn_trace(mode, 1)
    held, n_held, pieces_held = _multi_turn_trace(mode, 4)
    for r in every:
        for (ta, la), (tb, lb) in zip(every[r], held[r]):
            assert ta == tb and torch.equal(la, lb), f"request {r}: a turn differs"
    assert pieces_held < pieces_every, (pieces_held, pieces_every)


def test_piece_interval_is_checked():
    model = build_model("tiny", "bi", seed=3, **MICRO).eval()
    with pytest.raises(ValueError, match="piece_interval must be >= 1"):
        Engine(model, max_slots=2, piece_interval=0)
