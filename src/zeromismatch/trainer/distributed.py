"""Data-parallel training with FSDP2, built on torch.distributed primitives only (docs/distributed.md).

    info = init_distributed()                  # torchrun env; gloo on CPU, nccl on CUDA (NCCL pinned first)
    model = apply_fsdp(build_model(...))       # FSDP2 per decoder layer + root, BEFORE the optimizer exists
    trainer = Trainer(model, ...)              # every rank passes the SAME full Batch to train_step;
    metrics = trainer.train_step(batch)        # the trainer shards samples itself (shard_batch) and gathers
    weights = full_state_dict(model)           # collective: every rank calls; full tensors for the generator

Parity contract (single process vs W ranks, tests/distributed/test_fsdp_cpu.py):
- Samples are packed into microbatches exactly as in one process (scoring.microbatches over the whole
  batch); rank r takes a contiguous block of those microbatches. Each microbatch's forward/backward is
  therefore the same computation on the same tensors as in one process.
- The loss is (local token sum) / (global valid tokens) and is scaled by W because FSDP averages gradients:
  a microbatch's gradient on a rank is exactly W * g (power-of-two W: scaling is exact), and the reduce
  computes (W*g_a + W*g_b) / W. For W = 2 with one microbatch per rank that is fl(g_a + g_b), bit for bit what
  one process accumulates over its two microbatches. With more microbatches per rank (or W > 2) the gradient
  sum is re-associated: equal up to fp32 rounding of the summation order, not bitwise.
- AdamW is elementwise: identical gradients give identical shards of the update.
- Grad clipping: `clip_grad_norm_(..., exact=True)` all-gathers the gradients and calls the very
  torch routine the single process calls on the same full tensors -> identical norm and coefficient. The
  fast path (exact=False) reduces DTensor partial norms: equal up to the summation order of the norm.
- Metrics: trainer logprobs of every token are all-gathered (4 bytes/token) and all metrics are computed on
  the full batch exactly as in one process; per-microbatch loss stats are gathered in global microbatch
  order and summed in that order. `reduce_metrics` (sum / max all-reduce of partial means) is the cheaper
  alternative for callers that do not need bitwise-equal logs.
"""

from __future__ import annotations

import datetime
import os
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from ..models.qwen3_5.model import Qwen35ForCausalLM
from ..rl.metrics import MAX_REDUCED_KEYS
from ..rl.offpolicy import Batch
from .parallelize import parallelize_generic, parallelize_qwen3_5
from .scoring import microbatches

__all__ = [
    "NCCL_INVARIANCE_ENV",
    "DistInfo",
    "apply_nccl_invariance_env",
    "init_distributed",
    "destroy_distributed",
    "apply_fsdp",
    "is_fsdp",
    "dp_rank_world",
    "reshard",
    "assign_contiguous",
    "shard_batch",
    "plan_microbatches",
    "gather_cat",
    "all_gather_objects",
    "reduce_metrics",
    "clip_grad_norm_",
    "full_state_dict",
]

# Collectives pinned for run-to-run and shape invariance (the settings of the published batch-invariant
# stack), set before the process group starts (NCCL reads them when communicators are created).
NCCL_INVARIANCE_ENV: dict[str, str] = {
    "NCCL_LAUNCH_MODE": "GROUP",
    "NCCL_COLLNET_ENABLE": "0",
    "NCCL_NVLS_ENABLE": "0",
    "NCCL_P2P_NET_DISABLE": "1",
    "NCCL_MIN_NCHANNELS": "1",
    "NCCL_MAX_NCHANNELS": "1",
    "NCCL_PROTO": "Simple",
    "NCCL_ALGO": "allreduce:tree",
    "NCCL_NTHREADS": "1",
}


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    backend: str | None  # None: single process, no process group
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def apply_nccl_invariance_env(environ=None) -> dict[str, str]:
    """Set the NCCL_INVARIANCE_ENV variables that the user has not set; returns the effective values.
    A user value that differs from ours is kept (with a warning): the user asked for it explicitly."""
    env = os.environ if environ is None else environ
    for k, v in NCCL_INVARIANCE_ENV.items():
        if k not in env:
            env[k] = v
        elif env[k] != v:
            warnings.warn(f"{k}={env[k]} set by the user (invariance setting is {v}): collectives may not be invariant")
    return {k: env[k] for k in NCCL_INVARIANCE_ENV}


