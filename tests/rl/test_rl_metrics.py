import math

import pytest
import torch

from zeromismatch.rl.metrics import (
    MAX_REDUCED_KEYS,
    decompose_logprob_diff,
    gather_by_version,
    mismatch_decomposition,
    mismatch_metrics,
    policy_age_metrics,
)
from zeromismatch.rl.types import Group

P = "bit_wise/logprob_diff/"
f64 = torch.float64


def t32(x):
    return torch.tensor(x, dtype=torch.float32)


def test_mismatch_metrics_hand_case():
    # valid tokens: the first three (4th has gen NaN, 5th is outside the loss mask)
    # diff = trainer - gen = 0, +0.5, -0.25
    trainer = t32([-1.0, -2.0, -0.5, -3.0, -1.0])
    gen = t32([-1.0, -2.5, -0.25, math.nan, -9.0])
    mask = torch.tensor([1, 1, 1, 1, 0])
    m = mismatch_metrics(trainer, gen, mask)
    assert float(m[P + "abs_mean"]) == 0.75 / 3
    assert float(m[P + "mean"]) == 0.25 / 3
    assert float(m[P + "max"]) == 0.5
    assert float(m["bit_wise/ratio_tokens_different/mean"]) == 2 / 3
    assert float(m["debug/logprob_diff_kl_k1_mean"]) == -0.25 / 3
    # k3 = e^d - 1 - d: (e^0.5 - 1.5) + (e^-0.25 - 0.75) = 0.1487212707001282 + 0.0288007830714049
    assert float(m["debug/logprob_diff_kl_k3_mean"]) == pytest.approx(0.1775220537715331 / 3, rel=1e-12)
    assert float(m["bit_wise/valid_tokens"]) == 3
    # data parallel: 3 local of 6 global tokens -> partial means halve, the max does not
    g = mismatch_metrics(trainer, gen, mask, global_valid_tokens=6)
    assert float(g[P + "abs_mean"]) == 0.75 / 6 and float(g[P + "max"]) == 0.5
    assert MAX_REDUCED_KEYS & set(m) == {P + "max"}


def test_ratio_tokens_different_threshold():
    gen = t32([-1.0, -1.0, -1.0])
    trainer = t32([-1.0, -1.0 + 5e-7, -1.0 + 2e-6])  # diffs 0, ~5e-7 (below 1e-6), ~2e-6 (above)
    m = mismatch_metrics(trainer, gen, torch.ones(3))
    assert float(m["bit_wise/ratio_tokens_different/mean"]) == 1 / 3
    assert 1e-6 < float(m[P + "max"]) < 3e-6


def test_bitwise_equal_logprobs_give_exact_zeros():
    torch.manual_seed(0)
    lp = torch.log_softmax(torch.randn(64, 50), -1).gather(1, torch.randint(0, 50, (64, 1))).squeeze(1)
    m = mismatch_metrics(lp.clone(), lp.clone(), torch.ones(64))
    for key in (
        P + "abs_mean",
        P + "mean",
        P + "max",
        "bit_wise/ratio_tokens_different/mean",
        "debug/logprob_diff_kl_k3_mean",
    ):
        assert float(m[key]) == 0.0, key


def test_nonfinite_trainer_logprob_on_valid_token_raises():
    gen = t32([-1.0, math.nan])
    mismatch_metrics(t32([-1.0, math.nan]), gen, torch.ones(2))  # NaN only where gen is invalid: fine
    with pytest.raises(ValueError):
        mismatch_metrics(t32([math.nan, -1.0]), gen, torch.ones(2))


