"""Randomized parity sweep: trainer logprobs == generator logprobs (torch.equal, fp32, CPU) for model configs and
workloads drawn with a seeded RNG, in `bi` and `bi_chunk`.

A draw is a model config (hidden size, layer count and pattern, GDN key / value heads and head dims, attention
heads / kv heads / head dim, dense or MoE with its expert widths and top-k, vocab, tied embeddings) built through
Qwen35Config, and a workload (prompt lengths around the 64-token block boundaries, prompts sharing a prefix,
staggered arrivals and arrival order, slot count, token budget, prefix caching on or off, a weight swap under
`recompute`, torch threads of generator and trainer). CI runs the first CI_DRAWS draws and the fixed issue-15 draw;

    ZM_SWEEP_DRAWS=40 [ZM_SWEEP_SEED=0] python -m pytest tests/parity/test_sweep.py

runs more. A failing draw's id and config are in the assertion message: rerun it alone with -k.
"""

import dataclasses
import os
import random
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # test_parity, also under --import-mode=importlib
from test_parity import assert_bitwise, perturbed  # noqa: E402
from zeromismatch.generator import Engine, SamplingParams  # noqa: E402
from zeromismatch.jobs.parity import compare_logprobs, generate, random_prompts  # noqa: E402
from zeromismatch.models.qwen3_5 import Qwen35Config, build_model, get_preset  # noqa: E402
from zeromismatch.trainer.scoring import next_token_logprobs  # noqa: E402

CI_DRAWS = 6
DRAWS = int(os.environ.get("ZM_SWEEP_DRAWS", CI_DRAWS))
SEED = int(os.environ.get("ZM_SWEEP_SEED", 0))
MODES = ("bi", "bi_chunk")
BOUNDARY_LENGTHS = (1, 2, 63, 64, 65, 127, 128, 129)  # block (and GDN chunk) size 64
MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size")


def draw_config(rng: random.Random) -> Qwen35Config:
    n_layers = rng.randint(1, 4)
    layer_types = [rng.choice(["linear_attention", "full_attention"]) for _ in range(n_layers)]
    key_heads, kv_heads = rng.choice([1, 2, 3]), rng.choice([1, 2])
    head_dim = rng.choice([16, 32, 48, 64, 96, 128])
    cfg = dict(
        vocab_size=rng.choice([97, 256, 512, 1000, 2048]),
        hidden_size=rng.choice([32, 48, 64, 96, 128, 160, 256, 384]),
        num_hidden_layers=n_layers,
        layer_types=layer_types,
        linear_num_key_heads=key_heads,
        linear_num_value_heads=key_heads * rng.choice([1, 2]),
        linear_key_head_dim=rng.choice([16, 32, 48, 64, 96]),
        linear_value_head_dim=rng.choice([16, 32, 48, 64, 96]),
        linear_conv_kernel_dim=rng.choice([2, 3, 4]),
        num_key_value_heads=kv_heads,
        num_attention_heads=kv_heads * rng.choice([1, 2, 3]),
        head_dim=head_dim,
        partial_rotary_factor=rng.choice([0.25, 0.5, 1.0]),
        rope_theta=rng.choice([1e4, 1e6]),
        tie_word_embeddings=rng.random() < 0.25,
    )
    if rng.random() < 0.4:
        experts = rng.choice([2, 4, 8])
        cfg.update(
            num_experts=experts,
            num_experts_per_tok=rng.randint(1, min(4, experts)),
            moe_intermediate_size=rng.choice([32, 64, 96, 160]),
            shared_expert_intermediate_size=rng.choice([32, 64, 160]),
        )
    else:
        cfg.update(intermediate_size=rng.choice([64, 96, 160, 192, 256, 1024]))
    return Qwen35Config(**cfg)


def draw_workload(rng: random.Random, vocab: int) -> dict:
    n = rng.randint(3, 8)
    seed = rng.randrange(1 << 30)
    lengths = [rng.choice(BOUNDARY_LENGTHS) if rng.random() < 0.6 else rng.randint(3, 200) for _ in range(n)]
    prompts = [random_prompts(1, vocab, seed + i, min_len=m, max_len=m)[0] for i, m in enumerate(lengths)]
    if rng.random() < 0.5:  # some prompts extend one shared prefix
        shared = random_prompts(1, vocab, seed - 1, min_len=rng.choice([64, 128, 129, 140]), max_len=140)[0]
        for i in rng.sample(range(n), rng.randint(2, n)):
            prompts[i] = shared[: rng.choice([len(shared), 64, 128])] + prompts[i][: rng.choice([0, 1, 5, 63, 64])]
    order = list(range(n))
    rng.shuffle(order)
    return dict(
        prompts=prompts,
        params=[SamplingParams(max_new_tokens=rng.randint(1, 12), seed=seed + i) for i in range(n)],
        max_slots=rng.choice([1, 2, 3, 5, 8]),
        max_batched_tokens=rng.choice([64, 96, 128, 200, 2048]),
        order=order,
        arrivals=sorted(rng.randint(0, 12) for _ in range(n)) if rng.random() < 0.5 else None,
        prefix_caching=rng.random() < 0.8,
        swap_step=rng.randint(1, 10) if rng.random() < 0.3 else None,
        gen_threads=rng.choice([1, 2]),
        score_threads=rng.choice([1, 2]),
    )


