"""The device sampler's scheme (sampling.sample_on_device, ops/gumbel.py) on CPU tensors, where it runs the torch
form of the same hash and Gumbel-max: it draws from the same filtered distribution as `sample` (Pearson
chi-square, the thresholds and negative controls of test_sampling.py), a row's token is a function of (seed,
position, logits) alone, and the engine produces the same outputs with it whatever the batch. The Triton form
is checked against this one and for the same properties on the GPU (tests/gpu/test_gpu_generator.py)."""

import gc
import weakref

import pytest
import torch
from gen_helpers import prompts_of
from test_sampling import CASES, LOGITS, N, assert_matches, reference

from zeromismatch.generator import Engine
from zeromismatch.generator.cache import BLOCK_SIZE
from zeromismatch.generator.sampling import SamplingParams, sample_on_device
from zeromismatch.ops.gdn.constants import CHUNK
from zeromismatch.ops.gdn.naive import chunk_final_states, chunk_fwd, pad_time, prepare_qk, to_chunks
from zeromismatch.ops.gumbel import hash_bits, row_key


def draws(kw, n=N, seed=5):
    """n draws for one logits row: successive positions of one request."""
    tok, _ = sample_on_device(LOGITS.expand(n, -1), [SamplingParams(**kw)] * n, [seed] * n, list(range(n)))
    return torch.bincount(tok, minlength=len(LOGITS))


@pytest.mark.parametrize("kw", CASES, ids=[str(c) for c in CASES])
def test_device_scheme_follows_the_filtered_distribution(kw):
    wrong = reference(LOGITS, temperature=1.5) if kw == dict(temperature=1.0) else reference(LOGITS)
    assert_matches(draws(kw), reference(LOGITS, **kw), wrong=wrong)


def test_hash_words_are_uniform_and_keyed():
    k = [row_key(s, p) for s, p in [(0, 0), (0, 1), (1, 0)]]
    assert len(set(k)) == 3
    k1, k2 = torch.tensor([a for a, _ in k]), torch.tensor([b for _, b in k])
    h = hash_bits(k1, k2, 1 << 16)
    assert int(h.min()) >= 0 and int(h.max()) < 1 << 32
    assert not torch.equal(h[0], h[1]) and not torch.equal(h[0], h[2])
    u = (h >> 9).double() / 2**23
    assert abs(float(u.mean()) - 0.5) < 0.01 and abs(float(u.var()) - 1 / 12) < 0.005
    bits = torch.stack([(h >> i) & 1 for i in range(32)]).double().mean(dim=(1, 2))
    assert float((bits - 0.5).abs().max()) < 0.01


def test_a_rows_token_depends_only_on_seed_position_and_logits():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(11))
    params = [SamplingParams(temperature=0.8 + 0.1 * i, top_k=10 * (i % 2), top_p=1.0 - 0.1 * (i % 3)) for i in range(6)]
    seeds, pos = [100 + i for i in range(6)], [7 * i for i in range(6)]
    full, lp = sample_on_device(logits, params, seeds, pos)
    for i in range(6):
        alone, lp1 = sample_on_device(logits[i : i + 1], [params[i]], [seeds[i]], [pos[i]])
        assert int(alone) == int(full[i]) and torch.equal(lp1[0], lp[i])
    assert torch.equal(lp, torch.log_softmax(logits, -1).gather(-1, full[:, None]).squeeze(-1))
    other = [sample_on_device(logits[:1], [params[0]], [s], [0])[0].item() for s in range(40)]
    assert len(set(other)) > 5, "different seeds must give different draws"


def test_temperature_zero_is_argmax():
    logits = torch.randn(50, 300, generator=torch.Generator().manual_seed(8))
    tok, _ = sample_on_device(logits, [SamplingParams(temperature=0.0, top_k=5, top_p=0.3)] * 50, list(range(50)), [0] * 50)
    assert torch.equal(tok, logits.argmax(-1))


def test_engine_with_the_device_sampler_is_batch_invariant(micro_model):
    """bi on CPU: the same requests alone and together give the same tokens and logprob bits."""
    model = micro_model("bi")
    prompts = prompts_of([5, 70, 33, 9])
    params = [SamplingParams(max_new_tokens=12, seed=i, temperature=0.9, top_p=0.95) for i in range(4)]
    together = Engine(model, max_slots=4, device_sampling=True).generate(prompts, params)
    for i in range(4):
        alone = Engine(model, max_slots=1, device_sampling=True).generate([prompts[i]], [params[i]])[0]
        assert alone.tokens == together[i].tokens
        assert torch.equal(alone.logprob_tensor, together[i].logprob_tensor)