def init_distributed(backend: str | None = None, *, timeout_s: float = 600.0) -> DistInfo:
    """Start the default process group from the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR, MASTER_PORT). Without WORLD_SIZE (plain `python`), returns a single-process DistInfo and
    starts nothing. backend: None -> "nccl" when CUDA is available, else "gloo". With nccl, the NCCL
    invariance variables are set BEFORE the process group is created and the local GPU is selected."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    use_cuda = "nccl" in backend
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if dist.is_available() and dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, dist.get_backend(), device)
    if "WORLD_SIZE" not in os.environ:
        return DistInfo(0, 1, 0, None, device)
    if use_cuda:
        apply_nccl_invariance_env()
        torch.cuda.set_device(local_rank)
    kw = {"device_id": device} if use_cuda else {}
    dist.init_process_group(
        backend=backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s), **kw
    )
    return DistInfo(rank, world, local_rank, backend, device)


def destroy_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


# ------------------------------------------------------------------------------------------- FSDP2


def apply_fsdp(model: nn.Module, mesh=None, reshard_after_forward: bool = True, mp_policy=None) -> nn.Module:
    """Wrap `model` with FSDP2 (torch.distributed.fsdp.fully_shard): per decoder layer + root for the
    Qwen3.5 family (parallelize.parallelize_qwen3_5), one unit otherwise. mesh=None: a 1-D mesh over the
    default process group. Call BEFORE creating the optimizer (parameters become DTensors). Every rank must
    hold the same initial weights (same seed / checkpoint): fully_shard keeps each rank's own slice.

    No mixed-precision policy by default: parameters, gradients and the reduce run in the parameter dtype,
    which is what makes the single-process comparison exact."""
    if mesh is None:
        device_type = next(model.parameters()).device.type
        if device_type == "meta":  # meta-initialized model: materialize after wrapping (to_empty + init)
            device_type = "cuda" if torch.cuda.is_available() else "cpu"
        mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    if isinstance(model, Qwen35ForCausalLM):
        return parallelize_qwen3_5(model, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy)
    return parallelize_generic(model, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy)


def is_fsdp(model: nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def _first_dtensor(model: nn.Module):
    for p in model.parameters():
        if isinstance(p, DTensor):
            return p
    return None


def dp_rank_world(model: nn.Module) -> tuple[int, int]:
    """(rank, world) of the data-parallel (FSDP) mesh the model is sharded over; (0, 1) when the model is
    not FSDP-wrapped (a process group alone does not make the trainer shard: only FSDP averages grads)."""
    if not is_fsdp(model):
        return 0, 1
    p = _first_dtensor(model)
    if p is None:  # every unit gathered (registered as plain tensors): put the sharded DTensors back
        reshard(model)
        p = _first_dtensor(model)
    mesh = p.device_mesh
    if mesh.ndim != 1 or mesh.size() != dist.get_world_size():
        raise NotImplementedError("data parallel over a 1-D mesh spanning the whole world only (no TP/PP/HSDP)")
    return mesh.get_local_rank(), mesh.size()


def reshard(model: nn.Module) -> None:
    """Put every FSDP unit back in its sharded state (no-op without FSDP). Needed after no-grad forwards:
    FSDP2 leaves the root unit (and units built with reshard_after_forward=False) gathered after forward,
    waiting for a backward that never comes; state_dict / load_state_dict need the sharded parameters."""
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


# ------------------------------------------------------------------------------------------- data


def assign_contiguous(n_units: int, rank: int, world: int) -> range:
    """Units [rank*n//world, (rank+1)*n//world): contiguous, in order, sizes differ by at most one, the same
    answer on every rank. n_units == world gives rank r exactly unit r."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside world {world}")
    return range(rank * n_units // world, (rank + 1) * n_units // world)


def plan_microbatches(samples, max_tokens: int, rank: int, world: int) -> tuple[list[list[int]], int]:
    """The single-process microbatches (scoring.microbatches over ALL samples; indices into `samples`),
    the contiguous block of them that `rank` runs, and the number of forward/backward iterations every rank
    must run (the largest block: FSDP collectives must line up, so shorter ranks pad with no-op microbatches)."""
    mbs = microbatches(samples, max_tokens)
    local = [mbs[i] for i in assign_contiguous(len(mbs), rank, world)]
    steps = max(len(assign_contiguous(len(mbs), r, world)) for r in range(world))
    return local, steps


def shard_batch(samples_or_groups, rank: int, world: int, *, max_tokens: int | None = None):
    """The contiguous share of `rank` of a list of Samples, a list of Groups, or a Batch (its groups).

    max_tokens=None: items are split by count (assign_contiguous). With max_tokens (Samples only), the items
    are first packed into the single-process microbatches and whole microbatches are assigned, so rank r
    gets exactly microbatch r when there are `world` microbatches. Deterministic, no communication.
    Note: the Trainer shards SAMPLES after computing group advantages on the whole batch (every rank passes
    the full batch); splitting Groups is for callers that want per-rank batches with whole groups."""
    if isinstance(samples_or_groups, Batch):
        b = samples_or_groups
        return Batch(step=b.step, groups=shard_batch(b.groups, rank, world), stats=dict(b.stats))
    items = list(samples_or_groups)
    if max_tokens is None:
        return [items[i] for i in assign_contiguous(len(items), rank, world)]
    local, _ = plan_microbatches(items, max_tokens, rank, world)
    return [items[i] for mb in local for i in mb]


# ------------------------------------------------------------------------------------- collectives


def all_gather_objects(obj, group=None) -> list:
    """Python objects of every rank, in rank order."""
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def gather_cat(t: torch.Tensor, group=None) -> torch.Tensor:
    """Concatenate a 1-D tensor of varying length from every rank, in rank order (all ranks get the result).
    Values travel unchanged (no arithmetic), so the result is bitwise the ranks' tensors."""
    world = dist.get_world_size(group)
    n = torch.tensor([t.numel()], dtype=torch.int64, device=t.device)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n, group=group)
    sizes = [int(s) for s in sizes]
    m = max(sizes)
    padded = torch.zeros(m, dtype=t.dtype, device=t.device)
    padded[: t.numel()] = t
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([p[:s] for p, s in zip(parts, sizes)])


