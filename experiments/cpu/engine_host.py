"""The engine's own cost per decode step: everything a step does on the host besides the model forward
(admission, scheduling, block allocation, the sampler's per-row keys and parameters, appending samples,
retiring), with the model runner replaced by a stub that returns logit rows at once. On the GPU this work sits
between two graph replays, so it adds to the inter-token latency one for one (the generator benchmark's ITL
minus its graph replay time).

    PYTHONPATH=src python experiments/cpu/engine_host.py --out FILE.json [--concurrency 1,16,64,256] [--staged]

Process CPU time (robust to other jobs on the machine), minimum over repeats. The sampler runs its torch form
over a small vocabulary (its per-row Python is what is measured, not its arithmetic).

--staged: the graph runner's path with staged steps (Engine.stage_ahead; the runner's replay and staging stubbed
too). There only the host's work between reading a step's samples back and launching the next replay leaves the
GPU idle ("critical_us", wall-clock median over the steps); the rest runs while the GPU computes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time

import torch

import zeromismatch.generator.engine as engine_module
from zeromismatch.generator import Engine, SamplingParams
from zeromismatch.generator.model_runner import StagedDecode
from zeromismatch.models.qwen3_5 import build_model

VOCAB = 64  # the stub's logit width: the sampler's arithmetic stays negligible
_TO_HOST = engine_module._to_host


def _stub_runner(eng: Engine) -> None:
    """The runner returns fixed logits, one row per sampling piece (what `ModelRunner.execute` promises)."""
    logits = torch.randn(eng.max_slots + 1, VOCAB, generator=torch.Generator().manual_seed(0))
    eng.runner.execute = lambda work, tap=None: logits[: sum(1 for w in work if w.samples)]


def _stub_staging(eng: Engine, marks: dict) -> None:
    """The graph runner's replay and staging as stubs; each staged replay's start and each step's read-back of
    its samples are time-stamped."""
    logits = torch.randn(eng.max_slots + 1, VOCAB, generator=torch.Generator().manual_seed(0))
    eng.runner._replay = lambda work: logits[: len(work)]
    eng.runner.stage_decode = lambda seqs, ids: StagedDecode(list(seqs), None)

    def replay_staged(staged):
        marks["launch"].append(time.perf_counter())
        return logits[: len(staged.seqs)]

    def to_host(tokens, logprobs):
        out = _TO_HOST(tokens, logprobs)
        marks["read"].append(time.perf_counter())
        return out

    eng.runner.replay_staged = replay_staged
    engine_module._to_host = to_host


def host_us_per_step(c: int, steps: int, repeats: int, prompt: int = 128, staged: bool = False) -> dict:
    model = build_model("tiny", "stock", seed=1).eval()
    best = {"us_per_step": float("inf")}
    for _ in range(repeats):
        eng = Engine(model, max_slots=c + 2, max_batched_tokens=c * prompt + 64, max_model_len=prompt + steps + 64,
                     device_sampling=True, cuda_graphs=staged)
        marks = {"launch": [], "read": []}
        _stub_staging(eng, marks) if staged else _stub_runner(eng)
        for i in range(c):
            eng.add_request([(7 * i + j) % 50 + 3 for j in range(prompt)],
                            SamplingParams(max_new_tokens=steps + 16, seed=i, temperature=1.0, stop_token_ids=[]))
        eng.step()  # prefill (the budget holds every prompt: two pieces each, cut at the 64-token boundary)
        eng.step()
        while staged and eng._staged is None:  # until a decode step has staged the next
            eng.step()
        marks["launch"].clear(), marks["read"].clear()
        t = time.process_time()
        for _ in range(steps):
            eng.step()
        row = {"us_per_step": (time.process_time() - t) / steps * 1e6}
        engine_module._to_host = _TO_HOST
        if staged:  # every step replayed a staged step: read i -> launch i + 1
            assert len(marks["launch"]) == steps, "a step was not staged"
            gaps = sorted(1e6 * (b - a) for a, b in zip(marks["read"], marks["launch"][1:]))
            row["critical_us"] = gaps[len(gaps) // 2]
        best = min(best, row, key=lambda r: r["us_per_step"])
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
    ap.add_argument("--staged", action="store_true", help="the graph runner's path with staged steps")
    args = ap.parse_args()
    torch.set_num_threads(1)
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                           text=True).stdout.strip()
    rows = {}
    for c in map(int, args.concurrency.split(",")):
        r = host_us_per_step(c, args.steps, args.repeats, staged=args.staged)
        rows[c] = {k: round(v, 1) for k, v in r.items()} | {"us_per_seq_step": round(r["us_per_step"] / c, 2)}
        print(c, rows[c], flush=True)
    out = {"run": {"command": "python experiments/cpu/engine_host.py " + " ".join(
        f"--{k}" if v is True else f"--{k} {v}" for k, v in vars(args).items()
        if k not in ("out", "commit") and v not in (None, False)),
                   "commit": commit, "machine": _cpu_name(),
                   "torch": torch.__version__}, "results": rows}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
