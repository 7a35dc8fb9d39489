"""conf/recipe/math.yaml against the published math recipe, value by value, through the code that uses each value:
DAPO clip 0.2 / 0.28, AdamW lr 1e-6 constant, temperature 1.0, 8 prompts x 16 rollouts, an 8K response cap,
no KL term, token-level loss normalized by the global valid-token count, group advantages r - mean(r) without
the std, all-correct / all-wrong groups dropped, and the reward graded only on a marked final answer."""

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from zeromismatch.orchestration.build import build_trainer
from zeromismatch.rl.advantages import compute_group_advantages
from zeromismatch.rl.losses import policy_loss
from zeromismatch.rl.types import Group, Sample, Turn

CONF = Path(__file__).resolve().parents[2] / "conf"
MATH_EXPS = sorted(p.stem for p in (CONF / "exp").glob("math_*.yaml"))


def compose_exp(exp: str):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("config", overrides=[f"+exp={exp}"])


def group(rewards) -> Group:
    samples = [Sample([1], [1, 2], [0, 1], [float("nan"), -1.0], [-1, 0], r, [Turn((2,), 0)]) for r in rewards]
    return Group("p", samples)


def test_every_published_math_experiment_uses_the_recipe():
    assert {"math_op4_bi", "math_op12_bi", "math_op32_bi", "math_op4_stock"} <= set(MATH_EXPS)


@pytest.mark.parametrize("exp", MATH_EXPS)
def test_recipe_values(exp):
    cfg = compose_exp(exp)
    rl, tr = cfg.rl, cfg.trainer
    assert cfg.task.name == "math" and cfg.task.source == "hub"
    assert (rl.prompts_per_step, rl.samples_per_prompt) == (8, 16)
    assert rl.max_new_tokens == 8192
    assert rl.temperature == 1.0
    assert rl.loss == "dapo" and (rl.clip_low, rl.clip_high) == (0.2, 0.28)
    assert tr.optimizer == "adamw" and tr.lr == 1.0e-6 and tr.dtype == "bfloat16"
    assert rl.adv_std_norm is False and rl.drop_uniform_groups is True
    assert rl.tis_cap is None and rl.icepop is None  # the plain DAPO loss, no mismatch correction
    assert rl.dynamic_sampling is False  # zero-spread groups are dropped, not resampled
    assert not [k for k in list(rl) + list(tr) if "kl" in k.lower()]  # no KL coefficient anywhere
    assert not [k for k in tr if "sched" in k.lower() or "warmup" in k.lower()]  # constant lr
    assert cfg.task.last_number_fallback is False

    # the values reach the trainer as the published recipe
    trainer = build_trainer(cfg, torch.nn.Linear(2, 2))
    assert (trainer.loss_cfg.kind, trainer.loss_cfg.clip_low, trainer.loss_cfg.clip_high) == ("ppo_clip", 0.2, 0.28)
    assert trainer.loss_cfg.tis_cap is None and trainer.loss_cfg.icepop is None
    assert [g["lr"] for g in trainer.opt.param_groups] == [1.0e-6]
    assert isinstance(trainer.opt, torch.optim.AdamW) and not hasattr(trainer, "scheduler")
    assert trainer.normalize_adv_std is False and trainer.drop_zero_spread is True


def test_group_advantages_are_centred_not_scaled_and_uniform_groups_dropped():
    kept, advs, counts = compute_group_advantages(
        [group([1, 0, 0, 0]), group([1, 1, 1, 1]), group([0, 0, 0, 0])], normalize_std=False)
    assert len(kept) == 1 and (counts.all_correct, counts.all_wrong) == (1, 1)
    assert torch.equal(advs[0], torch.tensor([0.75, -0.25, -0.25, -0.25]))  # r - mean(r), no std


def test_loss_is_token_level_over_the_global_valid_token_count():
    """At ratio 1 the DAPO loss is -sum(A over valid tokens) / global valid tokens: every token weighs the same
    whatever its sample's length (not a per-sample mean), and a microbatch divides by the whole batch's count."""
    adv = torch.tensor([1.0, 1.0, 1.0, -0.5, -0.5])  # sample 1: 3 tokens (A=1), sample 2: 2 tokens (A=-0.5)
    mask = torch.tensor([1, 1, 1, 1, 0])  # the last token is not trained
    lp = torch.full((5,), -1.0, requires_grad=True)
    gen = torch.full((5,), -1.0)
    loss, stats = policy_loss(lp, gen, adv, mask, global_valid_tokens=4)
    assert loss.item() == pytest.approx(-(1 + 1 + 1 - 0.5) / 4)
    assert stats["valid_tokens"].item() == 4
    # the same batch as two microbatches, each over the global count, adds up to the whole
    first, _ = policy_loss(lp[:3], gen[:3], adv[:3], mask[:3], global_valid_tokens=4)
    second, _ = policy_loss(lp[3:], gen[3:], adv[3:], mask[3:], global_valid_tokens=4)
    assert (first + second).item() == pytest.approx(loss.item())
