#!/usr/bin/env python
"""Check the CUDA paths' logic on a CPU, without a GPU: Triton's interpreter runs the kernels on CPU tensors, with
its fp32 `tl.dot` replaced by a sequential multiply-add chain over K (what the GPU's FMA lowering computes;
emulated in float64 and rounded to fp32 per step). Under that emulation the fused bi_chunk decode step ("dot",
and the default loop-chain kernel against it) must equal the chunked forward bit for bit, as on the GPU; the
forward must match float64 within 1e-5. Then the whole model path (every op's CUDA form: Triton GEMM, row
reductions, bmm, the GDN backends' CUDA branches and the cache's in-place slots) generates with the engine and
rescores with the trainer's forward, for bi and bi_chunk: every logprob must be equal; again with the
CUDA-graph runner's bucketed decode path (run without capture) and the Gumbel-max device sampler. Head sizes that are not
powers of two (K = V = 96; K = 128, V = 96; K = 96, V = 40) run padded and masked: the same checks at small
shapes (decode == chunked rows bitwise, both decode kernels agree, recurrent kernel vs float64) and the micro
model's engine-vs-trainer check at K = V = 96. About 8 minutes on one core; `--head-sizes` runs only the
head-size checks, `--model` only the engine-vs-trainer checks at the default head sizes.

    pip install -e ".[interpret]" && TRITON_INTERPRET=1 PYTHONPATH=src python experiments/gpu/interpret_check.py

Not part of the test suite (about 8 minutes); a developer's check before spending device time.
"""

import os
import sys

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("set TRITON_INTERPRET=1 (zeromismatch.ops.device reads it at import)")

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))
sys.path.insert(0, os.path.join(ROOT, "tests", "generator"))
from zeromismatch.ops.interpreter import emulate_gpu_arithmetic  # noqa: E402


def model_parity(mode, engine_kw=None, **overrides):
    """Engine generation (continuous batching, prefill pieces, chunk closes, a prefix-cache hit) vs the trainer's
    packed forward on a micro model (config fields overridden by `overrides`; Engine options `engine_kw`):
    (sequences whose logprobs are all equal, sequences)."""
    from gen_helpers import MICRO, prompts_of
    from zeromismatch.generator import Engine, SamplingParams
    from zeromismatch.models.qwen3_5 import build_model
    from zeromismatch.ops.logprob import token_logprobs

    model = build_model("tiny", mode, seed=1, **dict(MICRO, **overrides)).eval()
    prompts = prompts_of([3, 66, 50, 130], seed=2)
    prompts.append(prompts[1][:64] + [7, 8])  # shares a 64-token block with prompt 1
    eng = Engine(model, max_slots=3, max_batched_tokens=80, max_model_len=256, **(engine_kw or {}))
    with torch.no_grad():
        outs = eng.generate(prompts, [SamplingParams(max_new_tokens=20, seed=i) for i in range(len(prompts))])
        seqs = [o.all_tokens for o in outs]
        cu = [0]
        for s in seqs:
            cu.append(cu[-1] + len(s))
        logits = model(torch.tensor([t for s in seqs for t in s]), cu)
    equal = 0
    for i, o in enumerate(outs):
        p = len(o.prompt_ids)
        lp = token_logprobs(logits[cu[i] + p - 1 : cu[i] + p - 1 + len(o.tokens)], torch.tensor(o.tokens))
        equal += int(torch.equal(lp, o.logprob_tensor))
    return equal, len(outs)


