"""The randomized parity sweep (zeromismatch.parity.sweep's draws, as tests/parity/test_sweep.py runs them on the CPU) on the GPU in
bf16: trainer logprobs == generator logprobs (torch.equal) in bi and bi_chunk. The draws' GDN and attention
head sizes include ones that are not powers of two. GPU_SWEEP_DRAWS draws run (ZM_GPU_SWEEP_DRAWS for more);
benchmarks/parity.py writes the same draws' numbers to JSON. A draw's weight swap and thread counts are CPU
knobs and are not used here. Skipped without CUDA."""

import os

import pytest
import torch

from zeromismatch.parity import sweep

pytestmark = pytest.mark.gpu
GPU_SWEEP_DRAWS = int(os.environ.get("ZM_GPU_SWEEP_DRAWS", 6))


@pytest.mark.parametrize("mode", ["bi", "bi_chunk"])
@pytest.mark.parametrize("draw", range(GPU_SWEEP_DRAWS))
def test_gpu_sweep_bitwise(draw, mode):
    cfg, work = sweep.draw(draw)
    res = sweep.check_draw(cfg, work, mode, device="cuda", dtype=torch.bfloat16)
    assert res.bitwise, f"draw {draw} {mode}: {res.stats}; {cfg}"
