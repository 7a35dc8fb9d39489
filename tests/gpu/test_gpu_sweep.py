"""The randomized parity sweep (zeromismatch.parity.sweep's draws, as tests/parity/test_sweep.py runs them on the CPU) on the GPU in
bf16: trainer logprobs == generator logprobs (torch.equal) in bi and bi_chunk. The draws' GDN and attention
head sizes include ones that are not powers of two. GPU_SWEEP_DRAWS draws run (ZM_GPU_SWEEP_DRAWS for more);
benchmarks/parity.py writes the same draws' numbers to JSON. A draw's weight swap and thread counts are CPU
knobs and are not used here. Skipped without CUDA."""

import os

import pytest
import torch

from zeromismatch.models.qwen3_5 import build_model
from zeromismatch.parity import check_parity, sweep

pytestmark = pytest.mark.gpu
GPU_SWEEP_DRAWS = int(os.environ.get("ZM_GPU_SWEEP_DRAWS", 6))


def gpu_sweep_check(cfg, work: dict, mode: str):
    """check_parity for one draw and mode: a bf16 model on cuda, the draw's prompts, params and schedule."""
    model = build_model(cfg, mode, seed=1).to(device="cuda", dtype=torch.bfloat16).eval()
    return check_parity(model, work["prompts"], work["params"], **sweep.engine_schedule(work))


@pytest.mark.parametrize("mode", ["bi", "bi_chunk"])
@pytest.mark.parametrize("draw", range(GPU_SWEEP_DRAWS))
def test_gpu_sweep_bitwise(draw, mode):
    cfg, work = sweep.draw(draw)
    res = gpu_sweep_check(cfg, work, mode)
    assert res.bitwise, f"draw {draw} {mode}: {res.stats}; {cfg}"
