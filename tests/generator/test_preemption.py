"""Preemption: an engine with too few KV blocks (or slots) preempts instead of failing, every request completes,
and a preempted sequence's recompute changes no sampled token and no logprob bit (bi, bi_chunk): its outputs
equal those of an engine with plenty of blocks, and the trainer rescores them bit for bit. A request that
cannot fit even alone fails at add_request with one line."""

import pytest
import torch

from gen_helpers import assert_no_leak, assert_same_outputs, prompts_of, run_all
from zeromismatch.generator import Engine, SamplingParams
from zeromismatch.parity import compare_logprobs, generate
from zeromismatch.trainer.scoring import next_token_logprobs

LENS = [150, 90, 130, 70, 160, 40, 120, 100, 140, 60]


def requests(seed=21):
    """10 concurrent requests of 2-4 blocks each (~32 blocks in all); sampled at temperature 1, some with
    top-p / top-k, so every token draws from the request's generator."""
    prompts = prompts_of(LENS, seed=seed)
    params = [
        SamplingParams(max_new_tokens=30 + 3 * i, seed=300 + i, top_p=(1.0, 0.9, 1.0)[i % 3], top_k=(0, 0, 40)[i % 3])
        for i in range(len(LENS))
    ]
    return prompts, params


def tight(model, num_blocks=8, **kw):
    return Engine(model, max_slots=len(LENS), num_blocks=num_blocks, max_model_len=256, **kw)


@pytest.mark.parametrize("prefix_caching", [True, False])
@pytest.mark.parametrize("numerics", ["bi", "bi_chunk"])
def test_engine_past_its_blocks_matches_an_ample_one_bitwise(micro_model, numerics, prefix_caching):
    model = micro_model(numerics)
    prompts, params = requests()
    eng = tight(model, prefix_caching=prefix_caching)
    outs, _ = generate(model, prompts, params, engine=eng)
    ample, ample_eng = generate(model, prompts, params, max_slots=len(LENS), prefix_caching=prefix_caching)
    assert ample_eng.stats["preemptions"] == 0 and eng.stats["preemptions"] > 0
    assert_same_outputs(outs, ample)
    parity = compare_logprobs(model, outs)
    assert parity["sequences_equal"] == parity["sequences"] == len(LENS) and parity["max_abs_diff"] == 0
    # a preempted sequence recomputes what it had computed: more work, same tokens
    assert eng.stats["tokens_computed"] > sum(len(o.all_tokens) - 1 for o in outs) - eng.stats["prefix_hit_tokens"]
    if not prefix_caching:
        assert eng.stats["prefix_hit_tokens"] == 0
    assert_no_leak(eng)


def test_recompute_resumes_from_its_own_prefix_entries(micro_model):
    """With room for entries beside the live sequences, a preempted sequence hits the blocks it published
    before it was preempted and recomputes only the tail past its last snapshot."""
    model = micro_model()
    prompts, params = requests()
    eng = tight(model, num_blocks=14)
    outs, _ = generate(model, prompts, params, engine=eng)
    assert eng.stats["preemptions"] > 0 and eng.stats["prefix_hit_tokens"] > 0  # prompts share nothing
    ample, _ = generate(model, prompts, params, max_slots=len(LENS))
    assert_same_outputs(outs, ample)
    assert_no_leak(eng)


def test_preemption_count_and_order(micro_model):
    """The newest sequence is preempted first and the oldest is never: requests finish in admission order
    when all ask for the same length, and nothing is preempted when the blocks suffice."""
    model = micro_model()
    prompts = prompts_of([100] * 4, seed=5)
    params = [SamplingParams(max_new_tokens=60, seed=i) for i in range(4)]
    eng = Engine(model, max_slots=4, num_blocks=6, max_model_len=256, prefix_caching=False)
    preempted = []
    real = eng.kv.preempt
    eng.kv.preempt = lambda s: preempted.append(s.request_id) or real(s)
    rids = [eng.add_request(p, sp) for p, sp in zip(prompts, params)]
    done = run_all(eng)
    assert rids[0] not in preempted and eng.stats["preemptions"] > 0
    assert sorted(rids, key=lambda r: done[r][1]) == rids
    ample = Engine(model, max_slots=4, num_blocks=16, max_model_len=256, prefix_caching=False)
    outs, _ = generate(model, prompts, params, engine=ample)
    assert ample.stats["preemptions"] == 0
    assert_same_outputs([done[r][0] for r in rids], outs)


def conversation(eng, prompts, tools, others):
    """Three requests park after turn 1, other traffic runs, then they continue; the first parks again, more
    traffic runs, and it is released. Returns every output in order."""
    turn1_params = [SamplingParams(max_new_tokens=10, seed=i, keep_cache=True) for i in range(len(prompts))]
    rids = [eng.add_request(p, sp) for p, sp in zip(prompts, turn1_params)]
    turn1 = run_all(eng)
    outs = [turn1[r][0] for r in rids]
    outs += eng.generate(others, [SamplingParams(max_new_tokens=30, seed=20 + i) for i in range(len(others))])
    for i, (rid, tool) in enumerate(zip(rids, tools)):
        eng.continue_request(rid, tool, SamplingParams(max_new_tokens=8, seed=40 + i, keep_cache=i == 0))
    turn2 = run_all(eng)
    outs += [turn2[r][0] for r in rids]
    outs += eng.generate(others, [SamplingParams(max_new_tokens=30, seed=60 + i) for i in range(len(others))])
    eng.release(rids[0])
    return outs


