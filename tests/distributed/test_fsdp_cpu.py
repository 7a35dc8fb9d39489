"""FSDP2 data parallel (2 gloo ranks on CPU) against the single-process trainer.

Why bitwise can hold (grad clipping off): with the loss scaled by world = 2, a rank's microbatch gradient is
exactly 2g (power-of-two scaling is exact), FSDP's reduce-scatter averages (2a + 2b) / 2 == fl(a + b), the
very sum one process accumulates over its two microbatches a, b (same microbatches: the trainer packs the
whole batch as one process would and gives rank r microbatch r); each forward/backward sees the same
tensors; AdamW is elementwise. Metrics: trainer logprobs are all-gathered and every metric is computed on
the full batch in the single-process order. Grad clipping keeps this only with the exact norm (gradients
all-gathered, the same torch routine on the same full tensors); the DTensor norm reduction sums the squares
in another order, so the norm and a clipped update differ by rounding: tolerances below.

One spawn runs every configuration (process start-up dominates on 2 shared cores); the references run in
this process with one thread, like the ranks. Runtime ~25-40 s.
"""

from __future__ import annotations

import math
import socket
import time
import warnings

import pytest
import torch
import torch.multiprocessing as mp

from zeromismatch.models.qwen3_5 import build_model
from zeromismatch.rl.offpolicy import Batch
from zeromismatch.trainer import distributed as D
from zeromismatch.trainer.fsdp_check import DEFAULTS, compare, run_single, spawn_worker, synthetic_batches
from zeromismatch.trainer.scoring import microbatches

WORLD = 2
LR = 1e-3  # fsdp_check's default
CONFIGS = {
    "noclip": dict(grad_clip=None),  # bitwise
    "clip_exact": dict(grad_clip=1e-3),  # clipping active (grad norm ~5), exact norm: bitwise
    "clip_fast": dict(grad_clip=1e-3, exact_grad_norm=False),  # DTensor norm: tolerance
    "two_mb_per_rank": dict(microbatch_tokens=16),  # 4 microbatches, 2 per rank: re-associated, tolerance
    "uneven": dict(groups=3),  # 3 microbatches: rank 0 runs 1 + a no-op microbatch, rank 1 runs 2
    "recompute": dict(activation_checkpointing=True),  # each layer run again in backward, inside FSDP's units
}
NAMES = list(CONFIGS)
# Tolerances for the non-bitwise configurations. AdamW divides by sqrt(v): a coordinate whose gradient
# nearly cancels carries a large RELATIVE rounding error into its update, so weight errors scale with lr, not
# with the gradient's rounding. Observed after 2-4 steps: max |dw| <= 2e-3 lr, 1e-4 of the coordinates
# above 1e-4 lr; logprob metrics <= 1e-6 abs; grad_norm ~3e-6 relative.
W_ATOL = 1e-2 * LR
W_FRAC_ABOVE_1E4_LR = 1e-3
M_ATOL, M_RTOL = 1e-6, 1e-4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    configs = [CONFIGS[n] for n in NAMES]
    ctx = mp.start_processes(
        spawn_worker, args=(WORLD, _free_port(), configs, str(out)), nprocs=WORLD, join=False, start_method="spawn"
    )
    n_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # the references run while the ranks start up
        refs = {n: run_single(CONFIGS[n]) for n in NAMES}
        deadline = time.monotonic() + 240
        while not ctx.join(timeout=2):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                pytest.fail("FSDP ranks did not finish in 240 s")
    finally:
        torch.set_num_threads(n_threads)
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    got = [{n: rk["results"][i] for i, n in enumerate(NAMES)} for rk in ranks]
    return refs, got, ranks


def _close(ref, got, w_atol=W_ATOL, m_atol=M_ATOL, m_rtol=M_RTOL):
    for a, b in zip(ref["metrics"], got["metrics"], strict=True):
        assert a.keys() == b.keys()
        for k in a:
            if math.isnan(a[k]):
                assert math.isnan(b[k]), k
            else:
                assert math.isclose(a[k], b[k], rel_tol=m_rtol, abs_tol=m_atol), (k, a[k], b[k])
    diffs = torch.cat([(v - got["weights"][k]).abs().flatten() for k, v in ref["weights"].items()])
    assert float(diffs.max()) <= w_atol, float(diffs.max())
    assert float((diffs > 1e-4 * LR).float().mean()) <= W_FRAC_ABOVE_1E4_LR


@pytest.mark.parametrize("name", NAMES)
def test_ranks_agree(runs, name):
    """Every rank logs the same metrics and gathers the same full weights."""
    _, got, _ = runs
    assert compare(got[0][name], got[1][name]) == []


@pytest.mark.parametrize("name", ["noclip", "clip_exact", "uneven"])
def test_fsdp_bitwise_equals_single_process(runs, name):
    refs, got, _ = runs
    ref = refs[name]
    assert compare(ref, got[0][name]) == []
    # the run exercised what it should: two steps, the staleness split rescored under version 0
    assert len(ref["metrics"]) == 2
    assert "bit_wise/logprob_diff/staleness_abs_mean" in ref["metrics"][1]
    assert ref["metrics"][0]["bit_wise/logprob_diff/abs_mean"] > 0
    if name == "clip_exact":
        assert ref["metrics"][0]["train/grad_norm"] > 100 * CONFIGS[name]["grad_clip"]  # clipping is active


