"""The CUDA generator path: the Gumbel-max sampler's Triton kernel (equal to its torch form, the filtered
distribution by chi-square, a row's token independent of its batch), decode steps that read nothing back from
the device, and CUDA-graph decode whose bucket padding changes no real row's bits (bi, bi_chunk). Trainer /
generator parity with graphs and the device sampler on (the engine's CUDA defaults) is test_gpu_parity.py and
test_gpu_sweep.py. Skipped without CUDA."""

import gc

import pytest
import torch

import zeromismatch.generator.engine as engine_module
from zeromismatch.generator import Engine, SamplingParams
from zeromismatch.generator.sampling import filtered_probs, sample_on_device
from zeromismatch.models.qwen3_5 import build_model
from zeromismatch.ops.gumbel import gumbel_argmax, gumbel_argmax_reference, row_key
from zeromismatch.parity import random_prompts

pytestmark = pytest.mark.gpu
N = 20_000
CHI2_CRIT_1E6 = {1: 23.93, 2: 27.63, 3: 30.66, 4: 33.38, 5: 35.89, 6: 38.26, 7: 40.52, 8: 42.70}
LOGITS = torch.tensor([1.2, 2.0, -0.3, 0.9, 0.1, -1.5, 1.6, 0.4])


def chi2(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    sup = probs > 0
    expected = probs[sup].double() * counts.sum()
    return float(((counts[sup].double() - expected) ** 2 / expected).sum()), int(sup.sum()) - 1


def keys(seeds, positions):
    k = [row_key(s, p) for s, p in zip(seeds, positions)]
    return (torch.tensor([a for a, _ in k], device="cuda"), torch.tensor([b for _, b in k], device="cuda"))


def test_gumbel_kernel_equals_the_torch_form():
    """Same hash integers, same tempered logits (IEEE division) and thresholds: the tokens agree except where
    log's last-bit rounding decides a near-tie; greedy rows always."""
    g = torch.Generator(device="cuda").manual_seed(0)
    r, v = 512, 50_000  # not a multiple of the kernel's block
    logits = torch.randn(r, v, device="cuda", generator=g) * 3
    temp = torch.tensor([0.0, 0.5, 1.0, 1.7], device="cuda").repeat(r // 4)
    x = logits / torch.where(temp == 0, 1.0, temp)[:, None]
    thr = torch.where(torch.arange(r, device="cuda") % 8 < 4, float("-inf"), x.topk(100, dim=1).values[:, -1])
    thr = torch.where(temp == 0, float("-inf"), thr)
    k1, k2 = keys(range(r), [3 * i for i in range(r)])
    got = gumbel_argmax(logits, temp, thr, k1, k2)
    ref = gumbel_argmax_reference(logits, temp, thr, k1, k2)
    greedy = temp == 0
    assert torch.equal(got[greedy], logits[greedy].argmax(1))
    assert float((got == ref).float().mean()) > 0.99
    assert bool((x.gather(1, got[:, None]).squeeze(1) >= thr).all()), "a token below its row's threshold"


@pytest.mark.parametrize("kw", [dict(temperature=1.0), dict(temperature=0.5), dict(top_k=3), dict(top_p=0.6),
                                dict(temperature=0.7, top_k=5, top_p=0.8)], ids=str)
def test_device_sampler_follows_the_filtered_distribution(kw):
    """N draws of one row (successive positions) against filtered_probs, the CPU definition
    (tests/generator/test_sampling.py pins it to the float64 reference); negative control: the untempered,
    unfiltered softmax (temperature 1: the T = 1.5 one) must be rejected."""
    p = SamplingParams(**kw)
    tok, _ = sample_on_device(LOGITS.cuda().expand(N, -1), [p] * N, [7] * N, list(range(N)))
    counts = torch.bincount(tok.cpu(), minlength=len(LOGITS))
    probs = filtered_probs(LOGITS, p)
    assert int(counts[probs == 0].sum()) == 0
    stat, df = chi2(counts, probs)
    assert stat < CHI2_CRIT_1E6[df], (stat, counts, probs)
    wrong = torch.softmax(LOGITS / (1.5 if kw == dict(temperature=1.0) else 1.0), -1)
    assert chi2(counts, wrong)[0] > CHI2_CRIT_1E6[len(LOGITS) - 1] or int(counts[probs == 0].sum()) > 0


def test_device_sampler_rows_are_independent_of_the_batch():
    g = torch.Generator(device="cuda").manual_seed(1)
    r, v = 64, 32768
    logits = torch.randn(r, v, device="cuda", generator=g) * 2
    params = [SamplingParams(temperature=[0.0, 0.7, 1.0, 1.3][i % 4], top_k=[0, 40][i % 2], top_p=[1.0, 0.9, 0.5][i % 3])
              for i in range(r)]
    seeds, pos = [1000 + i for i in range(r)], [5 * i for i in range(r)]
    tok, lp = sample_on_device(logits, params, seeds, pos)
    for i in range(0, r, 7):
        t1, l1 = sample_on_device(logits[i : i + 1], [params[i]], [seeds[i]], [pos[i]])
        assert torch.equal(t1[0], tok[i]) and torch.equal(l1[0], lp[i]), i
    assert torch.equal(lp, torch.log_softmax(logits, -1).gather(1, tok[:, None]).squeeze(1))


def _model(preset, mode):
    return build_model(preset, mode, seed=1).to(device="cuda", dtype=torch.bfloat16).eval()


def _requests(vocab, n):
    prompts = random_prompts(n, vocab, seed=3, min_len=3, max_len=140)
    return prompts, [SamplingParams(max_new_tokens=20 + 3 * i, seed=i, temperature=0.9) for i in range(n)]


@pytest.mark.parametrize("mode", ["bi", "bi_chunk"])
def test_staged_steps_change_no_bits_on_the_device(mode):
    """Engine.stage_ahead on CUDA: the next step's inputs are queued behind the current step on the stream (ids
    copied on the device from samples the host has not read yet). Stop tokens end sequences after their next step
    was staged, requests wait for slots: the same tokens and logprob bits as without staging, and both the staged
    and the dropped-staging paths ran."""
    model = _model("tiny", mode)
    prompts, params = _requests(model.config.vocab_size, 7)
    stops = tuple(range(0, model.config.vocab_size, 13))
    params = [SamplingParams(max_new_tokens=p.max_new_tokens, seed=p.seed, temperature=p.temperature,
                             stop_token_ids=stops) for p in params]
    runs = {}
    for stage_ahead in (True, False):
        eng = Engine(model, max_slots=4, stage_ahead=stage_ahead)
        staged = []
        stage = eng.runner.stage_decode
        eng.runner.stage_decode = lambda seqs, ids: staged.append(stage(seqs, ids)) or staged[-1]
        runs[stage_ahead] = eng.generate(prompts, params), len(staged), eng.runner.stats["staged_steps"]
    (on, n_staged, n_replayed), (off, n_off, _) = runs[True], runs[False]
    assert n_off == 0 and 0 < n_replayed < n_staged, (n_replayed, n_staged)
    assert any(o.finish_reason == "stop" for o in on)
    for x, y in zip(on, off):
        assert x.tokens == y.tokens and torch.equal(x.logprob_tensor, y.logprob_tensor)


@pytest.mark.parametrize("mode", ["bi", "bi_chunk"])
def test_graph_bucket_padding_changes_no_bits(mode):
    """3 sequences replayed in the 4-row graph (one padding row), each alone in the 1-row graph, and the eager
    engine: the same tokens and logprob bits."""
    model = _model("tiny", mode)
    prompts, params = _requests(model.config.vocab_size, 3)
    graphs = Engine(model, max_slots=8)
    together = graphs.generate(prompts, params)
    assert graphs.cuda_graphs and graphs.runner.stats["graph_steps"] > 0
    assert any(bb == 4 for bb, _ in graphs.runner.graphs)
    eager = Engine(model, max_slots=8, cuda_graphs=False).generate(prompts, params)
    for i in range(3):
        alone = Engine(model, max_slots=8).generate([prompts[i]], [params[i]])[0]
        for other in (together[i], eager[i]):
            assert alone.tokens == other.tokens, (mode, i)
            assert torch.equal(alone.logprob_tensor, other.logprob_tensor), (mode, i)


def test_capture_holds_when_the_cycle_collector_would_free_an_old_graph():
    """An old engine reachable only through a reference cycle, and a new engine capturing while the collector would
    run (a forward pre-hook collects during capture whenever automatic collection is enabled, as the collector may
    at any allocation): freeing the old graphs mid-capture would invalidate the capture; the runner keeps the
    collector off while it captures, and the outputs equal the old engine's."""
    model = _model("tiny", "bi")
    prompts, params = _requests(model.config.vocab_size, 2)
    old = Engine(model, max_slots=4)
    ref = old.generate(prompts, params)
    cycle = [old]
    cycle.append(cycle)
    del old, cycle
    collected = []

    def collect_if_enabled(*_):
        if torch.cuda.is_current_stream_capturing() and gc.isenabled():
            collected.append(gc.collect())

    hook = model.register_forward_pre_hook(collect_if_enabled)
    try:
        new = Engine(model, max_slots=4)
        out = new.generate(prompts, params)
    finally:
        hook.remove()
    assert new.runner.stats["captures"] > 0 and not collected
    for a, b in zip(ref, out):
        assert a.tokens == b.tokens and torch.equal(a.logprob_tensor, b.logprob_tensor)


@pytest.mark.parametrize("mode", ["bi", "bi_chunk"])
def test_graphs_captured_up_front_capture_nothing_later(mode):
    """Engine.capture_graphs (what an RL run calls before its threads start) captures every (batch bucket,
    width) graph; generating afterwards captures none, with the same tokens and logprob bits as lazy capture."""
    model = _model("tiny", mode)
    prompts, params = _requests(model.config.vocab_size, 5)
    upfront = Engine(model, max_slots=8)
    upfront.capture_graphs()
    runner = upfront.runner
    assert set(runner.graphs) == {(bb, w) for bb in runner.batch_buckets for w in runner.width_buckets}
    captured = runner.stats["captures"]
    out = upfront.generate(prompts, params)
    assert runner.stats["captures"] == captured and runner.stats["graph_steps"] > 0
    lazy = Engine(model, max_slots=8).generate(prompts, params)
    for a, b in zip(out, lazy):
        assert a.tokens == b.tokens and torch.equal(a.logprob_tensor, b.logprob_tensor)


@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize("mode", ["stock", "bi", "bi_chunk"])
def test_decode_steps_read_nothing_back(mode, graphs, monkeypatch):
    """Once every sequence decodes, a step (forward, sampling, bookkeeping) synchronizes with the device only in
    its one transfer of the sampled tokens back (sync debug mode 'error' everywhere else)."""
    model = _model("tiny", mode)
    eng = Engine(model, max_slots=4, cuda_graphs=graphs)
    g = torch.Generator().manual_seed(4)
    for i, n in enumerate((10, 20, 30)):  # contexts stay inside one 64-token block: one graph serves every step
        eng.add_request(torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist(),
                        SamplingParams(max_new_tokens=30, seed=i))
    while not all(s.num_uncomputed == 1 for s in eng.running) or eng.waiting:
        eng.step()
    eng.step()  # the first decode step captures its graph (capture synchronizes)
    to_host = engine_module._to_host

    def allowed_transfer(tokens, logprobs):
        torch.cuda.set_sync_debug_mode(0)
        try:
            return to_host(tokens, logprobs)
        finally:
            torch.cuda.set_sync_debug_mode("error")

    monkeypatch.setattr(engine_module, "_to_host", allowed_transfer)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(8):
            assert eng.step() == []
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert eng.runner.stats["graph_steps" if graphs else "eager_steps"] > 0