@pytest.mark.parametrize("mode", ["bi", "bi_chunk"])
def test_bucketed_decode_padding_changes_no_bits(micro_model, mode):
    """The CUDA-graph runner's path (static buffers, a batch padded up to its bucket with rows on the spare slot
    and block, every block-table width bucketed), run without capture on the CPU: the same tokens and logprob
    bits as the eager engine, for 3 sequences in the 4-row bucket and each alone."""
    model = micro_model(mode)
    prompts = prompts_of([5, 70, 33])
    params = [SamplingParams(max_new_tokens=14 + 3 * i, seed=i) for i in range(3)]
    bucketed = Engine(model, max_slots=8, cuda_graphs=True)
    together = bucketed.generate(prompts, params)
    assert bucketed.runner.stats["graph_steps"] > 0 and any(bb == 4 for bb, _ in bucketed.runner.graphs)
    eager = Engine(model, max_slots=8).generate(prompts, params)
    for i in range(3):
        alone = Engine(model, max_slots=8, cuda_graphs=True).generate([prompts[i]], [params[i]])[0]
        for other in (together[i], eager[i]):
            assert alone.tokens == other.tokens, i
            assert torch.equal(alone.logprob_tensor, other.logprob_tensor), i


def test_capture_all_builds_every_bucket_and_width(micro_model):
    """ModelRunner.capture_all (run before an RL run's threads start; without capture on the CPU): one graph per
    (batch bucket, block-table width), the engine's slot count the last bucket, none built twice."""
    engine = Engine(micro_model("bi"), max_slots=6, max_model_len=100, cuda_graphs=True)
    runner = engine.runner
    assert runner.batch_buckets == (1, 2, 4, 6)
    assert runner.capture_all() == len(runner.batch_buckets) * len(runner.width_buckets)
    assert set(runner.graphs) == {(bb, w) for bb in runner.batch_buckets for w in runner.width_buckets}
    assert runner.capture_all() == 0


def test_batched_chunk_final_states_equals_the_per_row_form():
    """chunk_final_states runs one batched chunked call over every row's last chunk; on CPU its bits equal the
    per-row form it replaced (each row's partial chunk sliced, zero-padded and run alone)."""
    g = torch.Generator().manual_seed(0)
    lens = torch.tensor([5, 64, 130, 77, 1, 128])
    b, h, dk, dv, t = len(lens), 4, 32, 16, int(lens.max())
    live = (torch.arange(t)[None] < lens[:, None]).float()
    q, k = prepare_qk(torch.randn(b, t, 2, dk, generator=g) * live[..., None, None],
                      torch.randn(b, t, 2, dk, generator=g) * live[..., None, None], h)
    v = torch.randn(b, h, t, dv, generator=g) * live[:, None, :, None]
    gg, bb = -torch.rand(b, h, t, generator=g) * live[:, None], torch.rand(b, h, t, generator=g) * live[:, None]
    padded = to_chunks(q, k, v, gg, bb)
    _, states = chunk_fwd(*padded, torch.randn(b, h, dk, dv, generator=g))
    got = chunk_final_states(*padded, states, lens)
    for i, n in enumerate(lens.tolist()):
        c, r = divmod(n, CHUNK)
        want = states[i : i + 1, :, c]
        if r:
            sl = slice(c * CHUNK, c * CHUNK + r)
            want = chunk_fwd(*(pad_time(x[i : i + 1, :, sl], CHUNK) for x in padded), want)[1][:, :, 1]
        assert torch.equal(got[i : i + 1], want), i


def test_a_one_token_piece_that_samples_nothing_runs_eagerly(micro_model):
    """A tool turn appended to a context that ended one token short of a block boundary leaves a one-token
    prefill piece up to that boundary, which samples nothing. Beside decode rows it makes a step of one-token
    pieces whose non-sampling one must not replay as a decode row (a graph returns a logit row for every row,
    and the sampler would read one row more than it has keys for): it runs eagerly beside the decode rows'
    graph, and the outputs have the eager engine's bits."""
    model = micro_model("bi")
    a_prompt, b_prompt = prompts_of([BLOCK_SIZE - 1, 5])
    tool = prompts_of([30], seed=3)[0]

    def run(cuda_graphs):
        eng = Engine(model, max_slots=4, cuda_graphs=cuda_graphs)
        a = eng.add_request(a_prompt, SamplingParams(max_new_tokens=1, seed=0, keep_cache=True))
        b = eng.add_request(b_prompt, SamplingParams(max_new_tokens=12, seed=1))
        outs = {}
        while a not in eng.parked:
            outs.update({o.request_id: o for o in eng.step()})
        a_seq = eng.parked[a]
        assert (a_seq.num_computed, len(a_seq.tokens)) == (BLOCK_SIZE - 1, BLOCK_SIZE)
        eng.continue_request(a, tool, SamplingParams(max_new_tokens=6, seed=0))
        eager_before = eng.runner.stats["eager_steps"]
        outs.update({o.request_id: o for o in eng.step()})  # b's decode row + a's piece up to the boundary
        assert a_seq.num_computed == BLOCK_SIZE
        if cuda_graphs:
            assert eng.runner.stats["eager_steps"] == eager_before + 1
        while eng.has_work():
            outs.update({o.request_id: o for o in eng.step()})
        return [outs[a], outs[b]]

    graphs, eager = run(True), run(False)
    for x, y in zip(graphs, eager):
        assert x.tokens == y.tokens and torch.equal(x.logprob_tensor, y.logprob_tensor)