def test_parked_sequences_are_preempted_first_and_recompute_on_continue(micro_model):
    model = micro_model()
    prompts, tools = prompts_of([100, 120, 80], seed=6), prompts_of([30, 50, 20], seed=7)
    others = prompts_of([150, 150], seed=8)
    # parked after turn 1: 2 + 3 + 2 blocks; the other traffic needs 6; turn 2 needs 3 blocks per sequence
    eng = Engine(model, max_slots=5, num_blocks=8, max_model_len=256)
    outs = conversation(eng, prompts, tools, others)
    assert eng.stats["parked_preemptions"] > 0
    ample = Engine(model, max_slots=5, max_model_len=256)
    assert_same_outputs(outs, conversation(ample, prompts, tools, others))
    assert ample.stats["parked_preemptions"] == ample.stats["preemptions"] == 0
    assert_no_leak(eng)


def test_parked_sequences_give_up_a_slot_when_they_hold_every_slot(micro_model):
    model = micro_model()
    eng = Engine(model, max_slots=2, max_model_len=256)
    a, b, c = prompts_of([40, 50, 60], seed=9)
    rids = [eng.add_request(p, SamplingParams(max_new_tokens=4, seed=i, keep_cache=True)) for i, p in enumerate((a, b))]
    run_all(eng)
    (out,) = eng.generate([c], SamplingParams(max_new_tokens=5, seed=2))  # would wait forever for a slot
    assert eng.stats["parked_preemptions"] == 1 and eng.parked[rids[0]].slot == -1 and eng.parked[rids[1]].slot >= 0
    ref = Engine(model, max_slots=1, max_model_len=256).generate([c], SamplingParams(max_new_tokens=5, seed=2))
    assert_same_outputs([out], ref)
    for r in rids:
        eng.release(r)
    assert_no_leak(eng)


def perturbed(model, seed=9, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("policy", ["keep", "recompute"])
def test_preempted_sequence_recomputes_under_the_current_weights(micro_model, policy):
    """A token sampled under version 1 is exactly the new weights' when the sequence's cache holds only new-
    weight tokens: always under 'recompute', and under 'keep' once a preemption after the swap made the
    sequence recompute. Tokens sampled before the swap stay the old weights'; admission versions stay."""
    model = micro_model(fresh=True)
    old = {k: v.clone() for k, v in model.state_dict().items()}
    new = perturbed(model)
    prompts, params = requests()
    eng = tight(model, swap_policy=policy)
    preempted = []  # (request id, tokens generated by then, version)
    real = eng.kv.preempt
    eng.kv.preempt = lambda s: preempted.append((s.request_id, len(s.generated), eng.version)) or real(s)
    for p, sp in zip(prompts, params):
        eng.add_request(p, sp)
    done, step = {}, 0
    while eng.has_work():
        if step == 20:
            eng.update_weights(new, version=1)
        done.update((o.request_id, o) for o in eng.step())
        step += 1
    outs = [done[r] for r in range(len(LENS))]
    scores = {}
    for version, sd in ((0, old), (1, new)):
        model.load_state_dict(sd)
        with torch.no_grad():
            scores[version] = next_token_logprobs(model, [o.all_tokens for o in outs])
    checked_after_preemption = 0
    for i, o in enumerate(outs):
        assert o.admission_version == 0
        p = len(o.prompt_ids)
        clean_from = min((n for r, n, v in preempted if r == o.request_id and v == 1), default=None)
        for j, ver in enumerate(o.versions):
            clean = ver == 0 or policy == "recompute" or (clean_from is not None and j >= clean_from)
            if clean:
                assert torch.equal(scores[ver][i][p - 1 + j], o.logprob_tensor[j]), f"request {i} token {j}"
                checked_after_preemption += ver == 1 and clean_from is not None and j >= clean_from
    assert checked_after_preemption > 0


def test_a_request_that_can_never_fit_fails_at_once(micro_model):
    eng = Engine(micro_model(), max_slots=2, num_blocks=3, max_model_len=512)
    # 150 + 43 tokens: the last sampled token is never computed, 192 positions fill exactly 3 blocks
    rid = eng.add_request([1] * 150, SamplingParams(max_new_tokens=43, keep_cache=True))
    with pytest.raises(ValueError, match=r"needs 4 KV blocks .* num_blocks=3") as err:
        eng.add_request([1] * 150, SamplingParams(max_new_tokens=44))
    assert "\n" not in str(err.value)
    (o, _), = run_all(eng).values()
    assert len(o.all_tokens) == 193
    with pytest.raises(ValueError, match=f"request {rid} needs 4 KV blocks"):
        eng.continue_request(rid, [2], SamplingParams(max_new_tokens=1))
    assert rid in eng.parked  # still parked and releasable
    eng.release(rid)
    assert_no_leak(eng)
