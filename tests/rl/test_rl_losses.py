"""Policy losses on hand-computed cases.

Each case fixes per-token probabilities so that ratio = p_trainer / p_gen is a round number, and the
expected per-token losses are worked out by hand in the comments. fp32 exp/log make the ratios exact to
~1e-7, hence the tolerances.
"""

import math
from dataclasses import replace

import pytest
import torch

from zeromismatch.rl.losses import (
    DAPO,
    DPPO,
    GRPO,
    ICEPOP_BOUNDS,
    TIS_CAP,
    LossConfig,
    loss_config,
    policy_loss,
)
from zeromismatch.rl.masking import count_valid_tokens

TOL = dict(rtol=1e-5, atol=1e-6)


def lp(probs):
    return torch.tensor([math.log(p) for p in probs], dtype=torch.float32)


def leaf(x):
    return x.clone().requires_grad_(True)


def run(trainer, gen, adv, mask=None, *, config, global_valid_tokens=None, proximal=None):
    trainer = leaf(trainer)
    adv = torch.tensor(adv, dtype=torch.float32)
    mask = torch.ones_like(gen, dtype=torch.int64) if mask is None else torch.tensor(mask)
    if global_valid_tokens is None:
        global_valid_tokens = count_valid_tokens(mask, gen)
    loss, stats = policy_loss(
        trainer,
        gen,
        adv,
        mask,
        global_valid_tokens=global_valid_tokens,
        config=config,
        proximal_logprobs=proximal,
    )
    loss.backward()
    return loss, stats, trainer.grad


# ratios r = [1.5, 0.5, 0.5, 1.5, 1.25] with gen prob 0.4 everywhere; advantages [+1, +1, -1, -1, +1]
GEN5 = lp([0.4] * 5)
TRAINER5 = lp([0.6, 0.2, 0.2, 0.6, 0.5])
ADV5 = [1.0, 1.0, -1.0, -1.0, 1.0]


def test_dapo_asymmetric_clip():
    # per token max(-A r, -A clip(r, 0.8, 1.28)):
    #   r=1.5 A=+1: max(-1.5, -1.28) = -1.28  clipped
    #   r=0.5 A=+1: max(-0.5, -0.8)  = -0.5
    #   r=0.5 A=-1: max( 0.5,  0.8)  =  0.8   clipped
    #   r=1.5 A=-1: max( 1.5,  1.28) =  1.5
    #   r=1.25 A=+1: 1.25 < 1.28      = -1.25 (would be clipped by GRPO's 1.2)
    # sum -0.73 over 5 tokens
    loss, stats, grad = run(TRAINER5, GEN5, ADV5, config=DAPO)
    torch.testing.assert_close(loss, torch.tensor(-0.146), **TOL)
    torch.testing.assert_close(stats["clip_frac"], torch.tensor(0.4), **TOL)
    torch.testing.assert_close(stats["ratio_mean"], torch.tensor(1.05), **TOL)
    assert float(stats["masked_frac"]) == 0.0
    # d/dlogp of -A r is -A r; clipped tokens get exactly zero gradient
    torch.testing.assert_close(grad, torch.tensor([0.0, -0.1, 0.0, 0.3, -0.25]), **TOL)
    assert grad[0] == 0 and grad[2] == 0


def test_grpo_symmetric_clip():
    # same tokens, clip range [0.8, 1.2]: -1.2, -0.5, 0.8, 1.5, -1.2 (now clipped) -> sum -0.6
    loss, stats, grad = run(TRAINER5, GEN5, ADV5, config=GRPO)
    torch.testing.assert_close(loss, torch.tensor(-0.12), **TOL)
    torch.testing.assert_close(stats["clip_frac"], torch.tensor(0.6), **TOL)
    torch.testing.assert_close(grad, torch.tensor([0.0, -0.1, 0.0, 0.3, 0.0]), **TOL)


