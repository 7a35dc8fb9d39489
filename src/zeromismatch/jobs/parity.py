"""`python run.py job=parity model=tiny numerics=bi`: the mismatch audit (parity/check.py, run_parity).

Generate with the engine under continuous batching, rescore every sequence with the trainer's packed
forward, and compare logprobs token by token; then replay the generation with activation taps and report,
per op in forward order, how far the generator's activations are from the trainer's for the same
(sequence, position), and where they first diverge. Ends with the line

    parity: max_abs_diff=<x> abs_mean=<y> tokens=<n>

Run it to exonerate (or convict) the infra before blaming the algorithm. job.out=<file.json> writes the
result with the command, machine and cfg.numerics node (logging/record.py).
"""

from __future__ import annotations

import torch

from ..generator.backends import build_engine
from ..logging.record import results_record, write_record
from ..model_init import load_model
from ..parity import run_parity
from ..parity.check import PROMPT_MAX_LEN


def main(cfg) -> dict:
    torch.manual_seed(int(cfg.get("seed", 0)))
    job = cfg.job
    model = load_model(cfg, seed=int(job.get("seed", 0))).eval()
    max_slots, max_new = int(job.get("max_slots", 8)), int(job.get("max_new_tokens", 24))
    make_engine = None
    if cfg.generator.backend != "embedded":  # one engine for both passes: a vLLM engine is costly to start
        engine = build_engine(model, cfg.generator, max_model_len=PROMPT_MAX_LEN + max_new, max_slots=max_slots,
                              seed=int(job.get("seed", 0)))
        make_engine = lambda: engine  # noqa: E731
    res = run_parity(
        model,
        n_prompts=int(job.get("n_prompts", 16)),
        max_new_tokens=max_new,
        seed=int(job.get("seed", 0)),
        max_slots=max_slots,
        audit=bool(job.get("audit", True)),
        make_engine=make_engine,
    )
    print(f"model={cfg.model.preset} numerics={cfg.numerics.name} generator={cfg.generator.backend} "
          f"sequences={res['sequences']} equal={res['sequences_equal']} {res['generator']['generated_tokens_per_s']:.0f} tok/s")
    if "audit_table" in res:
        print(res["audit_table"])
    print(f"parity: max_abs_diff={res['max_abs_diff']:.6g} abs_mean={res['abs_mean']:.6g} tokens={res['tokens']}")
    out = {k: v for k, v in res.items() if k != "audit_table"}
    if job.get("out"):
        write_record(job.out, results_record(cfg, **out))
    return out
