"""Trainer/generator mismatch metrics (named as the published write-up logs them) and policy age.

Token set: valid = loss_mask & isfinite(gen_logprobs) (masking.py), the same set the loss uses.
diff = trainer_logprob - generator_logprob per valid token.

All arithmetic is in float64 on detached inputs: the inputs are fp32, the difference of two fp32
numbers of similar magnitude is exact in fp64, and the logged number of a bitwise-exact run must be
exactly 0, not a rounding residue of the reduction.

Data parallel (masking.py): means are local sums / global_valid_tokens; all-reduce them with SUM.
Keys in MAX_REDUCED_KEYS are local maxima; all-reduce those with MAX.

KL estimators (Schulman, "Approximating KL divergence"): tokens are sampled from the generator, so with
r = p_trainer / p_gen = exp(diff) both estimate KL(gen || trainer):
  k1 = log p_gen - log p_trainer = -diff       (unbiased, can be negative; k1_mean == -mean exactly)
  k3 = (r - 1) - log r = expm1(diff) - diff     (unbiased, >= 0 per token, lower variance)
Neither is clamped: a huge k3 is a real symptom and should show in the logs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from .masking import denominator, valid_token_mask
from .types import Group

__all__ = [
    "MAX_REDUCED_KEYS",
    "mismatch_metrics",
    "decompose_logprob_diff",
    "mismatch_decomposition",
    "gather_by_version",
    "policy_age_metrics",
    "rollout_metrics",
]

_P = "bit_wise/logprob_diff/"
MAX_REDUCED_KEYS = frozenset({_P + "max", "train_batch/policy_age_max"})


def _check_finite_on(valid: torch.Tensor, x: torch.Tensor, name: str) -> None:
    # Trainer logprobs come from an fp32 log_softmax and are finite unless something is broken;
    # a NaN here would silently poison every logged mean, so fail loudly instead.
    if x.shape != valid.shape:
        raise ValueError(f"{name} shape {tuple(x.shape)} != loss_mask shape {tuple(valid.shape)}")
    if bool((valid & ~torch.isfinite(x)).any()):
        raise ValueError(f"{name} is not finite on a valid token")


def mismatch_metrics(
    trainer_logprobs: torch.Tensor,
    gen_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    global_valid_tokens: int | float | torch.Tensor | None = None,
    diff_threshold: float = 1e-6,
) -> dict[str, torch.Tensor]:
    """The mismatch metrics, as 0-dim float64 tensors.

    bit_wise/logprob_diff/abs_mean            sum |diff| / N   (the headline)
    bit_wise/logprob_diff/mean                sum diff / N
    bit_wise/logprob_diff/max                 max |diff| (0 when there is no valid token)
    bit_wise/ratio_tokens_different/mean      #(|diff| > diff_threshold) / N
    debug/logprob_diff_kl_k1_mean             sum k1 / N
    debug/logprob_diff_kl_k3_mean             sum k3 / N
    bit_wise/valid_tokens                     local valid-token count (SUM-reduce)
    with N = global_valid_tokens, or the local valid count when None.
    """
    valid = valid_token_mask(loss_mask, gen_logprobs)
    _check_finite_on(valid, trainer_logprobs, "trainer_logprobs")
    f64 = torch.float64
    zero = torch.zeros((), dtype=f64, device=valid.device)
    n = denominator(global_valid_tokens, valid, f64)

    diff = torch.where(valid, trainer_logprobs.detach().to(f64) - gen_logprobs.detach().to(f64), zero)
    absd = diff.abs()
    k3 = torch.expm1(diff) - diff  # 0 on invalid tokens since diff is 0 there
    return {
        _P + "abs_mean": absd.sum() / n,
        _P + "mean": diff.sum() / n,
        _P + "max": absd.max() if absd.numel() else zero,
        "bit_wise/ratio_tokens_different/mean": (absd > diff_threshold).sum().to(f64) / n,
        "debug/logprob_diff_kl_k1_mean": (-diff).sum() / n,
        "debug/logprob_diff_kl_k3_mean": k3.sum() / n,
        "bit_wise/valid_tokens": valid.sum().to(f64),
    }


def decompose_logprob_diff(
    trainer_logprobs: torch.Tensor,
    trainer_logprobs_at_gen_version: torch.Tensor,
    gen_logprobs: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token (total, precision, staleness) in float64, for all tokens (no masking).

    total     = t_cur - gen      what the loss sees (current trainer weights vs generator)
    precision = t_old - gen      same weight version on both sides: pure numerics
    staleness = t_cur - t_old    same numerics (trainer), different weights: pure policy lag
    total = staleness + precision is an identity of real numbers; in float64 each of the three
    differences of fp32 inputs is exact unless their exponents are ~29 binades apart, so the identity
    holds bitwise for practical logprobs and to float64 rounding (2^-53 relative) always.
    """
    f64 = torch.float64
    t_cur = trainer_logprobs.detach().to(f64)
    t_old = trainer_logprobs_at_gen_version.detach().to(f64)
    gen = gen_logprobs.detach().to(f64)
    return t_cur - gen, t_old - gen, t_cur - t_old


