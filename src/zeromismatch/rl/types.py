"""Rollout containers: what the generator hands the trainer.

Conventions (every per-token tensor of a Sample follows them):
- Per-token tensors are 1-D, aligned with `token_ids`: entry i describes token_ids[i], e.g.
  gen_logprobs[i] = log p_gen(token_ids[i] | token_ids[:i]). Entries of prompt and tool tokens
  are never read (loss_mask is 0 there); by convention they hold NaN (logprob) and -1 (version).
- A weight version v is the trainer state after v optimizer steps; version 0 is the initial weights.
- Samples live on the CPU whatever device generated them: they cross threads, processes (pickled over gloo)
  and checkpoints, and the trainer moves what it computes with to its model's device.

Validation is strict on purpose: a dtype silently changed or a mask that covers the prompt would
show up later only as an unexplained logprob mismatch, which is exactly what this project measures.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["FINISH", "Turn", "Sample", "Group"]

FINISH = ("done", "max_turns", "max_context")  # Sample.finish values


@dataclass(frozen=True)
class Turn:
    """Tokens produced by one generator call (one assistant turn).

    admission_version: generator weight version when the turn was admitted (started). Weights may be
    hot-swapped while the turn decodes, so its tokens can come from later versions (see
    Sample.gen_version); the off-policy age uses the admission version, the oldest one.
    mixed_versions: some token was sampled from a cache partly computed by older weights (a hot swap that
    kept the cache), so no single weight version reproduces it; None when the generator cannot tell.
    """

    tokens: tuple[int, ...]
    admission_version: int
    mixed_versions: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", tuple(int(t) for t in self.tokens))
        if self.admission_version < 0:
            raise ValueError(f"admission_version must be >= 0, got {self.admission_version}")


def _as_1d(x, dtype: torch.dtype, name: str) -> torch.Tensor:
    """Lists are converted; tensors must already have `dtype` (integer/bool -> int64 is allowed: lossless)
    and are copied to the CPU (exact) if they live elsewhere.

    A float64 tensor passed as gen_logprobs would be rounded to fp32 here without anyone noticing,
    so tensors of another dtype are refused instead of cast. Python floats from a generator are fp32
    values widened to double, so converting a list back to fp32 is exact.
    """
    if isinstance(x, torch.Tensor):
        lossless = dtype == torch.int64 and (x.dtype == torch.bool or not x.dtype.is_floating_point)
        if x.dtype != dtype and not lossless:
            raise TypeError(f"{name} must be {dtype}, got {x.dtype}")
        t = x.to(device="cpu", dtype=dtype)
    else:
        t = torch.tensor(list(x), dtype=dtype)
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    return t


@dataclass
class Sample:
    """One rollout (one response to a prompt), possibly multi-turn with tool output in between.

    prompt_ids:   prompt token ids; a prefix of token_ids.
    token_ids:    full sequence: prompt + generated tokens + tool/observation tokens, int64.
    loss_mask:    int64 0/1 per token; 1 = generated token trained on, 0 = prompt/tool tokens.
                  Generated tokens may also be 0 (e.g. an overlong response masked out).
    gen_logprobs: float32 per token, the generator's logprob of that token: raw (untempered) at rl.temperature 1,
                  else of logits / rl.temperature (the distribution sampled; ops/logprob.py).
                  NaN/-inf mark tokens the generator could not score; losses and metrics drop them.
    gen_version:  int64 per token: weight version that produced the token. After a hot swap a
                  sequence mixes versions (the KV/state cache is kept and decoding continues).
    reward:       scalar reward of the whole sample.
    turns:        generator calls, in order; at least one.
    finish:       how the rollout ended: 'done' (the episode finished and was scored), or truncated and scored
                  0: 'max_turns' (turn limit reached without done), 'max_context' (no room for another turn).
    """

    prompt_ids: torch.Tensor
    token_ids: torch.Tensor
    loss_mask: torch.Tensor
    gen_logprobs: torch.Tensor
    gen_version: torch.Tensor
    reward: float
    turns: list[Turn]
    finish: str = "done"

    def __post_init__(self) -> None:
        self.prompt_ids = _as_1d(self.prompt_ids, torch.int64, "prompt_ids")
        self.token_ids = _as_1d(self.token_ids, torch.int64, "token_ids")
        self.loss_mask = _as_1d(self.loss_mask, torch.int64, "loss_mask")
        self.gen_logprobs = _as_1d(self.gen_logprobs, torch.float32, "gen_logprobs")
        self.gen_version = _as_1d(self.gen_version, torch.int64, "gen_version")
        self.reward = float(self.reward)
        self.turns = list(self.turns)

        n, p = self.token_ids.numel(), self.prompt_ids.numel()
        for name in ("loss_mask", "gen_logprobs", "gen_version"):
            if getattr(self, name).numel() != n:
                raise ValueError(f"{name} has {getattr(self, name).numel()} entries, token_ids has {n}")
        if p > n or not torch.equal(self.token_ids[:p], self.prompt_ids):
            raise ValueError("prompt_ids must be a prefix of token_ids")
        if not bool(((self.loss_mask == 0) | (self.loss_mask == 1)).all()):
            raise ValueError("loss_mask must hold only 0 and 1")
        if bool(self.loss_mask[:p].any()):
            raise ValueError("loss_mask must be 0 over the prompt")
        if self.finish not in FINISH:
            raise ValueError(f"finish must be one of {', '.join(FINISH)}, got {self.finish!r}")
        if not self.turns:
            raise ValueError("a sample needs at least one turn (the generator call that produced it)")
        # Every trained token was generated by some turn, and every generated token lies after the prompt.
        n_generated = sum(len(t.tokens) for t in self.turns)
        n_trained = int(self.loss_mask.sum())
        if not n_trained <= n_generated <= n - p:
            raise ValueError(
                f"inconsistent token counts: {n_trained} trained <= {n_generated} generated "
                f"<= {n - p} response tokens does not hold"
            )
        # Weights only move forward, so no trained token can predate the sample's first admission.
        trained = self.loss_mask.bool()
        if trained.any() and int(self.gen_version[trained].min()) < self.min_admission_version:
            raise ValueError("a trained token has gen_version older than the sample's first admission")

    @property
    def mixed_versions(self) -> bool | None:
        """Whether any turn sampled from a cache of mixed weight versions (None if a turn cannot tell)."""
        flags = [t.mixed_versions for t in self.turns]
        return None if None in flags else any(flags)

    @property
    def min_admission_version(self) -> int:
        return min(t.admission_version for t in self.turns)

    @property
    def num_trained_tokens(self) -> int:
        return int(self.loss_mask.sum())

    @property
    def num_tool_tokens(self) -> int:
        """Response tokens no turn generated (tool / observation output)."""
        return self.token_ids.numel() - self.prompt_ids.numel() - sum(len(t.tokens) for t in self.turns)


@dataclass
class Group:
    """All samples drawn for one prompt; the unit of advantage computation and of off-policy dropping."""

    prompt_id: str | int
    samples: list[Sample]

    def __post_init__(self) -> None:
        self.samples = list(self.samples)
        if not self.samples:
            raise ValueError("a group needs at least one sample")

    @property
    def min_admission_version(self) -> int:
        """Oldest admission version of any turn of any sample: what the off-policy age is measured from."""
        return min(s.min_admission_version for s in self.samples)

    @property
    def rewards(self) -> torch.Tensor:
        return torch.tensor([s.reward for s in self.samples], dtype=torch.float32)

    def __len__(self) -> int:
        return len(self.samples)
