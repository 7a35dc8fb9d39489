"""The RL trainer: one optimizer step per batch of groups.

    metrics = trainer.train_step(batch)   # batch: rl.offpolicy.Batch

Per step: group advantages (zero-spread groups dropped) -> samples packed into microbatches by token
budget -> varlen forward (cu_seqlens reach every GDN call) -> token logprobs (the one op shared with the
generator) -> policy loss normalized by the GLOBAL valid-token count -> backward, accumulate -> clip ->
AdamW step. The forward's logprobs double as the mismatch metrics' trainer side; with `staleness_split`
the batch is rescored under each generating version's weights to split the gap into precision (numerics)
and staleness (lag).

Data parallel (FSDP2, trainer/distributed.py): every rank passes the SAME full batch; advantages and batch
metrics are computed on the whole batch, the single-process microbatches are assigned to ranks in
contiguous blocks, and trainer logprobs are all-gathered so that every logged metric is computed exactly as
in one process. Without an FSDP-wrapped model the trainer runs single-process, whatever process group exists.
"""

from __future__ import annotations

import time
from collections import OrderedDict

import torch

from ..rl.advantages import compute_group_advantages
from ..rl.losses import LossConfig, policy_loss
from ..rl.masking import count_valid_tokens
from ..rl.metrics import gather_by_version, mismatch_decomposition, mismatch_metrics
from ..rl.offpolicy import Batch
from ..rl.types import Sample
from .distributed import all_gather_objects, clip_grad_norm_, dp_rank_world, full_state_dict, gather_cat, plan_microbatches, reshard
from .scoring import next_token_logprobs


def aligned_logprobs(model, samples: list[Sample], tap=None, temperature: float | None = None) -> list[torch.Tensor]:
    """Trainer logprobs aligned with each sample's token_ids (entry 0, which has no context, is NaN)."""
    lps = next_token_logprobs(model, [s.token_ids.tolist() for s in samples], tap=tap, temperature=temperature)
    return [torch.cat([lp.new_full((1,), float("nan")), lp]) for lp in lps]


