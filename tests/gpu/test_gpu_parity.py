"""Trainer/generator bitwise parity on the GPU in bf16 (fp32 GDN state, fp32 lm_head and logprobs): the
generator decodes under continuous batching, the trainer rescores the packed sequences, logprobs must be
torch.equal (the library parity check, zeromismatch.parity). Skipped without CUDA. `-m "gpu and not big"`
leaves out the qwen3_5_mid runs (the slow ones)."""

import pytest
import torch

from zeromismatch.generator import SamplingParams
from zeromismatch.models.qwen3_5 import build_model
from zeromismatch.parity import check_parity, random_prompts
from zeromismatch.trainer.scoring import next_token_logprobs

pytestmark = pytest.mark.gpu


def gpu_parity(preset, mode, n_prompts=8, temperature=1.0, **overrides):
    """check_parity for a bf16 model of `preset` (config fields overridden by `overrides`) on cuda; at a
    ``temperature`` other than 1 with tempered logprobs (what RL at that temperature compares)."""
    model = build_model(preset, mode, seed=1, **overrides).to(device="cuda", dtype=torch.bfloat16)
    prompts = random_prompts(n_prompts, model.config.vocab_size, seed=0, min_len=3, max_len=149)
    params = [SamplingParams(temperature=temperature, max_new_tokens=10 + 9 * i % 40, seed=i,
                             tempered_logprobs=temperature != 1.0) for i in range(n_prompts)]
    return model, check_parity(model, prompts, params, max_slots=4, max_batched_tokens=128)


def gpu_parity_stats(preset, mode, n_prompts=8, **overrides):
    return gpu_parity(preset, mode, n_prompts, **overrides)[1].stats


@pytest.mark.parametrize("mode", ["bi", "bi_chunk"])
@pytest.mark.parametrize("preset", ["tiny", "tiny_moe"])
def test_gpu_parity_bitwise(preset, mode):
    assert gpu_parity_stats(preset, mode)["max_abs_diff"] == 0.0


@pytest.mark.parametrize("mode", ["bi", "bi_chunk"])
def test_gpu_parity_bitwise_tempered(mode):
    """Sampling at 0.6 on the device sampler, logprobs of logits / 0.6 on both sides: still bitwise."""
    assert gpu_parity_stats("tiny", mode, temperature=0.6)["max_abs_diff"] == 0.0


@pytest.mark.big
@pytest.mark.parametrize("mode", ["bi", "bi_chunk"])
def test_gpu_parity_bitwise_mid(mode):
    assert gpu_parity_stats("qwen3_5_mid", mode, n_prompts=6)["max_abs_diff"] == 0.0


@pytest.mark.parametrize("mode", ["bi", "bi_chunk"])
@pytest.mark.parametrize("key_dim,value_dim", [(96, 96), (128, 96), (64, 40)])
def test_gpu_parity_head_dims(key_dim, value_dim, mode):
    """GDN head sizes that are not powers of two (the kernels pad and mask them)."""
    stats = gpu_parity_stats("tiny", mode, n_prompts=6, linear_key_head_dim=key_dim, linear_value_head_dim=value_dim)
    assert stats["max_abs_diff"] == 0.0, stats


@pytest.mark.parametrize("mode", ["bi", "bi_chunk"])
def test_gpu_parity_with_autograd_on(mode):
    """The trainer's forward with autograd on (what RL training runs) gives the same logprobs, and the
    backward runs to finite gradients."""
    model, res = gpu_parity("tiny", mode, n_prompts=4)
    lps = next_token_logprobs(model, [o.all_tokens for o in res.outputs])
    for o, lp in zip(res.outputs, lps):
        p = len(o.prompt_ids)
        assert torch.equal(lp[p - 1 : p - 1 + len(o.tokens)].detach(), o.logprob_tensor.to(lp.device))
    torch.cat(lps).sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_gpu_stock_mismatch_nonzero():
    assert gpu_parity_stats("tiny", "stock")["max_abs_diff"] > 0.0
