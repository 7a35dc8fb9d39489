"""Model-independent RL algorithms: rollout types, advantages, losses, masking, mismatch metrics and the
offpolicy-N rules (the run-ahead buffer).

Plain torch: no model, no threads, no process groups, so every rule here is unit-testable on CPU. Who runs
these pieces where (generator threads or processes, weight transfer) is orchestration/.
"""

from .advantages import GroupFilterCounts, broadcast_to_tokens, compute_group_advantages, group_advantages
from .losses import DAPO, DPPO, GRPO, LossConfig, loss_config, policy_loss
from .masking import count_valid_tokens, valid_token_mask
from .metrics import (
    MAX_REDUCED_KEYS,
    gather_by_version,
    mismatch_decomposition,
    mismatch_metrics,
    policy_age_metrics,
)
from .offpolicy import Batch, RunAheadBuffer, age, keep
from .types import Group, Sample, Turn

__all__ = [
    "Turn",
    "Sample",
    "Group",
    "group_advantages",
    "compute_group_advantages",
    "broadcast_to_tokens",
    "GroupFilterCounts",
    "LossConfig",
    "DAPO",
    "GRPO",
    "DPPO",
    "loss_config",
    "policy_loss",
    "valid_token_mask",
    "count_valid_tokens",
    "MAX_REDUCED_KEYS",
    "mismatch_metrics",
    "mismatch_decomposition",
    "gather_by_version",
    "policy_age_metrics",
    "age",
    "keep",
    "Batch",
    "RunAheadBuffer",
]
