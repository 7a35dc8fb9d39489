"""sampling.filtered_probs / sample against the distributions they claim to draw from.

Reference distributions are recomputed here in float64 from the definitions (temperature, then top-k on the
tempered logits, softmax, then top-p over the sorted renormalised probabilities keeping the token that crosses
p). Statistical checks draw N = 20000 samples with a fixed seed and use Pearson's chi-square over the support,
compared with the chi-square quantile at alpha = 1e-6 (the seed is fixed, so the test is deterministic; the
alpha says that a correct sampler fails it for at most one seed in a million). Each statistical test also
runs a negative control: the same draws against a wrong but plausible distribution (untempered /
unfiltered) must exceed the threshold, so the test has the power to catch the bug it is about. Tokens
outside the support must have count exactly 0.
"""

import math

import pytest
import torch

from zeromismatch.generator.sampling import SamplingParams, filtered_probs, sample

N = 20_000
# scipy.stats.chi2.isf(1e-6, df) for df = 1..8
CHI2_CRIT_1E6 = {1: 23.93, 2: 27.63, 3: 30.66, 4: 33.38, 5: 35.89, 6: 38.26, 7: 40.52, 8: 42.70}

LOGITS = torch.tensor([1.2, 2.0, -0.3, 0.9, 0.1, -1.5, 1.6, 0.4])  # distinct values: no top-k ties


def reference(logits, temperature=1.0, top_k=0, top_p=1.0) -> torch.Tensor:
    x = logits.double() / temperature
    if top_k:
        keep = torch.zeros_like(x, dtype=torch.bool)
        keep[torch.argsort(x, descending=True)[:top_k]] = True
        x = torch.where(keep, x, torch.tensor(-math.inf, dtype=x.dtype))
    p = torch.softmax(x, -1)
    if top_p < 1.0:
        order = torch.argsort(p, descending=True)
        mass, keep = 0.0, torch.zeros_like(p, dtype=torch.bool)
        for i in order.tolist():
            if mass >= top_p:
                break
            keep[i] = True
            mass += float(p[i])
        p = torch.where(keep, p, 0.0)
        p = p / p.sum()
    return p


