"""Token-level policy-gradient losses on flat (packed) or padded tensors.

All per-token inputs share one shape (any shape; the ops are elementwise, reductions are full sums):
  trainer_logprobs  log pi_theta(token), fp32, requires grad: the only input gradients flow into.
  gen_logprobs      log mu(token) from the generator (the behaviour policy). Non-finite = unscored.
  advantages        per-token advantage (a sample's advantage broadcast over its tokens).
  loss_mask         1 = generated token trained on.

Common rules (as in the published async-RL recipes):
- valid = loss_mask & isfinite(gen_logprobs); invalid tokens leave numerator AND denominator.
- ratio = exp(clamp(trainer - anchor, -10, 10)); anchor = gen_logprobs (the generator is the old
  policy), or `proximal_logprobs` when given (decoupled PPO: trust region around a proximal policy,
  the behaviour/proximal gap corrected separately by TIS). The clamp only guards exp against
  overflow; where it is active the token gets no gradient (clamp's derivative is 0 there).
- loss = sum over valid tokens of the per-token loss / global_valid_tokens. Trust-region masks (DPPO,
  IcePop) and clipping zero a token's contribution but keep it in the denominator, so the step size
  does not grow when many tokens are masked; only invalid tokens leave the denominator.
- Gradients are therefore per-rank SUMS over tokens divided by the global count: if a data-parallel
  wrapper averages gradients over ranks (FSDP's default), scale the loss by the world size.

Invalid tokens are replaced by harmless values BEFORE any exp (not only masked after): the backward of
exp/multiply computes 0 * inf = NaN for a masked-out token whose forward held inf or NaN. (The log-ratio
clamp happens to block such NaNs too, as clamp's backward zeroes NaN inputs; we do not rely on that.)

Stats are detached 0-dim tensors normalized by the same denominator (partial means, see masking.py):
  clip_frac    valid tokens whose PPO clip is active (their gradient is zero)
  ratio_mean   mean ratio over valid tokens
  masked_frac  valid tokens zeroed by a trust-region mask (DPPO and/or IcePop)
  tis_weight_mean, tis_truncated_frac  (only with TIS)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch

from .masking import denominator, valid_token_mask

__all__ = [
    "LossConfig",
    "DAPO",
    "GRPO",
    "DPPO",
    "PRESETS",
    "TIS_CAP",
    "ICEPOP_BOUNDS",
    "loss_config",
    "policy_loss",
]

LossKind = Literal["ppo_clip", "dppo"]


@dataclass(frozen=True)
class LossConfig:
    """Loss recipe. Use the presets (DAPO, GRPO, DPPO or loss_config(name, **overrides)).

    kind:            "ppo_clip": max(-A*r, -A*clip(r, 1-clip_low, 1+clip_high)); "dppo": -A*r unclipped
                     with the probability-difference trust mask.
    clip_low/high:   PPO clip range (ppo_clip only).
    dppo_delta:      DPPO mask threshold on |p_anchor - p_trainer| (probabilities, not logprobs).
    tis_cap:         truncated importance weight min(exp(proximal - gen), cap), detached, multiplied into
                     the per-token loss. Needs proximal_logprobs (without them the ratio is 1).
    icepop:          (low, high): mask tokens whose mismatch ratio is outside [low, high]. The ratio is
                     exp(proximal - gen) when proximal logprobs are given (pure train/infer mismatch),
                     else exp(trainer - gen), detached.
    log_ratio_clamp: |log ratio| bound before exp.
    """

    kind: LossKind
    clip_low: float = 0.2
    clip_high: float = 0.2
    dppo_delta: float = 0.1
    tis_cap: float | None = None
    icepop: tuple[float, float] | None = None
    log_ratio_clamp: float = 10.0

    def __post_init__(self) -> None:
        if self.icepop is not None:  # configs deliver [low, high] lists
            object.__setattr__(self, "icepop", tuple(float(x) for x in self.icepop))
            if len(self.icepop) != 2:
                raise ValueError("icepop must be (low, high)")
        if self.kind not in ("ppo_clip", "dppo"):
            raise ValueError(f"unknown loss kind {self.kind!r}")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise ValueError("need 0 <= clip_low < 1 and clip_high >= 0")
        if self.tis_cap is not None and self.tis_cap <= 0:
            raise ValueError("tis_cap must be > 0")
        if self.icepop is not None and not (0 <= self.icepop[0] <= self.icepop[1]):
            raise ValueError("icepop bounds must satisfy 0 <= low <= high")


# Recipes. DAPO: clip-higher (asymmetric) range. GRPO here is the symmetric PPO clip with the same
# token-level normalization and no KL term (the recipes use no KL). DPPO: the terminal-agent loss.
DAPO = LossConfig(kind="ppo_clip", clip_low=0.2, clip_high=0.28)
GRPO = LossConfig(kind="ppo_clip", clip_low=0.2, clip_high=0.2)
DPPO = LossConfig(kind="dppo", dppo_delta=0.1)
TIS_CAP = 2.0
ICEPOP_BOUNDS = (0.5, 5.0)
PRESETS = {"dapo": DAPO, "grpo": GRPO, "dppo": DPPO}


def loss_config(name: str, **overrides) -> LossConfig:
    """Preset by name (the `rl.loss` config key) with field overrides: loss_config("dapo", tis_cap=2.0)."""
    if name not in PRESETS:
        raise ValueError(f"unknown loss {name!r}; choose from {sorted(PRESETS)}")
    return replace(PRESETS[name], **overrides)


def policy_loss(
    trainer_logprobs: torch.Tensor,
    gen_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    global_valid_tokens: int | float | torch.Tensor,
    config: LossConfig = DAPO,
    proximal_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Returns (loss, stats). See the module docstring for the rules shared by all recipes.

    global_valid_tokens is required (not defaulted to the local count) because the loss scale is part of
    the optimizer step: pass the all-reduced `count_valid_tokens` in data parallel, the local count
    otherwise.
    """
    shape = trainer_logprobs.shape
    for name, t in (("gen_logprobs", gen_logprobs), ("advantages", advantages), ("loss_mask", loss_mask)):
        if t.shape != shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != trainer_logprobs shape {tuple(shape)}")
    if proximal_logprobs is not None and proximal_logprobs.shape != shape:
        raise ValueError("proximal_logprobs must have the trainer_logprobs shape")
    if config.tis_cap is not None and proximal_logprobs is None:
        raise ValueError(
            "TIS corrects the behaviour/proximal gap and needs proximal_logprobs; without them the "
            "ratio is exactly 1 and TIS would silently do nothing"
        )

    f32 = torch.float32
    valid = valid_token_mask(loss_mask, gen_logprobs)
    zero = torch.zeros((), dtype=f32, device=trainer_logprobs.device)
    denom = denominator(global_valid_tokens, valid, f32)

    # Sanitize first (see module docstring): only the trainer input carries gradient.
    logp = torch.where(valid, trainer_logprobs.to(f32), zero)
    gen = torch.where(valid, gen_logprobs.detach().to(f32), zero)
    adv = torch.where(valid, advantages.detach().to(f32), zero)
    anchor = (
        gen if proximal_logprobs is None else torch.where(valid, proximal_logprobs.detach().to(f32), zero)
    )

    c = config.log_ratio_clamp
    ratio = torch.exp((logp - anchor).clamp(-c, c))

    # Trust-region mask: True = token contributes nothing (but stays in the denominator).
    masked = torch.zeros_like(valid)
    stats: dict[str, torch.Tensor] = {}

    if config.icepop is not None:
        lo, hi = config.icepop
        mismatch = ratio.detach() if proximal_logprobs is None else torch.exp((anchor - gen).clamp(-c, c))
        masked = masked | (mismatch < lo) | (mismatch > hi)

    if config.kind == "ppo_clip":
        unclipped = -adv * ratio
        clipped = -adv * ratio.clamp(1 - config.clip_low, 1 + config.clip_high)
        # PPO's max(): the clipped branch wins only when it is strictly larger; its ratio is constant
        # there, so such tokens get zero gradient. Same value and gradient as torch.maximum, but the
        # selection is explicit and is what clip_frac counts.
        clip_active = clipped > unclipped
        per_token = torch.where(clip_active, clipped, unclipped)
    else:  # dppo
        # Mask tokens whose probability already moved more than delta in the direction the update
        # pushes: A > 0 raises p_trainer, A < 0 lowers it. In probability space (not ratio space) so
        # that rare tokens with large ratios but tiny absolute change are not masked.
        p_trainer = torch.exp(logp.detach())
        p_anchor = torch.exp(anchor)
        d = config.dppo_delta
        masked = masked | ((adv > 0) & (p_trainer - p_anchor > d)) | ((adv < 0) & (p_anchor - p_trainer > d))
        clip_active = torch.zeros_like(valid)
        per_token = -adv * ratio

    if config.tis_cap is not None:
        behaviour_ratio = torch.exp((anchor - gen).clamp(-c, c))  # proximal / behaviour, detached
        tis_weight = behaviour_ratio.clamp(max=config.tis_cap)
        per_token = per_token * tis_weight
        stats["tis_weight_mean"] = (torch.where(valid, tis_weight, zero).sum() / denom).detach()
        stats["tis_truncated_frac"] = ((valid & (behaviour_ratio > config.tis_cap)).sum() / denom).detach()

    contributes = valid & ~masked
    loss = torch.where(contributes, per_token, zero).sum() / denom

    stats["clip_frac"] = ((contributes & clip_active).sum() / denom).detach()
    stats["ratio_mean"] = (torch.where(valid, ratio, zero).sum() / denom).detach()
    stats["masked_frac"] = ((valid & masked).sum() / denom).detach()
    stats["valid_tokens"] = valid.sum().detach()
    return loss, stats
