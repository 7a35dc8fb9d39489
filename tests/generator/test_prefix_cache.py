"""Prefix caching: a hit really skips the shared prefill, changes no token and no logprob bit (bi, bi_chunk),
survives eviction under block pressure, and every KV block returns to the free list at the end."""

import pytest
import torch

from gen_helpers import assert_no_leak, assert_same_outputs, prompts_of, run_all
from zeromismatch.generator import Engine, SamplingParams
from zeromismatch.generator.cache import SNAPSHOT_KEYS, BatchCacheView, CacheStorage
from zeromismatch.parity import generate
from zeromismatch.trainer.scoring import next_token_logprobs


def shared_prompts(shared_len=150, suffixes=(3, 20, 41, 0, 77), seed=0):
    shared, *rest = prompts_of([shared_len, *suffixes], seed=seed)
    return [shared + r for r in rest]


@pytest.mark.parametrize("numerics", ["bi", "bi_chunk"])
def test_hits_skip_work_and_change_nothing(micro_model, numerics):
    model = micro_model(numerics)
    prompts = shared_prompts()
    params = [SamplingParams(max_new_tokens=5, seed=i) for i in range(len(prompts))]
    warm, weng = generate(model, prompts, params, max_slots=8)
    cold, ceng = generate(model, prompts, params, max_slots=8, prefix_caching=False)
    assert_same_outputs(warm, cold)
    # the first request computes the shared prompt up to its last boundary (128, the 150 shared tokens are
    # inside block 2) while the others wait a step; each of the 4 others then skips 2 blocks
    assert weng.stats["prefix_hit_tokens"] == 128 * (len(prompts) - 1)
    assert ceng.stats["prefix_hit_tokens"] == 0
    assert ceng.stats["tokens_computed"] - weng.stats["tokens_computed"] == weng.stats["prefix_hit_tokens"]
    assert ceng.stats["tokens_computed"] == sum(len(o.all_tokens) - 1 for o in cold)
    assert_no_leak(weng)


def test_entries_outlive_their_request_and_short_prompts_skip_lookup(micro_model):
    model = micro_model()
    eng = Engine(model, max_slots=2, max_model_len=512)
    a, b, c = shared_prompts(shared_len=200, suffixes=(10, 30, 50), seed=1)
    eng.add_request(a, SamplingParams(max_new_tokens=3, seed=0))
    run_all(eng)
    assert not eng.has_work() and eng.prefix.entries
    before = eng.stats["tokens_computed"]
    eng.add_request(b, SamplingParams(max_new_tokens=3, seed=1))
    (o, _), = run_all(eng).values()
    # a's prefill stopped at its last boundary 192: b (same first 200 tokens) resumes there
    assert eng.stats["prefix_hit_tokens"] == 192
    assert eng.stats["tokens_computed"] - before == len(b) - 192 + 2
    ref = Engine(model, max_slots=1, max_model_len=512, prefix_caching=False).generate([b], SamplingParams(max_new_tokens=3, seed=1))
    assert_same_outputs([o], ref)
    hits = eng.stats["prefix_hit_tokens"]
    eng.generate([a[:64]], SamplingParams(max_new_tokens=2))  # 64 tokens: nothing to reuse (1 token must be computed)
    assert eng.stats["prefix_hit_tokens"] == hits
    assert_no_leak(eng)


@pytest.mark.parametrize("numerics", ["bi", "bi_chunk"])
def test_eviction_under_block_pressure_keeps_results_exact(micro_model, numerics):
    model = micro_model(numerics)
    # 4 groups of 3 samples; the members of a group share 140 tokens; groups share nothing
    prompts = []
    for g in range(4):
        prompts += shared_prompts(140, suffixes=(5, 30, 52), seed=100 + g)
    order = [0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11]  # interleaved: entries of a group age while others run
    params = [SamplingParams(max_new_tokens=4, seed=i) for i in range(12)]
    # 2 slots x 4 blocks (<= 196 tokens) = 8 blocks of live sequences; 9 blocks leave the prefix cache ~1
    eng = Engine(model, max_slots=2, num_blocks=9, max_model_len=256)
    outs, _ = generate(model, prompts, params, order=order, engine=eng)
    ample, _ = generate(model, prompts, params, max_slots=12, prefix_caching=False)
    assert_same_outputs(outs, ample)
    assert eng.prefix.evictions > 0 and eng.stats["prefix_hit_tokens"] > 0
    assert len(eng.prefix.entries) <= eng.prefix.max_entries
    assert_no_leak(eng)


