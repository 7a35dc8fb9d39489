"""`python run.py job=bench model=tiny`: what parity costs, measured side by side in one process.

For each numerics mode (job.modes; kernel policies from cfg.numerics), on the same random-weight model: the
trainer's packed forward+backward over job.batch x job.seq_len tokens, and the generator's throughput
(continuous batching, job.gen_prompts prompts, job.gen_tokens new tokens each). Medians over job.repeats;
ratios against stock. Writes a JSON record (command, machine, versions, numerics node, numbers) to job.out
when set.
"""

from __future__ import annotations

import statistics
import time

import torch

from ..config import numerics_spec
from ..generator import Engine, SamplingParams
from ..logging.record import results_record, write_record
from ..models.qwen3_5 import build_model
from ..ops.logprob import token_logprobs
from ..parity import random_prompts

MODES = ("stock", "bi", "bi_chunk")


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_mode(preset: str, numerics, job, seed: int) -> dict:
    model = build_model(preset, numerics, seed=seed)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (job.batch * job.seq_len,), generator=g)
    cu = list(range(0, ids.numel() + 1, job.seq_len))

    def train_step():
        model.zero_grad(set_to_none=True)
        logits = model(ids, cu)
        (-token_logprobs(logits[:-1], ids[1:]).mean()).backward()

    t_train = _median_seconds(train_step, job.repeats)
    prompts = random_prompts(job.gen_prompts, model.config.vocab_size, seed, min_len=16, max_len=96)
    model.eval()

    def generate():
        eng = Engine(model, max_slots=job.gen_prompts, max_batched_tokens=4096)
        eng.generate(prompts, SamplingParams(max_new_tokens=job.gen_tokens, seed=seed))

    t_gen = _median_seconds(generate, max(1, job.repeats // 2))
    return {
        "trainer_fwd_bwd_s": t_train,
        "trainer_tokens_per_s": ids.numel() / t_train,
        "generate_s": t_gen,
        "generator_tokens_per_s": job.gen_prompts * job.gen_tokens / t_gen,
    }


def main(cfg) -> dict:
    job = cfg.job
    modes = list(job.get("modes") or MODES)
    res = {m: bench_mode(cfg.model.preset, numerics_spec(cfg, name=m), job, int(cfg.seed)) for m in modes}
    if "stock" in res:
        for m in modes:
            res[m]["trainer_time_vs_stock"] = res[m]["trainer_fwd_bwd_s"] / res["stock"]["trainer_fwd_bwd_s"]
            res[m]["generator_time_vs_stock"] = res[m]["generate_s"] / res["stock"]["generate_s"]
    print(f"{'mode':<10}{'trainer tok/s':>15}{'x stock':>9}{'generator tok/s':>18}{'x stock':>9}")
    for m, r in res.items():
        print(f"{m:<10}{r['trainer_tokens_per_s']:>15.0f}{r.get('trainer_time_vs_stock', float('nan')):>9.2f}"
              f"{r['generator_tokens_per_s']:>18.0f}{r.get('generator_time_vs_stock', float('nan')):>9.2f}")
    record = results_record(
        cfg,
        modes=modes,
        setup={k: job.get(k) for k in ("batch", "seq_len", "gen_prompts", "gen_tokens", "repeats")},
        results=res,
    )
    if job.get("out"):
        write_record(job.out, record)
    return record