def mismatch_decomposition(
    trainer_logprobs: torch.Tensor,
    trainer_logprobs_at_gen_version: torch.Tensor,
    gen_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    global_valid_tokens: int | float | torch.Tensor | None = None,
    unmixed: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Split the mismatch the loss sees into numerics and staleness (not in the published metrics).

    trainer_logprobs:                 trainer logprobs under the CURRENT weights (what the loss uses).
    trainer_logprobs_at_gen_version:  trainer logprobs recomputed under, for each token, the weight
                                      version that generated it (Sample.gen_version; build it from one
                                      forward per version with `gather_by_version`).
    Returns float64 0-dim tensors:
      bit_wise/logprob_diff/{abs_mean, mean}                      total (identical to mismatch_metrics)
      bit_wise/logprob_diff/{precision_abs_mean, precision_mean}  t_old - gen
      bit_wise/logprob_diff/{staleness_abs_mean, staleness_mean}  t_cur - t_old
    Signed: mean = precision_mean + staleness_mean, up to the float64 rounding of the three sums
    (token by token the parts add up exactly, see decompose_logprob_diff). Absolute: only the triangle
    inequality abs_mean <= precision_abs_mean + staleness_abs_mean holds; parts can cancel.

    Caveat for samples that span a hot swap: the generator decoded the later tokens from a cache filled
    under the older weights, while t_old recomputes the whole prefix under the token's version. That
    cache-mixing effect lands in the precision part. `unmixed` (bool per token: its sample never sampled
    from such a cache, Sample.mixed_versions False) gives the pure numerics number besides:
      bit_wise/logprob_diff/precision_unmixed_abs_mean  |t_old - gen| over valid tokens of unmixed samples
                                                         (absent when there are none)
      bit_wise/unmixed_token_fraction                    their share of the valid tokens
    With batch-invariant numerics the first is exactly 0 at every step, swaps or not.
    """
    valid = valid_token_mask(loss_mask, gen_logprobs)
    _check_finite_on(valid, trainer_logprobs, "trainer_logprobs")
    _check_finite_on(valid, trainer_logprobs_at_gen_version, "trainer_logprobs_at_gen_version")
    f64 = torch.float64
    zero = torch.zeros((), dtype=f64, device=valid.device)
    n = denominator(global_valid_tokens, valid, f64)

    out: dict[str, torch.Tensor] = {}
    parts = decompose_logprob_diff(trainer_logprobs, trainer_logprobs_at_gen_version, gen_logprobs)
    for name, d in zip(("", "precision_", "staleness_"), parts, strict=True):
        d = torch.where(valid, d, zero)
        out[f"{_P}{name}abs_mean"] = d.abs().sum() / n
        out[f"{_P}{name}mean"] = d.sum() / n
    if unmixed is not None:
        pure = valid & unmixed.to(valid.device, torch.bool)
        n_pure = pure.sum().to(f64)
        out["bit_wise/unmixed_token_fraction"] = n_pure / valid.sum().clamp(min=1).to(f64)
        if bool(n_pure > 0):
            out[f"{_P}precision_unmixed_abs_mean"] = torch.where(pure, parts[1], zero).abs().sum() / n_pure
    return out


def gather_by_version(
    logprobs_by_version: Mapping[int, torch.Tensor],
    gen_version: torch.Tensor,
    loss_mask: torch.Tensor,
) -> torch.Tensor:
    """Assemble per-token trainer logprobs at each token's generating version.

    logprobs_by_version[v]: trainer logprobs of the whole (packed) batch under weight version v, aligned
    with gen_version. Token i takes logprobs_by_version[gen_version[i]][i]. Tokens outside the loss mask
    get NaN. Raises if a trained token's version is missing.
    """
    out = torch.full(gen_version.shape, float("nan"), dtype=torch.float32, device=gen_version.device)
    trained = loss_mask != 0
    needed = set(torch.unique(gen_version[trained]).tolist())
    missing = needed - set(logprobs_by_version)
    if missing:
        raise KeyError(f"no trainer logprobs for weight version(s) {sorted(missing)}")
    for v in needed:
        sel = trained & (gen_version == v)
        src = logprobs_by_version[v]
        if src.shape != gen_version.shape:
            raise ValueError(f"logprobs for version {v} have shape {tuple(src.shape)}")
        out[sel] = src[sel].detach().to(torch.float32)
    return out


def policy_age_metrics(groups: Sequence[Group], consumer_version: int) -> dict[str, float]:
    """Policy age of a training batch consumed by weight version `consumer_version`.

    Computed on the whole batch by the controller (before any data-parallel split), so no reduction.
    train_batch/policy_age             mean over SAMPLES of consumer_version - sample.min_admission_version
                                       (every sample weighs the same, like the batch-level reward mean;
                                       groups of unequal size are weighted by their sample count).
    train_batch/policy_age_max         max over samples = max group age, the quantity the offpolicy-N drop
                                       rule bounds: after dropping it is <= N.
    train_batch/policy_age_token_mean  mean over trained tokens of consumer_version - gen_version: how stale
                                       the weights that actually produced the tokens are. Lower than
                                       policy_age when hot swaps refreshed tokens mid-sequence.
    """
    sample_ages: list[int] = []
    token_age_sum, token_count = 0, 0
    for g in groups:
        for s in g.samples:
            sample_ages.append(consumer_version - s.min_admission_version)
            trained = s.loss_mask.bool()
            token_ages = consumer_version - s.gen_version[trained]
            # Weights newer than the consumer cannot exist yet: a negative age is a stamping bug.
            if sample_ages[-1] < 0 or bool((token_ages < 0).any()):
                raise ValueError(f"group {g.prompt_id!r} has versions newer than consumer {consumer_version}")
            token_age_sum += int(token_ages.sum())
            token_count += int(trained.sum())
    if not sample_ages:
        return {
            "train_batch/policy_age": 0.0,
            "train_batch/policy_age_max": 0.0,
            "train_batch/policy_age_token_mean": 0.0,
        }
    return {
        "train_batch/policy_age": sum(sample_ages) / len(sample_ages),
        "train_batch/policy_age_max": float(max(sample_ages)),
        "train_batch/policy_age_token_mean": token_age_sum / token_count if token_count else 0.0,
    }


def rollout_metrics(groups: Sequence[Group]) -> dict[str, float]:
    """How a batch's rollouts went (multi-turn episodes), means over samples:
    rollout/turns_mean                      model turns per sample
    rollout/tool_tokens_mean                tool / observation tokens per sample (masked from the loss)
    rollout/truncated_fraction              samples truncated (reward 0): turn limit or context cap
    rollout/truncated_max_turns_fraction    ... by the turn limit
    rollout/truncated_max_context_fraction  ... by the context cap
    """
    samples = [s for g in groups for s in g.samples]
    n = max(len(samples), 1)
    return {
        "rollout/turns_mean": sum(len(s.turns) for s in samples) / n,
        "rollout/tool_tokens_mean": sum(s.num_tool_tokens for s in samples) / n,
        "rollout/truncated_fraction": sum(s.finish != "done" for s in samples) / n,
        "rollout/truncated_max_turns_fraction": sum(s.finish == "max_turns" for s in samples) / n,
        "rollout/truncated_max_context_fraction": sum(s.finish == "max_context" for s in samples) / n,
    }