def test_refcounts_return_to_free_with_parked_and_released_requests(micro_model):
    model = micro_model()
    eng = Engine(model, max_slots=4, max_model_len=512)
    prompts = shared_prompts(130, suffixes=(4, 9, 70), seed=2)
    rids = [eng.add_request(p, SamplingParams(max_new_tokens=3, seed=i, keep_cache=i < 2)) for i, p in enumerate(prompts)]
    run_all(eng)
    assert eng.stats["prefix_hit_tokens"] > 0 and set(eng.parked) == set(rids[:2])
    eng.continue_request(rids[0], prompts_of([90], seed=3)[0], SamplingParams(max_new_tokens=2, keep_cache=True))
    run_all(eng)
    held = eng.num_blocks - eng.alloc.num_free()
    assert held > 0
    for r in rids[:2]:
        eng.release(r)
    assert_no_leak(eng)


def test_hit_on_a_sequence_reset_by_a_recompute_swap_does_not_leak(micro_model):
    """Regression: a parked sequence reset by a 'recompute' swap keeps its block table; when it continues and
    its (now longer) tokens hit the prefix cache, the blocks it held must be released, not dropped."""
    model = micro_model(fresh=True)
    same = {k: v.clone() for k, v in model.state_dict().items()}
    eng = Engine(model, max_slots=3, max_model_len=512, swap_policy="recompute")
    prompt, tool = prompts_of([30, 110], seed=4)
    rid = eng.add_request(prompt, SamplingParams(max_new_tokens=2, seed=0, keep_cache=True))
    (t1, _), = run_all(eng).values()
    eng.update_weights(same, version=1)
    assert eng.parked[rid].num_computed == 0 and eng.parked[rid].block_table  # reset, blocks still held
    eng.generate([t1.all_tokens + tool + [1, 2, 3]], SamplingParams(max_new_tokens=2, seed=1))
    eng.continue_request(rid, tool, SamplingParams(max_new_tokens=2, seed=2))
    (t2, _), = run_all(eng).values()
    assert eng.stats["prefix_hit_tokens"] == 128  # the continuation resumed from the other request's blocks
    # and the hit changed nothing in the logprobs the trainer will see
    with torch.no_grad():
        (lp,) = next_token_logprobs(model, [t2.all_tokens])
    n = len(t2.all_tokens)
    assert torch.equal(lp[n - 3 : n - 1], t2.logprob_tensor)
    assert_no_leak(eng)


def test_snapshots_hold_only_what_a_boundary_reads(micro_model):
    """A prefix snapshot is taken at a 64-token boundary, where bi_chunk's open chunk is empty: it holds the
    conv and fp32 ssm state only (not the open-chunk rows, which on the GPU are 100s of KB per slot and head).
    The storage allocates, up front, exactly the state the mode's GDN backend declares: conv + ssm for stock
    and bi, plus the open chunk for bi_chunk (on CUDA its rows, fp32, outside snapshots)."""
    model = micro_model("bi_chunk")
    gdn = model.numerics.gdn
    for mode in ("stock", "bi"):
        other = CacheStorage(model.config, micro_model(mode).numerics.gdn, max_slots=3, num_blocks=4)
        assert all(set(st) == {"conv", "ssm"} for st in other.gdn.values())
    cpu = CacheStorage(model.config, gdn, max_slots=3, num_blocks=4)
    assert all(set(st) == {"conv", "ssm", "buf_qkv", "buf_g", "buf_beta"} for st in cpu.gdn.values())

    class CudaLayout:  # bi_chunk's CUDA state layout, allocated on CPU tensors
        def cache_spec(self, heads, device, dtype):
            return gdn.cache_spec(heads, "cuda", dtype)

    st = CacheStorage(model.config, CudaLayout(), max_slots=3, num_blocks=4)
    layer = next(iter(st.gdn))
    view = BatchCacheView(st, [2, 0], [[0], [1]])
    tensors, slots = view.gdn_slots(layer)
    assert slots.tolist() == [2, 0] and tensors is st.gdn[layer]
    assert set(tensors) == {"conv", "ssm", "ck", "cv", "cg", "cb", "ct", "cu"}
    hv, dk, dv = st.gdn[layer]["ssm"].shape[1:]
    shapes = {n: tuple(tensors[n].shape) for n in ("ck", "cv", "cg", "cb", "ct", "cu")}
    assert shapes == {"ck": (3, hv, 64, dk), "cv": (3, hv, 64, dv), "cg": (3, hv, 64), "cb": (3, hv, 64),
                      "ct": (3, hv, 64, 64), "cu": (3, hv, 64, dv)}
    assert all(tensors[n].dtype == torch.float32 for n in shapes)
    tensors["ssm"][1].fill_(0.5)
    tensors["ck"][1].fill_(0.25)
    snap = st.snapshot(1)
    assert set(snap[layer]) == set(SNAPSHOT_KEYS) == {"conv", "ssm"}
    st.reset_slot(1)
    assert float(tensors["ck"][1].abs().sum()) == 0.0
    st.restore(1, snap)
    assert bool((tensors["ssm"][1] == 0.5).all())
