"""Trainer/generator bitwise parity on the GPU in bf16 (fp32 GDN state, fp32 lm_head and logprobs): the
generator decodes under continuous batching, the trainer rescores the packed sequences, logprobs must be
torch.equal. Skipped without CUDA."""

import pytest
import torch

pytestmark = pytest.mark.gpu


def _parity(preset, mode, n_prompts=8):
    from zeromismatch.generator import Engine, SamplingParams
    from zeromismatch.models.qwen3_5 import build_model
    from zeromismatch.ops.logprob import token_logprobs

    m = build_model(preset, mode, seed=1).to(device="cuda", dtype=torch.bfloat16)
    vocab = m.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, vocab, (int(n),), generator=g).tolist() for n in torch.randint(3, 150, (n_prompts,), generator=g)]
    eng = Engine(m, max_slots=4, max_batched_tokens=128)
    outs = eng.generate(prompts, [SamplingParams(max_new_tokens=10 + 9 * i % 40, seed=i) for i in range(n_prompts)])
    seqs = [o.all_tokens for o in outs]
    cu = [0]
    for s in seqs:
        cu.append(cu[-1] + len(s))
    with torch.no_grad():
        logits = m(torch.tensor([x for s in seqs for x in s], device="cuda"), cu)
    maxd = 0.0
    for i, o in enumerate(outs):
        p, n = len(o.prompt_ids), len(o.tokens)
        rows = torch.arange(cu[i] + p - 1, cu[i] + p - 1 + n, device="cuda")
        lp = token_logprobs(logits[rows], torch.tensor(o.tokens, device="cuda"))
        maxd = max(maxd, (lp - o.logprob_tensor.to(lp.device)).abs().max().item())
    return maxd


@pytest.mark.parametrize("mode", ["bi", "bi_chunk"])
@pytest.mark.parametrize("preset", ["tiny", "tiny_moe"])
def test_gpu_parity_bitwise(preset, mode):
    assert _parity(preset, mode) == 0.0


def test_gpu_stock_mismatch_nonzero():
    assert _parity("tiny", "stock") > 0.0