@pytest.mark.parametrize("mode", ["bi", "bi_chunk"])
def test_mixed_steps_replay_decode_rows_beside_eager_pieces(micro_model, mode):
    """With graphs on, a step with prefill pieces replays its decode rows' graph and runs only the pieces eagerly
    (ModelRunner.execute); requests arriving while others decode make such steps. Same tokens and logprob bits
    as the eager engine, and as each request alone."""
    model = micro_model(mode)
    prompts = prompts_of([70, 5, 130, 33, 9, 64])
    params = [SamplingParams(max_new_tokens=10 + 2 * i, seed=i) for i in range(len(prompts))]

    def run(cuda_graphs):
        eng = Engine(model, max_slots=8, max_batched_tokens=80, cuda_graphs=cuda_graphs)
        outs, ids = {}, []
        for p, sp in zip(prompts, params):  # one new request per step: its prefill rides beside the decode rows
            ids.append(eng.add_request(p, sp))
            outs.update({o.request_id: o for o in eng.step()})
        while eng.has_work():
            outs.update({o.request_id: o for o in eng.step()})
        return [outs[i] for i in ids], eng.runner.stats

    graphs, stats = run(True)
    assert stats["mixed_steps"] > 0 and stats["graph_steps"] > stats["mixed_steps"]
    eager, _ = run(False)
    for i, (x, y) in enumerate(zip(graphs, eager)):
        alone = Engine(model, max_slots=8).generate([prompts[i]], [params[i]])[0]
        for other in (x, y):
            assert other.tokens == alone.tokens, i
            assert torch.equal(other.logprob_tensor, alone.logprob_tensor), i


def test_a_dropped_engine_frees_its_graphs_without_the_cycle_collector(micro_model):
    """An engine's captured graphs hold no reference back to it, so dropping the engine frees them at once (GPU
    memory back, and no CUDA graph left for Python's cycle collector to destroy at an arbitrary moment, such as
    during another engine's capture; tests/gpu checks the capture survives that too)."""
    engine = Engine(micro_model("bi"), max_slots=4, cuda_graphs=True)
    engine.generate(prompts_of([5, 9]), [SamplingParams(max_new_tokens=3, seed=i) for i in range(2)])
    assert engine.runner.graphs
    graph = weakref.ref(next(iter(engine.runner.graphs.values())))
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        del engine
        assert graph() is None, gc.get_referrers(graph())
    finally:
        if was_enabled:
            gc.enable()


@pytest.mark.parametrize("mode,device_sampling", [("bi", True), ("bi_chunk", True), ("bi", False)])
def test_staged_steps_change_no_bits(micro_model, mode, device_sampling):
    """Engine.stage_ahead queues each steady decode step's inputs on the device a step ahead. With stop tokens
    ending sequences at steps the host learns only afterwards, requests waiting for slots, shared prompts (prefix
    hits), a weight swap and a multi-turn continuation, every token and logprob bit equals the engine's without
    staging; the staged path ran, and staged steps were also dropped (a sample ended a sequence)."""
    model = micro_model(mode, fresh=True)
    base = prompts_of([70, 5, 130, 33, 9, 64, 80], seed=7)
    prompts = base + [base[2][:BLOCK_SIZE + 3] + [1, 2]]  # shares a block with prompt 2: a prefix hit
    stops = tuple(range(0, 256, 11))  # ~9% of the vocabulary: sequences end at unforeseen steps
    params = [SamplingParams(max_new_tokens=12 + 3 * i, seed=i, stop_token_ids=stops, keep_cache=i == 1)
              for i in range(len(prompts))]
    swapped = {k: v + 1e-3 for k, v in model.state_dict().items()}

    def run(stage_ahead):
        eng = Engine(model, max_slots=3, cuda_graphs=True, device_sampling=device_sampling, stage_ahead=stage_ahead)
        staged = []
        stage = eng.runner.stage_decode
        eng.runner.stage_decode = lambda seqs, ids: staged.append(stage(seqs, ids)) or staged[-1]
        ids = [eng.add_request(p, sp) for p, sp in zip(prompts, params)]
        outs, step, continued = {}, 0, False
        while eng.has_work() or not continued:
            if step == 25:
                eng.update_weights(swapped, policy="keep")
            if ids[1] in eng.parked and not continued:
                eng.continue_request(ids[1], [3, 4, 5], SamplingParams(max_new_tokens=10, seed=99, stop_token_ids=stops))
                continued = True
            for o in eng.step():
                outs[(o.request_id, len(o.tokens))] = o
            step += 1
        return outs, len(staged), eng.runner.stats["staged_steps"]

    original = {k: v.clone() for k, v in model.state_dict().items()}
    with_staging, n_staged, n_replayed = run(True)
    model.load_state_dict(original)
    without, n_off, _ = run(False)
    assert n_off == 0 and 0 < n_replayed < n_staged, (n_replayed, n_staged)
    assert with_staging.keys() == without.keys()
    for key, x in with_staging.items():
        y = without[key]
        assert x.tokens == y.tokens and x.versions == y.versions and x.finish_reason == y.finish_reason, key
        assert torch.equal(x.logprob_tensor, y.logprob_tensor), key