def test_nonfinite_gen_logprobs_leave_numerator_and_denominator():
    # The DAPO case plus: gen NaN, gen -inf, gen +inf (all in the loss mask) and one finite token
    # outside the loss mask with a huge advantage. Only the 5 original tokens are valid.
    # A padding position (mask 0, NaN everywhere) must not leak NaN into the gradient either.
    gen = torch.cat([GEN5, torch.tensor([math.nan, -math.inf, math.inf, -1.0, math.nan])])
    trainer = torch.cat([TRAINER5, torch.tensor([-1.0, -1.0, -1.0, 5.0, math.nan])])
    adv = ADV5 + [1.0, 1.0, 1.0, 100.0, math.nan]
    mask = [1] * 8 + [0, 0]
    assert int(count_valid_tokens(torch.tensor(mask), gen)) == 5
    loss, stats, grad = run(trainer, gen, adv, mask, config=DAPO)
    torch.testing.assert_close(loss, torch.tensor(-0.146), **TOL)  # -0.73 / 5, not / 8 or / 10
    assert int(stats["valid_tokens"]) == 5
    assert torch.isfinite(grad).all()
    assert torch.equal(grad[5:], torch.zeros(5))
    torch.testing.assert_close(grad[:5], torch.tensor([0.0, -0.1, 0.0, 0.3, -0.25]), **TOL)


def test_global_valid_tokens_is_the_divisor():
    # A data-parallel rank with 5 of 20 global tokens: same sum, divided by 20.
    loss, stats, grad = run(TRAINER5, GEN5, ADV5, config=DAPO, global_valid_tokens=torch.tensor(20))
    torch.testing.assert_close(loss, torch.tensor(-0.73 / 20), **TOL)
    torch.testing.assert_close(grad, torch.tensor([0.0, -0.1, 0.0, 0.3, -0.25]) / 4, **TOL)
    torch.testing.assert_close(stats["clip_frac"], torch.tensor(2 / 20), **TOL)  # partial means
    torch.testing.assert_close(stats["ratio_mean"], torch.tensor(5.25 / 20), **TOL)
    _, stats, _ = run(TRAINER5, GEN5, ADV5, config=replace(DAPO, icepop=(0.6, 1.4)), global_valid_tokens=20)
    torch.testing.assert_close(stats["masked_frac"], torch.tensor(4 / 20), **TOL)  # r 1.5, 0.5, 0.5, 1.5


def test_no_valid_tokens_gives_zero_loss_and_zero_grad():
    gen = torch.full((3,), math.nan)
    loss, stats, grad = run(lp([0.5] * 3), gen, [1.0, -1.0, 1.0], config=DAPO)
    assert float(loss.detach()) == 0.0 and torch.equal(grad, torch.zeros(3))


def test_log_ratio_clamp():
    # log ratios +15, -15, +2. DPPO (unclipped) shows the clamped ratio directly:
    #   +15 -> e^10, A=-1: loss +e^10      (A<0 mask needs p_gen - p_trainer > 0.1; p_gen ~1e-7: no)
    #   -15 -> e^-10, A=+1: loss -e^-10    (A>0 mask needs p_trainer - p_gen > 0.1: no)
    #   +2  -> e^2,  A=-1: loss +e^2       (not clamped)
    # Clamped tokens get zero gradient; the unclamped one gets -A r / 3 = e^2 / 3.
    trainer = torch.tensor([-1.0, -16.0, -1.0])
    gen = torch.tensor([-16.0, -1.0, -3.0])
    loss, stats, grad = run(trainer, gen, [-1.0, 1.0, -1.0], config=DPPO)
    expected = (math.exp(10) - math.exp(-10) + math.exp(2)) / 3
    torch.testing.assert_close(loss, torch.tensor(expected), rtol=1e-6, atol=0)
    torch.testing.assert_close(grad, torch.tensor([0.0, 0.0, math.exp(2) / 3]), **TOL)
    assert float(stats["masked_frac"]) == 0.0
    # PPO clip has no upper bound for A < 0 (no dual clip): the clamped ratio passes through.
    loss, _, _ = run(trainer[:1], gen[:1], [-1.0], config=DAPO)
    torch.testing.assert_close(loss, torch.tensor(math.exp(10)), rtol=1e-6, atol=0)
    # A different clamp bound is honoured.
    loss, _, _ = run(trainer[:1], gen[:1], [-1.0], config=replace(DPPO, log_ratio_clamp=3.0))
    torch.testing.assert_close(loss, torch.tensor(math.exp(3)), rtol=1e-6, atol=0)