class Trainer:
    def __init__(
        self,
        model,
        *,
        lr: float = 1e-6,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        grad_clip: float | None = 1.0,
        loss: LossConfig,
        microbatch_tokens: int = 8192,
        normalize_adv_std: bool = False,
        drop_zero_spread: bool = True,
        staleness_split: bool = True,
        history: int = 5,
        version: int = 0,
        exact_grad_norm: bool = True,
        logprob_temperature: float = 1.0,
    ):
        self.model = model
        # the rollouts' sampling temperature: the loss (and the mismatch metrics) use logprobs of logits / T,
        # the distribution the tokens were drawn from, as the generator returns them (ops/logprob.py); 1 = raw
        self.logprob_temperature = None if logprob_temperature == 1.0 else float(logprob_temperature)
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay)
        self.grad_clip = grad_clip
        self.exact_grad_norm = exact_grad_norm  # FSDP only: gather grads for a bitwise single-process norm
        self.loss_cfg = loss
        self.microbatch_tokens = microbatch_tokens
        self.normalize_adv_std = normalize_adv_std
        self.drop_zero_spread = drop_zero_spread  # all-correct / all-wrong groups leave the batch (the recipes)
        self.staleness_split = staleness_split
        self.version = version  # weights after `version` optimizer steps
        # weights of recent versions, to rescore tokens under the version that generated them
        self.history: OrderedDict[int, dict[str, torch.Tensor]] = OrderedDict()
        self.history_size = history
        if staleness_split:
            self._remember()

    # ----------------------------------------------------------------------------------------- step
    def train_step(self, batch: Batch) -> dict[str, float]:
        t0 = time.perf_counter()
        groups, advs, counts = compute_group_advantages(
            batch.groups, normalize_std=self.normalize_adv_std, drop_zero_spread=self.drop_zero_spread)
        metrics: dict[str, float] = {f"train_batch/{k}": float(v) for k, v in counts.as_dict().items()}
        metrics.update({k: float(v) for k, v in batch.stats.items()})
        all_groups_rewards = torch.cat([g.rewards for g in batch.groups])
        metrics["rollout_reward/avg_train_reward/mean"] = float(all_groups_rewards.mean())
        samples = [s for g in groups for s in g.samples]
        if not samples:
            metrics["train/skipped_no_signal"] = 1.0
            self.version += 1  # a step is still a step: versions stay aligned with the controller
            self._remember()
            return metrics

        # Samples live on the CPU (rl/types.py); everything the loss and the metrics combine with the trainer's
        # logprobs moves to the model's device once, here
        device = self._device()
        sample_adv = torch.cat(advs).to(device)
        loss_mask = [s.loss_mask.to(device) for s in samples]
        gen_lp = [s.gen_logprobs.to(device) for s in samples]
        # every rank holds the whole batch, so this is already the global count (no all-reduce needed)
        n_valid = count_valid_tokens(torch.cat(loss_mask), torch.cat(gen_lp)).to(torch.float64)
        rank, world = dp_rank_world(self.model)
        # the single-process microbatches; this rank runs a contiguous block of them, every rank n_iter times
        local_mbs, n_iter = plan_microbatches(samples, self.microbatch_tokens, rank, world)
        self.opt.zero_grad(set_to_none=True)
        trainer_lp: list[torch.Tensor | None] = [None] * len(samples)
        mb_losses, mb_stats = [], []
        t_fwd = time.perf_counter()
        for j in range(n_iter):
            if j >= len(local_mbs):
                self._noop_microbatch(samples, world, backward=True)  # keeps FSDP collectives aligned
                continue
            mb = local_mbs[j]
            lps = aligned_logprobs(self.model, [samples[i] for i in mb], temperature=self.logprob_temperature)
            adv = torch.cat([sample_adv[i].expand(samples[i].token_ids.numel()) for i in mb])
            loss, stats = policy_loss(
                torch.cat(lps),
                torch.cat([gen_lp[i] for i in mb]),
                adv,
                torch.cat([loss_mask[i] for i in mb]),
                global_valid_tokens=n_valid,
                config=self.loss_cfg,
            )
            # FSDP averages gradients over ranks; the loss is a global sum / global count: scale back
            (loss * world).backward()
            mb_losses.append(float(loss.detach()))
            mb_stats.append({k: float(v) for k, v in stats.items()})
            for i, lp in zip(mb, lps):
                trainer_lp[i] = lp.detach()
        t_fwd_bwd = time.perf_counter() - t_fwd
        if self.grad_clip:
            # plain grads: torch.nn.utils.clip_grad_norm_; DTensor grads: see distributed.py
            gnorm = clip_grad_norm_(self.model.parameters(), self.grad_clip, exact=self.exact_grad_norm)
            metrics["train/grad_norm"] = float(gnorm)
        self.opt.step()
        self.version += 1

        if world > 1:
            # per-microbatch values in global microbatch order (ranks hold contiguous blocks, in rank order),
            # and every token's trainer logprob: the metrics below are then the single-process computation
            mb_losses = [x for part in all_gather_objects(mb_losses) for x in part]
            mb_stats = [x for part in all_gather_objects(mb_stats) for x in part]
            t_cur = gather_cat(self._local_cat(trainer_lp, local_mbs))
        else:
            t_cur = torch.cat(trainer_lp)
        loss_total, stats_acc = 0.0, {}
        for loss_mb, stats in zip(mb_losses, mb_stats):
            loss_total += loss_mb
            for k, v in stats.items():
                stats_acc.setdefault(k, []).append(v)
        gen_all, mask_all = torch.cat(gen_lp), torch.cat(loss_mask)
        metrics["train/loss"] = loss_total
        # loss stats are partial sums over the global valid-token count (valid_tokens: a count): add them up
        metrics.update({f"train/{k}": sum(v) for k, v in stats_acc.items()})
        metrics.update({k: float(v) for k, v in mismatch_metrics(t_cur, gen_all, mask_all).items()})
        if self.staleness_split:
            metrics.update(self._decompose(samples, t_cur, gen_all, mask_all))
        self._remember()
        n_tokens = float(mask_all.sum())
        metrics["perf/trainer/tokens_per_second_fwd_bwd"] = n_tokens / max(t_fwd_bwd, 1e-9)
        metrics["perf/trainer/step_seconds"] = time.perf_counter() - t0
        metrics["train_batch/response_tokens"] = n_tokens
        return metrics

    # ----------------------------------------------------------------------------- staleness split
    @torch.no_grad()
    def _decompose(self, samples, t_cur, gen_all, mask_all) -> dict[str, float]:
        versions = torch.cat([s.gen_version for s in samples]).to(mask_all.device)
        needed = set(torch.unique(versions[mask_all.bool()]).tolist())
        pre_step = self.version - 1  # t_cur was computed with the weights before this step's update
        if not needed <= self.history.keys() | {pre_step}:
            return {}  # a version older than the kept history: skip the split this step
        by_version = {pre_step: t_cur}
        # Each older version rescores only the samples that hold a trained token of it (one forward over the
        # batch in all, not one per version); the other positions stay NaN and are never read.
        bounds = torch.tensor([0] + [s.loss_mask.numel() for s in samples]).cumsum(0).tolist()
        for v in sorted(needed - {pre_step}):
            holds = [i for i, s in enumerate(samples) if bool(((s.gen_version == v) & (s.loss_mask != 0)).any())]
            part = self._rescore([samples[i] for i in holds], self.history[v])
            full = torch.full_like(t_cur, float("nan"))
            for i, piece in zip(holds, part.split([bounds[i + 1] - bounds[i] for i in holds])):
                full[bounds[i]:bounds[i + 1]] = piece
            by_version[v] = full
        t_old = gather_by_version(by_version, versions, mask_all)
        flags = [s.mixed_versions for s in samples]  # None: the generator could not tell (vLLM)
        unmixed = None if None in flags else torch.cat(
            [torch.full((s.loss_mask.numel(),), not f, dtype=torch.bool) for s, f in zip(samples, flags)])
        parts = mismatch_decomposition(t_cur, t_old, gen_all, mask_all, unmixed=unmixed)
        return {k: float(v) for k, v in parts.items()}

    def _rescore(self, samples, weights) -> torch.Tensor:
        # Under FSDP `weights` is a sharded (DTensor) state dict: each rank keeps 1/world of the history.
        reshard(self.model)
        current = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.model.load_state_dict(weights)
        try:
            rank, world = dp_rank_world(self.model)
            local_mbs, n_iter = plan_microbatches(samples, self.microbatch_tokens, rank, world)
            out: list[torch.Tensor | None] = [None] * len(samples)
            for j in range(n_iter):
                if j >= len(local_mbs):
                    self._noop_microbatch(samples, world, backward=False)
                    continue
                mb = local_mbs[j]
                lps = aligned_logprobs(self.model, [samples[i] for i in mb], temperature=self.logprob_temperature)
                for i, lp in zip(mb, lps):
                    out[i] = lp
            return gather_cat(self._local_cat(out, local_mbs)) if world > 1 else torch.cat(out)
        finally:
            reshard(self.model)  # no-grad forwards leave FSDP units gathered
            self.model.load_state_dict(current)

    # ------------------------------------------------------------------------------ data parallel
    def _local_cat(self, per_sample: list, local_mbs: list[list[int]]) -> torch.Tensor:
        """This rank's per-token tensors, in global sample order (its samples are one contiguous block)."""
        parts = [per_sample[i] for mb in local_mbs for i in mb]
        if parts:
            return torch.cat(parts)
        return torch.zeros(0, dtype=torch.float32, device=self._device())

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _noop_microbatch(self, samples, world: int, backward: bool) -> None:
        """A rank with fewer microbatches than others still runs the forward (and backward) so that the FSDP
        all-gathers / reduce-scatters line up; its loss is multiplied by 0, so it adds exact zeros to the
        gradient sum (only the sign of a zero can change, which AdamW's update ignores)."""
        s = min(samples, key=lambda x: x.token_ids.numel())
        lp = next_token_logprobs(self.model, [s.token_ids.tolist()])[0]
        if backward:
            (lp.sum() * 0.0 * world).backward()

    def _remember(self) -> None:
        if not self.staleness_split:
            return
        reshard(self.model)
        self.history[self.version] = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        while len(self.history) > self.history_size:
            self.history.popitem(last=False)

    # ------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "version": self.version,
            "history": dict(self.history),
        }

    def load_state_dict(self, sd: dict) -> None:
        self.model.load_state_dict(sd["model"])
        self.opt.load_state_dict(sd["optimizer"])
        self.version = sd["version"]
        device = self._device()  # a checkpoint is loaded on the CPU (orchestration/checkpoint.py)
        self.history = OrderedDict((v, {k: t.to(device) for k, t in w.items()}) for v, w in sorted(sd["history"].items()))

    def weights(self) -> dict[str, torch.Tensor]:
        """A detached copy of the current (full) weights, for the generator. Under FSDP this is a collective
        (every rank must call it): DTensor shards are all-gathered (distributed.full_state_dict)."""
        return full_state_dict(self.model)