def test_decomposition_hand_case():
    #            t_cur  t_old  gen   precision=t_old-gen  staleness=t_cur-t_old  total=t_cur-gen
    # token 0    -1.0   -1.25  -1.0  -0.25                +0.25                  0
    # token 1    -2.0   -2.0   -1.5  -0.5                  0                    -0.5
    # token 2    invalid (gen NaN)
    t_cur, t_old, gen = t32([-1.0, -2.0, -0.7]), t32([-1.25, -2.0, -0.7]), t32([-1.0, -1.5, math.nan])
    d = mismatch_decomposition(t_cur, t_old, gen, torch.ones(3))
    assert float(d[P + "precision_abs_mean"]) == 0.375
    assert float(d[P + "staleness_abs_mean"]) == 0.125
    assert float(d[P + "abs_mean"]) == 0.25  # parts cancel on token 0: abs does not add up
    assert float(d[P + "precision_mean"]) == -0.375
    assert float(d[P + "staleness_mean"]) == 0.125
    assert float(d[P + "mean"]) == -0.25
    # the totals are the same numbers mismatch_metrics reports
    m = mismatch_metrics(t_cur, gen, torch.ones(3))
    assert torch.equal(d[P + "abs_mean"], m[P + "abs_mean"]) and torch.equal(d[P + "mean"], m[P + "mean"])
    half = mismatch_decomposition(t_cur, t_old, gen, torch.ones(3), global_valid_tokens=4)
    assert float(half[P + "precision_abs_mean"]) == 0.375 / 2
    # the precision part over tokens of unmixed samples only (token 1 here), and their share of valid tokens
    u = mismatch_decomposition(t_cur, t_old, gen, torch.ones(3), unmixed=torch.tensor([False, True, True]))
    assert float(u[P + "precision_unmixed_abs_mean"]) == 0.5
    assert float(u["bit_wise/unmixed_token_fraction"]) == 0.5
    assert torch.equal(u[P + "precision_abs_mean"], d[P + "precision_abs_mean"])  # the rest is unchanged
    none = mismatch_decomposition(t_cur, t_old, gen, torch.ones(3), unmixed=torch.tensor([False, False, True]))
    assert P + "precision_unmixed_abs_mean" not in none and float(none["bit_wise/unmixed_token_fraction"]) == 0.0
    assert "bit_wise/unmixed_token_fraction" not in d  # no flags given: nothing claimed


def test_decomposition_is_exact_on_dyadic_inputs():
    # Multiples of 2^-8 in [-20, 0] and a power-of-two token count: every difference, sum and the
    # division are exact in float64, so the signed identity must hold with ==, token by token and in
    # the means. A sign or operand mix-up in the decomposition breaks this by O(1).
    g = torch.Generator().manual_seed(1)
    n = 64
    t_cur, t_old, gen = (-torch.randint(0, 20 * 256, (n,), generator=g).float() / 256 for _ in range(3))
    total, prec, stale = decompose_logprob_diff(t_cur, t_old, gen)
    assert torch.equal(prec + stale, total)
    d = mismatch_decomposition(t_cur, t_old, gen, torch.ones(n))
    assert d[P + "precision_mean"] + d[P + "staleness_mean"] == d[P + "mean"]
    assert float(d[P + "abs_mean"]) <= float(d[P + "precision_abs_mean"] + d[P + "staleness_abs_mean"])
    assert float(d[P + "precision_abs_mean"]) > 0.1 and float(d[P + "staleness_abs_mean"]) > 0.1


def test_decomposition_on_realistic_logprobs_within_fp64_rounding():
    # fp32 logprobs from log_softmax; t_old = generator + small numerics noise, t_cur = a moved policy.
    # How it is asserted: per token, the three float64 differences and one addition are each rounded
    # at most once (unit roundoff u = 2^-53), so |prec + stale - total| <= 4u(|prec| + |stale| + |total|).
    # For the means, recursive summation of n terms adds at most n*u*sum|terms| per sum, so
    # |mean - (prec_mean + stale_mean)| <= (n + 4) * u * (sum|prec| + sum|stale| + sum|total|) / n.
    # Both bounds are ~1e-14 here, ten orders of magnitude below the parts themselves (~1e-2).
    torch.manual_seed(0)
    n, v = 512, 100
    logits = torch.randn(n, v)
    tok = torch.randint(0, v, (n, 1))
    gen = torch.log_softmax(logits, -1).gather(1, tok).squeeze(1)
    t_old = torch.log_softmax(logits + 1e-3 * torch.randn(n, v), -1).gather(1, tok).squeeze(1)
    t_cur = torch.log_softmax(logits + 0.05 * torch.randn(n, v), -1).gather(1, tok).squeeze(1)
    total, prec, stale = decompose_logprob_diff(t_cur, t_old, gen)
    u = 2.0**-53
    scale = prec.abs() + stale.abs() + total.abs()
    assert bool(((prec + stale - total).abs() <= 4 * u * scale).all())

    d = mismatch_decomposition(t_cur, t_old, gen, torch.ones(n))
    bound = (n + 4) * u * float(scale.sum()) / n
    err = abs(float(d[P + "mean"]) - float(d[P + "precision_mean"] + d[P + "staleness_mean"]))
    assert err <= bound < 1e-12
    assert float(d[P + "precision_abs_mean"]) > 1e-5 and float(d[P + "staleness_abs_mean"]) > 1e-3


