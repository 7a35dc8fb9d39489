"""Group-relative advantages (GRPO family) and the zero-spread group filter.

Recipes (the published ones): math uses A = r - mean(r) per group, no std division, and drops groups whose
rewards are all equal (all correct / all wrong); Search-R1 divides by the group std.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .types import Group

__all__ = [
    "group_advantages",
    "has_zero_spread",
    "GroupFilterCounts",
    "compute_group_advantages",
    "broadcast_to_tokens",
]


def group_advantages(
    rewards: torch.Tensor, *, normalize_std: bool = False, eps: float = 1e-6
) -> torch.Tensor:
    """Advantages of one group's samples: r - mean(r), optionally divided by (std(r) + eps).

    std is the unbiased (Bessel-corrected) sample std, as torch.std and the GRPO implementations that
    Search-R1 builds on use; eps is added to the std (not inside a sqrt) so that a near-constant group
    gets large-but-finite advantages rather than a division by zero. Computed in fp32.
    """
    r = rewards.to(torch.float32)
    if r.dim() != 1 or r.numel() == 0:
        raise ValueError(f"rewards must be a non-empty 1-D tensor, got shape {tuple(r.shape)}")
    adv = r - r.mean()
    if normalize_std:
        if r.numel() < 2:
            raise ValueError("std normalization needs at least 2 samples per group")
        adv = adv / (r.std(correction=1) + eps)
    return adv


def has_zero_spread(rewards: torch.Tensor) -> bool:
    """True iff all rewards are equal (max == min).

    Tested on the rewards, not on the advantages: the fp32 mean of n equal values need not equal the
    value exactly (six rewards of 0.01 do not), so "all advantages are 0" is not a reliable test.
    A group of one sample has zero spread by this definition (its advantage is 0: nothing to learn).
    """
    return bool(rewards.max() == rewards.min())


@dataclass
class GroupFilterCounts:
    """What the zero-spread filter saw; for logging.

    all_correct / all_wrong count the zero-spread groups by their common reward (> 0 vs <= 0), which for
    the binary rewards of the recipes is exactly "all solved" vs "none solved". They are counted whether
    or not the groups were dropped, so runs with and without the filter log comparable numbers.
    """

    total: int = 0
    kept: int = 0
    all_correct: int = 0
    all_wrong: int = 0

    @property
    def dropped(self) -> int:
        return self.total - self.kept

    def as_dict(self, prefix: str = "advantages/") -> dict[str, float]:
        return {
            f"{prefix}groups_total": float(self.total),
            f"{prefix}groups_kept": float(self.kept),
            f"{prefix}groups_dropped": float(self.dropped),
            f"{prefix}groups_all_correct": float(self.all_correct),
            f"{prefix}groups_all_wrong": float(self.all_wrong),
        }


def compute_group_advantages(
    groups: Sequence[Group],
    *,
    normalize_std: bool = False,
    eps: float = 1e-6,
    drop_zero_spread: bool = True,
) -> tuple[list[Group], list[torch.Tensor], GroupFilterCounts]:
    """Per-sample advantages for every kept group.

    Returns (kept_groups, advantages, counts) with advantages[i] of shape [len(kept_groups[i])], in the
    order of the groups' samples. With drop_zero_spread=False zero-spread groups are kept (advantages ~0).
    """
    kept: list[Group] = []
    advs: list[torch.Tensor] = []
    counts = GroupFilterCounts(total=len(groups))
    for g in groups:
        r = g.rewards
        if has_zero_spread(r):
            if float(r[0]) > 0:
                counts.all_correct += 1
            else:
                counts.all_wrong += 1
            if drop_zero_spread:
                continue
        kept.append(g)
        # A kept zero-spread group of one sample must not reach the std of a single value.
        norm = normalize_std and len(g) > 1
        advs.append(group_advantages(r, normalize_std=norm, eps=eps))
    counts.kept = len(kept)
    return kept, advs, counts


def broadcast_to_tokens(
    sample_advantages: torch.Tensor, seq_lens: torch.Tensor | Sequence[int]
) -> torch.Tensor:
    """Repeat each sample's advantage over its tokens, for a packed (flat) batch.

    seq_lens[i] = number of tokens of sample i in the packed layout; the loss mask decides which of
    them are trained, so prompt positions may carry the advantage harmlessly.
    """
    lens = torch.as_tensor(seq_lens, dtype=torch.int64, device=sample_advantages.device)
    if lens.shape != sample_advantages.shape:
        raise ValueError("one sequence length per sample advantage")
    return torch.repeat_interleave(sample_advantages, lens)