class SwappingEngine(Engine):
    """Swaps to `new_weights` (version 1) before its step number `swap_step`, under the `recompute` policy."""

    def __init__(self, model, swap_step: int, new_weights: dict, **kw):
        super().__init__(model, swap_policy="recompute", **kw)
        self.swap_step, self.new_weights = swap_step, new_weights

    def step(self):
        if self.stats["steps"] == self.swap_step and self.version == 0:
            self.update_weights(self.new_weights, version=1)
        return super().step()


@pytest.fixture
def threads():
    """Set the torch thread count inside a test; restored after."""
    n = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(n)


def check_parity(cfg: Qwen35Config, work: dict, mode: str, set_threads, label: str) -> None:
    model = build_model(cfg, mode, seed=1).eval()
    engine_kw = dict(max_slots=work["max_slots"], max_batched_tokens=work["max_batched_tokens"],
                     prefix_caching=work["prefix_caching"])
    old = new = engine = None
    if work["swap_step"] is not None:
        old = {k: v.clone() for k, v in model.state_dict().items()}
        new = perturbed(model, 9)
        if cfg.tie_word_embeddings:  # one tensor: state_dict lists it twice, perturbed twice
            new["lm_head.weight"] = new["model.embed_tokens.weight"]
        engine = SwappingEngine(model, work["swap_step"], new, **engine_kw)
    set_threads(work["gen_threads"])
    outs, _ = generate(model, work["prompts"], work["params"], order=work["order"], arrivals=work["arrivals"],
                       engine=engine, **engine_kw)
    set_threads(work["score_threads"])
    if engine is None:
        try:
            assert_bitwise(model, outs)
        except AssertionError as e:
            raise AssertionError(f"{label} {mode}: {compare_logprobs(model, outs)}") from e
        return
    scores = {}
    for version, weights in ((0, old), (1, new)):
        model.load_state_dict(weights)
        with torch.no_grad():
            scores[version] = next_token_logprobs(model, [o.all_tokens for o in outs])
    for i, o in enumerate(outs):
        p, n = len(o.prompt_ids), len(o.tokens)
        v = torch.tensor(o.versions)
        expect = torch.where(v == 0, scores[0][i][p - 1 : p - 1 + n], scores[1][i][p - 1 : p - 1 + n])
        assert torch.equal(expect, o.logprob_tensor), f"{label} {mode}: request {i} (versions {o.versions})"


def describe(cfg: Qwen35Config, work: dict) -> str:
    unused = {"eos_token_id", "pad_token_id", "rms_norm_eps"}
    unused |= {"intermediate_size"} if cfg.is_moe else set(MOE_FIELDS)
    keys = [f.name for f in dataclasses.fields(cfg) if f.name not in unused]
    model = ", ".join(f"{k}={getattr(cfg, k)}" for k in keys)
    load = {k: v for k, v in work.items() if k not in ("prompts", "params", "order")}
    return f"config({model}) workload(prompt lengths {[len(p) for p in work['prompts']]}, {load})"


@pytest.mark.parametrize("draw", range(DRAWS))
def test_random_config_and_workload(draw, threads):
    rng = random.Random(f"{SEED}-{draw}")
    cfg = draw_config(rng)
    work = draw_workload(rng, cfg.vocab_size)
    label = f"draw {draw} (seed {SEED}): {describe(cfg, work)}"
    for mode in MODES:
        check_parity(cfg, work, mode, threads, label)


def test_hidden_384_intermediate_1024(threads):
    """Issue 15's config: a dense model of hidden 384 and MLP 1024, whose [384, 1024] down projection one
    padded GEMM did not compute row-count invariantly at 2 threads."""
    cfg = get_preset("tiny", hidden_size=384, intermediate_size=1024)
    prompts = random_prompts(6, cfg.vocab_size, seed=1, min_len=1, max_len=200)
    params = [SamplingParams(max_new_tokens=16, seed=i) for i in range(6)]
    work = dict(prompts=prompts, params=params, max_slots=4, max_batched_tokens=2048, order=None, arrivals=None,
                prefix_caching=True, swap_step=None, gen_threads=2, score_threads=2)
    for mode in MODES:
        check_parity(cfg, work, mode, threads, "hidden 384 / intermediate 1024")


@pytest.mark.xfail(
    strict=True,
    reason="ops/gdn recurrent_step: with one value head a lone sequence's step is a bmm of batch 1, which torch "
    "sends to a plain GEMM (batch >= 2: MKL's batch GEMM), so its bits differ from the trainer's batched step "
    "(found by ZM_SWEEP_DRAWS=40: draws 8, 35, 39, all bi, all linear_num_value_heads=1)",
)
def test_single_value_head_lone_sequence(threads):
    cfg = get_preset("tiny", linear_num_key_heads=1, linear_num_value_heads=1, linear_key_head_dim=48)
    prompts = random_prompts(3, cfg.vocab_size, seed=2, min_len=20, max_len=90)
    params = [SamplingParams(max_new_tokens=6, seed=i) for i in range(3)]
    work = dict(prompts=prompts, params=params, max_slots=1, max_batched_tokens=2048, order=None, arrivals=None,
                prefix_caching=False, swap_step=None, gen_threads=1, score_threads=1)
    check_parity(cfg, work, "bi", threads, "one value head, one sequence at a time")
