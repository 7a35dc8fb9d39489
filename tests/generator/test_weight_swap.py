"""Weight hot-swap mechanics (tests/parity covers trainer rescoring): 'recompute' rebuilds the caches under
the new weights (extra work = exactly the recomputed tokens; the continuation is what a fresh engine with the
new weights produces from the same context), 'keep' recomputes nothing and stays stale; per-token versions;
prefix entries of old weights never serve a later request; validation happens before anything changes."""

import pytest
import torch

from gen_helpers import prompts_of, run_all
from zeromismatch.generator import Engine, SamplingParams


def perturbed(model, seed=9, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}


def swap_midway(model, policy, new, n_before=3, prefix_caching=False, version=7):
    eng = Engine(model, max_slots=3, max_model_len=512, swap_policy=policy, prefix_caching=prefix_caching)
    prompts = prompts_of([20, 70, 130], seed=21)
    rids = [eng.add_request(p, SamplingParams(max_new_tokens=8, temperature=0)) for p in prompts]
    done = {}
    for _ in range(n_before):
        for o in eng.step():
            done[o.request_id] = o
    assert not done and len(eng.running) == 3
    pre = {s.request_id: list(s.generated) for s in eng.running}
    computed = {s.request_id: s.num_computed for s in eng.running}
    eng.update_weights(new, version=version)
    after = {s.request_id: s.num_computed for s in eng.running}
    done = {r: o for r, (o, _) in run_all(eng).items()}
    return eng, prompts, rids, done, pre, computed, after


@pytest.mark.parametrize("numerics", ["bi", "bi_chunk"])
def test_recompute_rebuilds_caches_under_the_new_weights(micro_model, numerics):
    model = micro_model(numerics, fresh=True)
    new = perturbed(model)
    eng, prompts, rids, done, pre, computed, after = swap_midway(model, "recompute", new)
    assert all(n == 0 for n in after.values())
    outs = [done[r] for r in rids]
    # every token computed once (except the last sampled), plus exactly what was computed before the swap
    assert eng.stats["tokens_computed"] == sum(len(o.all_tokens) - 1 for o in outs) + sum(computed.values())
    fresh = Engine(model, max_slots=1, max_model_len=512, prefix_caching=False)  # model now holds `new`
    for r, p, o in zip(rids, prompts, outs):
        k = len(pre[r])
        assert 0 < k < 8 and o.tokens[:k] == pre[r]
        assert o.versions == [0] * k + [7] * (8 - k) and o.admission_version == 0
        assert o.mixed_versions is False  # the rebuilt cache holds the new weights' entries only
        # greedy continuation == a fresh engine with the new weights given the same context, bit for bit
        ref = fresh.generate([p + pre[r]], SamplingParams(max_new_tokens=8 - k, temperature=0))[0]
        assert o.tokens[k:] == ref.tokens
        assert torch.equal(o.logprob_tensor[k:], ref.logprob_tensor)


def test_keep_recomputes_nothing_and_is_stale(micro_model):
    model = micro_model("bi", fresh=True)
    new = perturbed(model)
    eng, prompts, rids, done, pre, computed, after = swap_midway(model, "keep", new)
    assert after == computed
    outs = [done[r] for r in rids]
    assert eng.stats["tokens_computed"] == sum(len(o.all_tokens) - 1 for o in outs)
    fresh = Engine(model, max_slots=1, max_model_len=512, prefix_caching=False)
    stale = 0
    for r, p, o in zip(rids, prompts, outs):
        k = len(pre[r])
        assert o.versions == [0] * k + [7] * (8 - k)
        assert o.mixed_versions is True  # its post-swap tokens decoded on the cache of version 0
        ref = fresh.generate([p + pre[r]], SamplingParams(max_new_tokens=1, temperature=0))[0]
        assert ref.mixed_versions is False
        stale += not torch.equal(o.logprob_tensor[k : k + 1], ref.logprob_tensor)
    assert stale > 0, "kept caches of old weights must show up in the first post-swap logprobs"