def head_size_checks(t):
    """The padded / masked paths at head sizes that are not powers of two, at small shapes."""
    from zeromismatch.ops.gdn.chunk_triton import chunk_fwd_triton
    from zeromismatch.ops.gdn.naive import chunk_fwd

    for dk, dv in ((96, 96), (128, 96), (96, 40)):
        q, k, v, g, beta = t._prepared_inputs(1, 2, 64, dk, dv, 3)
        s0 = torch.randn(1, 2, dk, dv, generator=t._gen(4)) * 0.1
        o, st = chunk_fwd_triton(q, k, v, g, beta, s0)
        o64, st64 = chunk_fwd(*(x.double() for x in (q, k, v, g, beta, s0)))
        rel = max(float((o.double() - o64).norm() / o64.norm()), float((st.double() - st64).norm() / st64.norm()))
        assert rel < 1e-5, (dk, dv, rel)
        for dots, kernel in t.DECODE_KERNELS[:2]:
            t.check_chunk_decode_equals_chunked_forward(dots, kernel, dk, dv, h=1, prefill=(0, 60), total=70)
        for pos in (0, 63):
            t.check_decode_kernels_agree(pos, dk, dv, n=2, h=1)
        t.check_recurrent_reference_and_invariance(dk, dv, [9, 1, 7])
        print(f"K={dk} V={dv}: chunked fwd vs float64 {rel:.1e}; decode (tf32 dot, ieee chain) == chunked rows; "
              "chain == dot; recurrent vs float64, alone == batched, split exact: ok")
    for mode in ("bi", "bi_chunk"):
        equal, total = model_parity(mode, linear_key_head_dim=96, linear_value_head_dim=96)
        print(f"{mode}, GDN head dims K = V = 96: engine logprobs == trainer forward for {equal}/{total} sequences")
        assert equal == total, mode


def main():
    import test_gpu_kernels as t

    t.DEV = "cpu"
    t._gen = lambda seed=0: torch.Generator().manual_seed(seed)
    if "--model" in sys.argv:  # the engine-vs-trainer checks alone (~4 minutes)
        return model_checks()
    head_size_checks(t)
    if "--head-sizes" in sys.argv:
        return
    from zeromismatch.ops.gdn import CHUNK
    from zeromismatch.ops.gdn.chunk_triton import chunk_decode_triton, chunk_fwd_triton
    from zeromismatch.ops.gdn.naive import chunk_fwd

    q, k, v, g, beta = t._prepared_inputs(2, 2, 128, 128, 128, 1)
    s0 = torch.randn(2, 2, 128, 128, generator=t._gen(2)) * 0.1
    o, st = chunk_fwd_triton(q, k, v, g, beta, s0)
    o64, st64 = chunk_fwd(*(x.double() for x in (q, k, v, g, beta, s0)))
    rel = float((o.double() - o64).norm() / o64.norm())
    print(f"chunk_fwd_triton vs float64: rel err {rel:.2e}")
    assert rel < 1e-5
    # the loop-chain kernel is slow under the interpreter: compared to "dot" below, on small dims
    t.check_chunk_decode_equals_chunked_forward("tf32", "dot")
    print("dot decode == chunked forward rows (bitwise, sequential-dot emulation): ok")
    n, h, d = 3, 2, 32
    g = t._gen(5)
    cache = {"ssm": torch.randn(n, h, d, d, generator=g), "ck": torch.randn(n, h, CHUNK, d, generator=g),
             "cv": torch.randn(n, h, CHUNK, d, generator=g), "cg": -torch.rand(n, h, CHUNK, generator=g),
             "cb": torch.rand(n, h, CHUNK, generator=g), "ct": torch.randn(n, h, CHUNK, CHUNK, generator=g),
             "cu": torch.randn(n, h, CHUNK, d, generator=g)}
    xs = [x[:, :, 0] for x in t._prepared_inputs(n, h, 1, d, d, 6)]
    for pos in ([0, 5, 63], [63, 1, 40]):
        a, b = ({k_: v_.clone() for k_, v_ in cache.items()} for _ in range(2))
        pos = torch.tensor(pos)
        oa = chunk_decode_triton(*xs, torch.arange(n), pos, a, dots="ieee", kernel="dot")
        ob = chunk_decode_triton(*xs, torch.arange(n), pos, b, dots="ieee", kernel="chain")
        assert torch.equal(oa, ob) and all(torch.equal(a[k_], b[k_]) for k_ in a), pos
    print("loop-chain decode == dot decode (output and every cache tensor): ok")
    model_checks()


def model_checks():
    for mode in ("bi", "bi_chunk"):
        equal, total = model_parity(mode)
        print(f"{mode}: engine logprobs == trainer forward for {equal}/{total} sequences")
        assert equal == total, mode
        # the CUDA-graph runner's bucketed, padded decode path (run without capture) and the device sampler
        equal, total = model_parity(mode, engine_kw=dict(cuda_graphs=True, device_sampling=True))
        print(f"{mode}, bucketed decode + device sampler: engine logprobs == trainer forward for {equal}/{total}")
        assert equal == total, mode


if __name__ == "__main__":
    with emulate_gpu_arithmetic():
        main()