def test_bitwise_generator_leaves_only_staleness():
    # What zeromismatch promises: trainer@gen_version == generator bitwise. Then the precision part is
    # exactly 0 and staleness is exactly the total.
    torch.manual_seed(2)
    gen = -torch.rand(32) * 5
    t_cur = gen + 0.01 * torch.randn(32)
    d = mismatch_decomposition(t_cur, gen.clone(), gen, torch.ones(32))
    assert float(d[P + "precision_abs_mean"]) == 0.0 and float(d[P + "precision_mean"]) == 0.0
    assert torch.equal(d[P + "staleness_abs_mean"], d[P + "abs_mean"])
    assert torch.equal(d[P + "staleness_mean"], d[P + "mean"])


def test_gather_by_version_for_mixed_version_sequences():
    gen_version = torch.tensor([-1, 3, 3, 5, -1, 5])
    mask = torch.tensor([0, 1, 1, 1, 0, 1])
    at3 = t32([0.0, -0.1, -0.2, -0.3, -0.4, -0.5])
    at5 = t32([0.0, -1.1, -1.2, -1.3, -1.4, -1.5])
    out = gather_by_version({3: at3, 5: at5}, gen_version, mask)
    assert torch.equal(out[mask.bool()], t32([-0.1, -0.2, -1.3, -1.5]))
    assert torch.isnan(out[~mask.bool()]).all()
    with pytest.raises(KeyError):
        gather_by_version({3: at3}, gen_version, mask)


def test_policy_age_with_mixed_version_samples(make_sample):
    # consumer version 6
    # sample a: turns admitted at 3 and 5 (tool call in between); trained tokens at versions 3,3,5,5
    #           sample age 6-3 = 3; token ages 3,3,1,1
    # sample b: one turn admitted at 4, hot swap mid-turn: tokens at 4,4,6
    #           sample age 2; token ages 2,2,0
    a = make_sample(turn_versions=(3, 5))
    b = make_sample(turn_versions=(4,), tokens_per_turn=3, token_versions=(4, 4, 6))
    m = policy_age_metrics([Group("p", [a, b])], consumer_version=6)
    assert m["train_batch/policy_age"] == 2.5
    assert m["train_batch/policy_age_max"] == 3.0
    assert m["train_batch/policy_age_token_mean"] == 12 / 7
    # samples weigh equally across groups: ages 3, 2 and 0 -> mean 5/3
    c = make_sample(turn_versions=(6,))
    m = policy_age_metrics([Group("p", [a, b]), Group("q", [c])], consumer_version=6)
    assert m["train_batch/policy_age"] == 5 / 3 and m["train_batch/policy_age_max"] == 3.0
    assert "train_batch/policy_age_max" in MAX_REDUCED_KEYS
    # versions newer than the consumer are bookkeeping bugs: sample admission (a at 3 > 2) ...
    with pytest.raises(ValueError):
        policy_age_metrics([Group("p", [a])], consumer_version=2)
    # ... and token versions (b admitted at 4 but has a token from 6)
    with pytest.raises(ValueError):
        policy_age_metrics([Group("p", [b])], consumer_version=5)
