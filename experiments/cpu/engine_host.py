"""The engine's own cost per decode step: everything a step does on the host besides the model forward
(admission, scheduling, block allocation, the sampler's per-row keys and parameters, appending samples,
retiring), with the model runner replaced by a stub that returns logit rows at once. On the GPU this work sits
between two graph replays, so it adds to the inter-token latency one for one (the generator benchmark's ITL
minus its graph replay time).

    PYTHONPATH=src python experiments/cpu/engine_host.py --out FILE.json [--concurrency 1,16,64,256]

Process CPU time (robust to other jobs on the machine), minimum over repeats. The sampler runs its torch form
over a small vocabulary (its per-row Python is what is measured, not its arithmetic).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time

import torch

from zeromismatch.generator import Engine, SamplingParams
from zeromismatch.models.qwen3_5 import build_model

VOCAB = 64  # the stub's logit width: the sampler's arithmetic stays negligible


def _stub_runner(eng: Engine) -> None:
    """The runner returns fixed logits, one row per sampling piece (what `ModelRunner.execute` promises)."""
    logits = torch.randn(eng.max_slots + 1, VOCAB, generator=torch.Generator().manual_seed(0))
    eng.runner.execute = lambda work, tap=None: logits[: sum(1 for w in work if w.samples)]


def host_us_per_step(c: int, steps: int, repeats: int, prompt: int = 128) -> float:
    model = build_model("tiny", "stock", seed=1).eval()
    best = float("inf")
    for _ in range(repeats):
        eng = Engine(model, max_slots=c + 2, max_batched_tokens=c * prompt + 64, max_model_len=prompt + steps + 64,
                     device_sampling=True)
        _stub_runner(eng)
        for i in range(c):
            eng.add_request([(7 * i + j) % 50 + 3 for j in range(prompt)],
                            SamplingParams(max_new_tokens=steps + 16, seed=i, temperature=1.0, stop_token_ids=[]))
        eng.step()  # prefill (one step: the budget holds every prompt)
        eng.step()
        t = time.process_time()
        for _ in range(steps):
            eng.step()
        best = min(best, (time.process_time() - t) / steps * 1e6)
    return best


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        name = platform.processor() or platform.machine()
    return f"{name}, {len(os.sched_getaffinity(0))} cores"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--concurrency", default="1,16,64,256")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--commit", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                           text=True).stdout.strip()
    rows = {}
    for c in map(int, args.concurrency.split(",")):
        us = host_us_per_step(c, args.steps, args.repeats)
        rows[c] = {"us_per_step": round(us, 1), "us_per_seq_step": round(us / c, 2)}
        print(c, rows[c], flush=True)
    out = {"run": {"command": "python experiments/cpu/engine_host.py " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items() if k not in ("out", "commit") and v is not None),
                   "commit": commit, "machine": _cpu_name(),
                   "torch": torch.__version__}, "results": rows}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