def chi2_stat(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson chi-square over the support of probs; (statistic, degrees of freedom)."""
    sup = probs > 0
    expected = probs[sup] * counts.sum()
    stat = float(((counts[sup].double() - expected) ** 2 / expected).sum())
    return stat, int(sup.sum()) - 1


def assert_matches(counts, probs, wrong=None):
    sup = probs > 0
    assert int(counts[~sup].sum()) == 0, f"sampled outside the support: {counts[~sup]}"
    stat, df = chi2_stat(counts, probs)
    assert stat < CHI2_CRIT_1E6[df], f"chi2={stat:.1f} >= {CHI2_CRIT_1E6[df]} (df={df}): counts {counts} vs probs {probs}"
    if wrong is not None:  # negative control: the test would see this bug
        s_sup = wrong > 0
        wrong_stat = float(((counts[s_sup].double() - wrong[s_sup] * counts.sum()) ** 2 / (wrong[s_sup] * counts.sum())).sum())
        assert wrong_stat > CHI2_CRIT_1E6[int(s_sup.sum()) - 1] or int(counts[~s_sup].sum()) > 0


CASES = [
    dict(temperature=1.0),
    dict(temperature=0.5),
    dict(temperature=2.0),
    dict(top_k=3),
    dict(top_p=0.6),
    dict(temperature=0.7, top_k=5, top_p=0.8),
]


@pytest.mark.parametrize("kw", CASES, ids=[str(c) for c in CASES])
def test_filtered_probs_equals_the_definition(kw):
    got = filtered_probs(LOGITS, SamplingParams(**kw))
    assert got.dtype == torch.float32
    ref = reference(LOGITS, **kw)
    assert torch.equal(got > 0, ref > 0), "support differs"
    torch.testing.assert_close(got.double(), ref, atol=1e-6, rtol=1e-5)
    assert abs(float(got.sum()) - 1.0) < 1e-5


@pytest.mark.parametrize("kw", CASES[:-1], ids=[str(c) for c in CASES[:-1]])
def test_draws_from_filtered_probs_follow_the_distribution(kw):
    """The cheap vectorised version (N draws from filtered_probs); `sample` itself is pinned to exactly this
    draw by test_sample_is_multinomial_over_filtered_probs and checked end to end below."""
    probs = filtered_probs(LOGITS, SamplingParams(**kw))
    g = torch.Generator().manual_seed(1)
    counts = torch.bincount(torch.multinomial(probs, N, replacement=True, generator=g), minlength=len(LOGITS))
    # negative control: the unfiltered, untempered distribution (for the plain T=1 case: the T=1.5 one)
    wrong = reference(LOGITS, temperature=1.5) if kw == dict(temperature=1.0) else reference(LOGITS)
    assert_matches(counts, reference(LOGITS, **kw), wrong=wrong)


def test_sample_end_to_end_distribution():
    """10000 draws through `sample` itself (one generator shared by the rows, so rows are successive draws),
    with temperature, top-k and top-p all active (half of N: `sample` loops in Python, ~0.15 ms a row)."""
    kw = dict(temperature=0.7, top_k=5, top_p=0.8)
    g = torch.Generator().manual_seed(2)
    tok, lp = sample(LOGITS.expand(N // 2, -1), [SamplingParams(**kw)] * (N // 2), [g] * (N // 2))
    counts = torch.bincount(tok, minlength=len(LOGITS))
    ref = reference(LOGITS, **kw)
    assert_matches(counts, ref, wrong=reference(LOGITS, temperature=0.7, top_k=5))  # wrong = top-p ignored
    assert_matches(counts, ref, wrong=reference(LOGITS, top_k=5, top_p=0.8))  # wrong = temperature ignored
    # the logprob of each draw is the raw log_softmax of its logits row, whatever was sampled
    raw = torch.log_softmax(LOGITS.float(), -1)
    assert lp.dtype == torch.float32 and torch.equal(lp, raw[tok])


def test_sample_is_multinomial_over_filtered_probs():
    p = SamplingParams(temperature=0.9, top_k=6, top_p=0.9)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    logits = torch.randn(200, 8, generator=torch.Generator().manual_seed(4))
    tok, _ = sample(logits, [p] * 200, [g1] * 200)
    expect = [int(torch.multinomial(filtered_probs(r, p), 1, generator=g2)) for r in logits]
    assert tok.tolist() == expect


def test_top_k_never_samples_outside_the_top_k():
    logits = torch.randn(64, generator=torch.Generator().manual_seed(5))
    for k in (1, 2, 7):
        probs = filtered_probs(logits, SamplingParams(top_k=k))
        top = set(torch.topk(logits, k).indices.tolist())
        assert set(torch.nonzero(probs).flatten().tolist()) == top
        draws = torch.multinomial(probs, N, replacement=True, generator=torch.Generator().manual_seed(k))
        assert set(draws.unique().tolist()) <= top
    # through `sample`, a few hundred draws with a temperature that flattens the distribution
    g = torch.Generator().manual_seed(6)
    tok, _ = sample(logits.expand(300, -1), [SamplingParams(top_k=3, temperature=5.0)] * 300, [g] * 300)
    assert set(tok.tolist()) == set(torch.topk(logits, 3).indices.tolist())
    # top_k >= vocab is a no-op
    torch.testing.assert_close(filtered_probs(logits, SamplingParams(top_k=64)), torch.softmax(logits, -1))


def test_top_p_keeps_exactly_the_nucleus_with_the_crossing_token():
    probs = torch.tensor([0.05, 0.4, 0.02, 0.25, 0.15, 0.1, 0.03])
    logits = probs.log()
    order = [1, 3, 4, 5, 0, 6, 2]  # by decreasing probability; cumulative 0.4 0.65 0.8 0.9 0.95 0.98 1
    for top_p, n_keep in [(0.39, 1), (0.41, 2), (0.6, 2), (0.66, 3), (0.85, 4), (0.99, 7), (1.0, 7)]:
        got = filtered_probs(logits, SamplingParams(top_p=top_p))
        kept = set(torch.nonzero(got).flatten().tolist())
        assert kept == set(order[:n_keep]), (top_p, kept)
        expect = torch.zeros(7)
        expect[order[:n_keep]] = probs[order[:n_keep]] / probs[order[:n_keep]].sum()
        torch.testing.assert_close(got, expect)
    g = torch.Generator().manual_seed(7)
    draws = torch.multinomial(filtered_probs(logits, SamplingParams(top_p=0.66)), N, replacement=True, generator=g)
    assert set(draws.unique().tolist()) == {1, 3, 4}


def test_temperature_zero_is_argmax_and_ignores_the_generator():
    logits = torch.randn(50, 300, generator=torch.Generator().manual_seed(8))
    g = torch.Generator().manual_seed(9)
    state = g.get_state()
    tok, lp = sample(logits, [SamplingParams(temperature=0.0, top_k=5, top_p=0.3)] * 50, [g] * 50)
    assert torch.equal(tok, logits.argmax(-1))
    assert torch.equal(g.get_state(), state), "greedy must not consume random numbers"
    assert torch.equal(lp, torch.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1))


@pytest.mark.parametrize("kw", [dict(temperature=0.3), dict(temperature=3.0, top_k=2), dict(top_p=0.5)])
def test_returned_logprob_is_raw_untempered_unfiltered(kw):
    logits = torch.randn(40, 32, generator=torch.Generator().manual_seed(10))
    params = [SamplingParams(**kw)] * 40
    gens = [torch.Generator().manual_seed(i) for i in range(40)]
    tok, lp = sample(logits, params, gens)
    raw = torch.log_softmax(logits.float(), -1).gather(-1, tok[:, None]).squeeze(-1)
    assert torch.equal(lp, raw)
    filt = torch.stack([filtered_probs(r, p)[t] for r, p, t in zip(logits, params, tok)]).log()
    assert float((filt - lp).abs().min()) > 1e-3, "logprob of the tempered/filtered distribution leaked out"


def test_tempered_logprob_is_that_of_the_sampled_temperature_before_filtering():
    """tempered_logprobs: log softmax(logits / T) of the sampled token, per row (top-k / top-p not applied);
    greedy rows and rows without the flag stay raw, whatever the other rows of the batch."""
    logits = torch.randn(8, 32, generator=torch.Generator().manual_seed(12))
    temps = [0.6, 0.6, 1.7, 0.0, 0.6, 1.0, 0.3, 0.6]
    params = [SamplingParams(temperature=t, tempered_logprobs=i != 7, top_k=4 * (i == 4)) for i, t in enumerate(temps)]
    tok, lp = sample(logits, params, [torch.Generator().manual_seed(i) for i in range(8)])
    for i, (t, p) in enumerate(zip(temps, params)):
        scale = t if p.tempered_logprobs and t > 0 else 1.0
        want = torch.log_softmax(logits[i : i + 1] / torch.tensor([[scale]]), -1)[0, tok[i]]
        assert torch.equal(lp[i], want), i
        alone = sample(logits[i : i + 1], [p], [torch.Generator().manual_seed(i)])[1]
        assert torch.equal(alone[0], lp[i])


def test_rows_are_independent_of_the_batch():
    """A row's draw depends only on its logits, params and generator: not on the other rows."""
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(11))
    params = [SamplingParams(temperature=0.8 + 0.1 * i, top_k=10 * (i % 2)) for i in range(6)]
    full, _ = sample(logits, params, [torch.Generator().manual_seed(100 + i) for i in range(6)])
    for i in range(6):
        alone, _ = sample(logits[i : i + 1], [params[i]], [torch.Generator().manual_seed(100 + i)])
        assert int(alone) == int(full[i])