def test_activation_checkpointing_changes_no_bit(runs):
    """FSDP with each layer recomputed in backward == the plain single-process run, metrics and weights."""
    refs, got, _ = runs
    assert compare(refs["noclip"], refs["recompute"]) == []
    assert compare(refs["noclip"], got[0]["recompute"]) == []


def test_fsdp_bitwise_checks_are_not_vacuous(runs):
    """Clipping changes the weights, so equal weights above are not an artefact of a no-op step."""
    refs, _, _ = runs
    assert any(not torch.equal(refs["noclip"]["weights"][k], refs["clip_exact"]["weights"][k]) for k in refs["noclip"]["weights"])


@pytest.mark.parametrize("name", ["clip_fast", "two_mb_per_rank"])
def test_fsdp_within_tolerance(runs, name):
    """Summation order differs (DTensor norm; gradient sum (g0+g2)+(g1+g3) vs ((g0+g1)+g2)+g3): close, and
    reported as different so that the bitwise tests above mean something."""
    refs, got, _ = runs
    _close(refs[name], got[0][name])
    assert compare(refs[name], got[0][name]) != []


def test_reduce_metrics(runs):
    """SUM for partial means, MAX for maxima (both ranks hold identical values here)."""
    _, _, ranks = runs
    ex = ranks[0]["extra"]
    for k, v in ex["local"].items():
        want = v if k in D.MAX_REDUCED_KEYS else WORLD * v
        assert ex["reduced"][k] == want, k


# ------------------------------------------------------------------------------ no process group


def test_init_distributed_sets_nccl_env_before_process_group(monkeypatch):
    for k in D.NCCL_INVARIANCE_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("NCCL_PROTO", "LL")  # a user's explicit choice is kept
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    seen = {}

    def fake_init(backend, **kw):
        seen.update(backend=backend, env={k: D.os.environ.get(k) for k in D.NCCL_INVARIANCE_ENV}, **kw)

    monkeypatch.setattr(D.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(D.dist, "init_process_group", fake_init)
    monkeypatch.setattr(D.torch.cuda, "set_device", lambda i: seen.setdefault("set_device", i))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        info = D.init_distributed("nccl")
    assert seen["backend"] == "nccl" and seen["rank"] == 1 and seen["world_size"] == 2
    assert seen["set_device"] == 1 and seen["device_id"] == torch.device("cuda", 1)
    want = {**D.NCCL_INVARIANCE_ENV, "NCCL_PROTO": "LL"}
    assert seen["env"] == want  # set BEFORE the process group started
    assert any("NCCL_PROTO" in str(x.message) for x in w)
    assert (info.rank, info.world_size, info.local_rank, info.backend) == (1, 2, 1, "nccl")


def test_init_distributed_single_process_without_torchrun(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(D.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(D.dist, "init_process_group", lambda *a, **k: pytest.fail("must not start a group"))
    info = D.init_distributed("gloo")
    assert (info.rank, info.world_size, info.backend) == (0, 1, None)


def test_gloo_does_not_touch_nccl_env(monkeypatch):
    for k in D.NCCL_INVARIANCE_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(D.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(D.dist, "init_process_group", lambda *a, **k: None)
    D.init_distributed("gloo")
    assert not any(k in D.os.environ for k in D.NCCL_INVARIANCE_ENV)


def test_shard_batch_is_contiguous_and_microbatch_aligned():
    model = build_model("tiny", "stock", seed=0)
    batch = synthetic_batches(model, {**DEFAULTS, "steps": 1, "groups": 3, "samples_per_group": 3})[0]
    samples = [s for g in batch.groups for s in g.samples]
    mbs = microbatches(samples, 48)  # 9 samples x 16 tokens -> 3 microbatches
    assert len(mbs) == 3
    for world in (1, 2, 3, 4):
        parts = [D.shard_batch(samples, r, world, max_tokens=48) for r in range(world)]
        assert [id(s) for p in parts for s in p] == [id(s) for s in samples]  # contiguous, in order, complete
        steps = {D.plan_microbatches(samples, 48, r, world)[1] for r in range(world)}
        assert steps == {-(-3 // world)}  # every rank runs the same number of iterations
    # world == number of microbatches: rank r gets exactly microbatch r
    for r in range(3):
        assert D.shard_batch(samples, r, 3, max_tokens=48) == [samples[i] for i in mbs[r]]
    # by count, and on groups / a Batch (whole groups)
    assert [len(D.shard_batch(samples, r, 2)) for r in range(2)] == [4, 5]
    sb = D.shard_batch(batch, 1, 2)
    assert isinstance(sb, Batch) and [g.prompt_id for g in sb.groups] == [batch.groups[1].prompt_id, batch.groups[2].prompt_id]