def reduce_metrics(metrics: dict[str, float], group=None, max_keys=MAX_REDUCED_KEYS) -> dict[str, float]:
    """All-reduce per-rank metrics that are PARTIAL means (local sum / global count, rl.masking): SUM for
    every key except `max_keys` (local maxima, MAX). Keys must be the same on every rank. In float64: equal
    to the single-process value up to the summation order of the partial sums (not bitwise in general; the
    Trainer gathers logprobs instead when bitwise logs matter)."""
    keys = sorted(metrics)
    if not keys:
        return {}
    dev = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else torch.device("cpu")
    sum_keys = [k for k in keys if k not in max_keys]
    mx_keys = [k for k in keys if k in max_keys]
    out = {}
    for ks, op in ((sum_keys, dist.ReduceOp.SUM), (mx_keys, dist.ReduceOp.MAX)):
        if not ks:
            continue
        t = torch.tensor([float(metrics[k]) for k in ks], dtype=torch.float64, device=dev)
        dist.all_reduce(t, op=op, group=group)
        out.update({k: float(v) for k, v in zip(ks, t.tolist())})
    return out


# ------------------------------------------------------------------------------------ grads, weights


@torch.no_grad()
def clip_grad_norm_(parameters, max_norm: float, *, exact: bool = True, norm_type: float = 2.0) -> torch.Tensor:
    """Global-norm gradient clipping for plain or FSDP (DTensor) gradients; returns the total norm (plain
    0-dim tensor, the same value on every rank).

    Plain gradients: exactly torch.nn.utils.clip_grad_norm_ (the single-process path, unchanged).
    DTensor gradients, exact=True: all-gather every gradient (.full_tensor()), call the same
    torch.nn.utils.get_total_norm on the same full tensors as one process would -> bitwise the same norm
    and clip coefficient, which then scales each rank's local shard. Costs one all-gather of the gradients
    and a transient full fp32 gradient copy per rank (fine for the tiny/mid presets; use exact=False at 9B).
    DTensor gradients, exact=False: DTensor partial norms reduced across ranks (torchtitan's way); the norm
    differs from the single-process one by the summation order (~1 ulp), and so does a clipped update."""
    params = [p for p in parameters if p.grad is not None]
    grads = [p.grad for p in params]
    if not any(isinstance(g, DTensor) for g in grads):
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)
    if exact:
        full = [g.full_tensor() if isinstance(g, DTensor) else g for g in grads]
        total = torch.nn.utils.get_total_norm(full, norm_type)
        del full
    else:
        total = torch.nn.utils.get_total_norm(grads, norm_type)
        if isinstance(total, DTensor):
            total = total.full_tensor()
    # same coefficient arithmetic as torch's _clip_grads_with_norm_; elementwise multiply of local shards
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        local = g.to_local() if isinstance(g, DTensor) else g
        local.mul_(coef.to(local.device))
    return total


@torch.no_grad()
def full_state_dict(model: nn.Module, *, to_cpu: bool = False) -> dict[str, torch.Tensor]:
    """Full (unsharded) weights under the usual state_dict keys, e.g. to push to the generator.
    COLLECTIVE under FSDP (every rank must call, in the same order): each DTensor is all-gathered with
    .full_tensor(). Without FSDP: detached clones. Gathering moves bits only, so the result equals the
    single-process weights bitwise."""
    reshard(model)
    out = {}
    for k, v in model.state_dict().items():
        t = v.full_tensor() if isinstance(v, DTensor) else v.detach().clone()
        out[k] = t.cpu() if to_cpu else t
    return out
