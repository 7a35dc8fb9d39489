"""Trainer/generator bitwise parity on the GPU in bf16 (fp32 GDN state, fp32 lm_head and logprobs): the
generator decodes under continuous batching, the trainer rescores the packed sequences, logprobs must be
torch.equal (the library parity check, zeromismatch.parity). Skipped without CUDA."""

import pytest
import torch

from zeromismatch.generator import SamplingParams
from zeromismatch.models.qwen3_5 import build_model
from zeromismatch.parity import check_parity, random_prompts

pytestmark = pytest.mark.gpu


def _max_abs_diff(preset, mode, n_prompts=8):
    model = build_model(preset, mode, seed=1).to(device="cuda", dtype=torch.bfloat16)
    prompts = random_prompts(n_prompts, model.config.vocab_size, seed=0, min_len=3, max_len=149)
    params = [SamplingParams(max_new_tokens=10 + 9 * i % 40, seed=i) for i in range(n_prompts)]
    return check_parity(model, prompts, params, max_slots=4, max_batched_tokens=128).stats["max_abs_diff"]


@pytest.mark.parametrize("mode", ["bi", "bi_chunk"])
@pytest.mark.parametrize("preset", ["tiny", "tiny_moe"])
def test_gpu_parity_bitwise(preset, mode):
    assert _max_abs_diff(preset, mode) == 0.0


def test_gpu_stock_mismatch_nonzero():
    assert _max_abs_diff("tiny", "stock") > 0.0