def test_parked_sequence_and_swap_policies(micro_model):
    model = micro_model("bi", fresh=True)
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    prompt, tool = prompts_of([40, 20], seed=22)
    extra = {}
    for policy in ("keep", "recompute"):
        eng = Engine(model, max_slots=2, max_model_len=512, swap_policy=policy)
        rid = eng.add_request(prompt, SamplingParams(max_new_tokens=3, seed=0, keep_cache=True))
        run_all(eng)
        eng.update_weights(sd)
        assert eng.version == 1
        before = eng.stats["tokens_computed"]
        eng.continue_request(rid, tool, SamplingParams(max_new_tokens=2, seed=1))
        (o, _), = run_all(eng).values()
        assert o.versions == [0, 0, 0, 1, 1] and o.admission_version == 1
        extra[policy] = eng.stats["tokens_computed"] - before
    assert extra["keep"] == 1 + len(tool) + 1  # last turn-1 token, the tool tokens, one decode
    assert extra["recompute"] == len(prompt) + 3 + len(tool) + 1  # the whole conversation again


def test_keep_swap_never_serves_mixed_version_prefix_entries(micro_model):
    """Regression: under 'keep' a sequence mid-prefill at the swap finishes its prefill on the new weights over
    an old-weight cache; it must not publish that mixed state, or a request admitted after the swap (recorded
    as version 1 throughout) would resume from it."""
    model = micro_model("bi", fresh=True)
    new = perturbed(model, seed=3)
    prompt = prompts_of([300], seed=23)[0]
    eng = Engine(model, max_slots=2, max_batched_tokens=128, max_model_len=512, swap_policy="keep")
    eng.add_request(prompt, SamplingParams(max_new_tokens=4, seed=0))
    eng.step()  # first piece: 128 tokens under version 0
    eng.update_weights(new, version=1)
    assert not eng.prefix.entries, "old-weight entries are dropped at the swap"
    late = eng.add_request(prompt, SamplingParams(max_new_tokens=4, seed=1))
    done = {r: o for r, (o, _) in run_all(eng).items()}
    assert done[late].versions == [1] * 4 and done[late].admission_version == 1
    ref = Engine(model, max_slots=1, max_model_len=512, prefix_caching=False).generate([prompt], SamplingParams(max_new_tokens=4, seed=1))[0]
    assert done[late].tokens == ref.tokens and torch.equal(done[late].logprob_tensor, ref.logprob_tensor)


def test_prefix_entries_are_dropped_on_swap(micro_model):
    model = micro_model("bi", fresh=True)
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    eng = Engine(model, max_slots=2, max_model_len=512)
    p = prompts_of([150], seed=24)[0]
    eng.generate([p], SamplingParams(max_new_tokens=2))
    n_entries, free = len(eng.prefix.entries), eng.alloc.num_free()
    assert n_entries > 0
    eng.update_weights(sd)
    assert not eng.prefix.entries and eng.alloc.num_free() == free + n_entries
    eng.generate([p], SamplingParams(max_new_tokens=2))
    assert eng.stats["prefix_hit_tokens"] == 0


def test_update_weights_validates_before_changing_anything(micro_model):
    model = micro_model("bi", fresh=True)
    eng = Engine(model, max_slots=1, max_model_len=128)
    orig = {k: v.clone() for k, v in model.state_dict().items()}
    new = perturbed(model)
    name = sorted(new)[3]
    with pytest.raises(KeyError, match=name.replace(".", r"\.")):
        eng.update_weights({k: v for k, v in new.items() if k != name})
    bad = dict(new)
    bad[name] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match="shape"):
        eng.update_weights(bad)
    with pytest.raises(ValueError, match="policy"):
        eng.update_weights(new, policy="sometimes")
    assert eng.version == 0
    assert all(torch.equal(v, orig[k]) for k, v in model.state_dict().items()), "a rejected swap changed weights"
    eng.update_weights(new)
    eng.update_weights(new, version=5)
    eng.update_weights(new)
    assert eng.version == 6
    assert all(torch.equal(v, new[k]) for k, v in model.state_dict().items())
