"""The randomized parity sweep (tests/parity/test_sweep.py's draws: model configs and workloads) on the GPU in
bf16: trainer logprobs == generator logprobs (torch.equal) in bi and bi_chunk. The draws' GDN and attention
head sizes include ones that are not powers of two. GPU_SWEEP_DRAWS draws run (ZM_GPU_SWEEP_DRAWS for more);
benchmarks/parity.py writes the same draws' numbers to JSON. A draw's weight swap and thread counts are CPU
knobs and are not used here. Skipped without CUDA."""

import os
import random
import sys

import pytest
import torch

from zeromismatch.models.qwen3_5 import build_model
from zeromismatch.parity import check_parity

pytestmark = pytest.mark.gpu
GPU_SWEEP_DRAWS = int(os.environ.get("ZM_GPU_SWEEP_DRAWS", 6))
SWEEP_SEED = 0
SCHEDULE_KEYS = ("max_slots", "max_batched_tokens", "order", "arrivals", "prefix_caching")


def sweep_draw(draw: int, seed: int = SWEEP_SEED):
    """(config, workload) of the CPU sweep's draw `draw` (the same RNG stream as tests/parity/test_sweep.py)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "parity"))
    from test_sweep import draw_config, draw_workload  # the CPU sweep module (a test file, not a package)

    rng = random.Random(f"{seed}-{draw}")
    cfg = draw_config(rng)
    return cfg, draw_workload(rng, cfg.vocab_size)


def gpu_sweep_check(cfg, work: dict, mode: str):
    """check_parity for one draw and mode: a bf16 model on cuda, the draw's prompts, params and schedule."""
    model = build_model(cfg, mode, seed=1).to(device="cuda", dtype=torch.bfloat16).eval()
    return check_parity(model, work["prompts"], work["params"], **{k: work[k] for k in SCHEDULE_KEYS})


@pytest.mark.parametrize("mode", ["bi", "bi_chunk"])
@pytest.mark.parametrize("draw", range(GPU_SWEEP_DRAWS))
def test_gpu_sweep_bitwise(draw, mode):
    cfg, work = sweep_draw(draw)
    res = gpu_sweep_check(cfg, work, mode)
    assert res.bitwise, f"draw {draw} {mode}: {res.stats}; {cfg}"