def test_dppo_masks_in_the_direction_that_grows_the_ratio():
    #  p_trainer p_gen  A   rule                                  per-token loss -A r
    #  0.5       0.3   +1   p_t - p_g = 0.2 > 0.1  -> masked        0
    #  0.3       0.5   +1   p_t - p_g < 0          -> kept         -0.6
    #  0.3       0.5   -1   p_g - p_t = 0.2 > 0.1  -> masked        0
    #  0.5       0.3   -1   p_g - p_t < 0          -> kept         +5/3
    #  0.35      0.3   +1   0.05 <= 0.1            -> kept         -7/6
    #  0.3       0.35  -1   0.05 <= 0.1            -> kept         +6/7
    #  0.9       0.1    0   no direction           -> kept          0
    trainer = lp([0.5, 0.3, 0.3, 0.5, 0.35, 0.3, 0.9])
    gen = lp([0.3, 0.5, 0.5, 0.3, 0.3, 0.35, 0.1])
    adv = [1.0, 1.0, -1.0, -1.0, 1.0, -1.0, 0.0]
    loss, stats, grad = run(trainer, gen, adv, config=DPPO)
    terms = [0.0, -0.6, 0.0, 5 / 3, -7 / 6, 6 / 7, 0.0]
    torch.testing.assert_close(loss, torch.tensor(sum(terms) / 7), **TOL)
    torch.testing.assert_close(stats["masked_frac"], torch.tensor(2 / 7), **TOL)
    assert float(stats["clip_frac"]) == 0.0
    # unclipped: gradient of every kept token is -A r / N, masked ones exactly 0
    torch.testing.assert_close(grad, torch.tensor(terms) / 7, **TOL)
    assert grad[0] == 0 and grad[2] == 0
    # a larger delta unmasks both
    loss, stats, _ = run(trainer, gen, adv, config=replace(DPPO, dppo_delta=0.25))
    terms_all = [-5 / 3, -0.6, 0.6, 5 / 3, -7 / 6, 6 / 7, 0.0]
    torch.testing.assert_close(loss, torch.tensor(sum(terms_all) / 7), **TOL)
    assert float(stats["masked_frac"]) == 0.0


def test_tis_on_behaviour_vs_proximal_ratio():
    #  p_gen p_prox p_trainer  w = min(p_prox/p_gen, 2)  r = p_t/p_prox  A   per-token
    #  0.25  0.75   0.75       min(3, 2) = 2 truncated   1.0            +1  -1.0 * 2   = -2.0
    #  0.5   0.75   0.825      1.5                       1.1            +1  -1.1 * 1.5 = -1.65
    #  0.6   0.3    0.45       0.5                       1.5 (clipped)  +1  -1.28 * 0.5 = -0.64
    gen = lp([0.25, 0.5, 0.6])
    prox = leaf(lp([0.75, 0.75, 0.3]))  # requires grad: TIS weights must be detached
    trainer = lp([0.75, 0.825, 0.45])
    loss, stats, grad = run(
        trainer, gen, [1.0, 1.0, 1.0], config=replace(DAPO, tis_cap=TIS_CAP), proximal=prox
    )
    torch.testing.assert_close(loss, torch.tensor(-4.29 / 3), **TOL)
    torch.testing.assert_close(grad, torch.tensor([-2.0, -1.65, 0.0]) / 3, **TOL)
    torch.testing.assert_close(stats["tis_weight_mean"], torch.tensor(4 / 3), **TOL)
    torch.testing.assert_close(stats["tis_truncated_frac"], torch.tensor(1 / 3), **TOL)
    torch.testing.assert_close(stats["ratio_mean"], torch.tensor(1.2), **TOL)  # trainer vs proximal
    torch.testing.assert_close(stats["clip_frac"], torch.tensor(1 / 3), **TOL)
    assert prox.grad is None


def test_tis_without_proximal_is_refused():
    with pytest.raises(ValueError, match="proximal"):
        run(TRAINER5, GEN5, ADV5, config=replace(DAPO, tis_cap=2.0))


def test_icepop_masks_ratios_outside_bounds():
    #  r    A   DAPO per-token          IcePop [0.5, 5]
    #  0.4  +1  max(-0.4, -0.8) = -0.4  masked
    #  1.0  +1  -1.0                    kept
    #  4.0  -1  max(4, 1.28) = 4.0      kept
    #  6.0  -1  6.0                     masked
    gen = lp([0.1] * 4)
    trainer = lp([0.04, 0.1, 0.4, 0.6])
    adv = [1.0, 1.0, -1.0, -1.0]
    loss, stats, grad = run(trainer, gen, adv, config=replace(DAPO, icepop=ICEPOP_BOUNDS))
    torch.testing.assert_close(loss, torch.tensor((-1.0 + 4.0) / 4), **TOL)
    torch.testing.assert_close(stats["masked_frac"], torch.tensor(0.5), **TOL)
    torch.testing.assert_close(grad, torch.tensor([0.0, -1.0, 4.0, 0.0]) / 4, **TOL)
    loss, stats, _ = run(trainer, gen, adv, config=DAPO)  # without IcePop all four count
    torch.testing.assert_close(loss, torch.tensor((-0.4 - 1.0 + 4.0 + 6.0) / 4), **TOL)


def test_icepop_uses_the_mismatch_ratio_when_proximal_given():
    # trainer == proximal (ratio 1); proximal/gen = 0.4, 2.0, 6.0 -> first and last masked.
    gen = lp([0.5, 0.2, 0.1])
    prox = lp([0.2, 0.4, 0.6])
    loss, stats, _ = run(
        prox, gen, [1.0, 1.0, 1.0], config=replace(DAPO, icepop=ICEPOP_BOUNDS), proximal=prox
    )
    torch.testing.assert_close(loss, torch.tensor(-1.0 / 3), **TOL)
    torch.testing.assert_close(stats["masked_frac"], torch.tensor(2 / 3), **TOL)


def test_shape_agnostic_and_validation():
    flat, _, gflat = run(TRAINER5[:4], GEN5[:4], ADV5[:4], config=DAPO)
    t2 = leaf(TRAINER5[:4].reshape(2, 2))
    loss2, _ = policy_loss(
        t2,
        GEN5[:4].reshape(2, 2),
        torch.tensor(ADV5[:4]).reshape(2, 2),
        torch.ones(2, 2, dtype=torch.int64),
        global_valid_tokens=4,
    )
    loss2.backward()
    assert torch.equal(loss2, flat) and torch.equal(t2.grad.reshape(-1), gflat)
    with pytest.raises(ValueError):
        policy_loss(leaf(TRAINER5), GEN5[:4], torch.zeros(5), torch.ones(5), global_valid_tokens=5)
    with pytest.raises(ValueError):
        LossConfig(kind="ppo")


def test_presets_by_name():
    assert loss_config("dapo") == DAPO and (DAPO.clip_low, DAPO.clip_high) == (0.2, 0.28)
    assert (GRPO.clip_low, GRPO.clip_high) == (0.2, 0.2) and DPPO.dppo_delta == 0.1
    cfg = loss_config("grpo", icepop=[0.5, 5.0], tis_cap=2.0)  # yaml lists become tuples
    assert cfg.icepop == (0.5, 5.0) and cfg.tis_cap == 2.0 and cfg.kind == "ppo_clip"
    with pytest.raises(ValueError):
        loss_config("ppo")
