"""The terminal agent's environment cost: one sandbox's lifecycle phase by phase, and scripted episodes per second
through the task's SandboxPool at several concurrencies, as an RL run drives them (env_workers threads).

    PYTHONPATH=src python benchmarks/sandbox.py --out DIR [--episodes 128] [--concurrency 1,2,4,8,16] [--cuda-gb 4]
        [--others 2000] [--proofs namespace,scan]

--cuda-gb N first makes this process look like a generator's: a CUDA context and N GB of device memory, plus
N GB of touched host memory (forking such a process costs more). --others N keeps N other root processes alive
meanwhile, as a machine running several agent runs has (each live sandbox is one or more processes). --proofs:
how a close proves that nothing of the sandbox runs, each measured in turn: ``namespace`` (the PID namespace
init's pidfd, the default) and ``scan`` (the /proc scan of the slot's uid at every start and close, the fallback).
Writes DIR/sandbox.json; asserts no time. Runs on any machine with bwrap (no GPU needed without --cuda-gb).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from common import git_commit

from zeromismatch.tasks.agent import processes
from zeromismatch.tasks.agent.offline import offline_agent_splits
from zeromismatch.tasks.agent.pool import SandboxPool
from zeromismatch.tasks.agent.sandbox import SandboxLimits, bwrap_available


def lifecycle(spec, limits: SandboxLimits, reps: int) -> dict:
    """Median ms of start (bwrap + the supervisor ready), one command, the verifier, close."""
    phases: dict[str, list[float]] = {"start": [], "command": [], "verify": [], "close": []}
    pool = SandboxPool(limits, max_concurrent=1)  # a slot (and its uid) claimed, as every sandbox of a run
    for _ in range(reps):
        marks = [time.perf_counter()]
        box = pool.acquire(spec.sandbox_spec())
        marks.append(time.perf_counter())
        box.run(spec.solution[0])
        marks.append(time.perf_counter())
        box.verify(spec.test_sh, spec.test_files)
        marks.append(time.perf_counter())
        pool.release(box)
        marks.append(time.perf_counter())
        for name, a, b in zip(phases, marks, marks[1:]):
            phases[name].append(b - a)
    return {k: round(1e3 * statistics.median(v), 2) for k, v in phases.items()}


def episodes(specs, limits: SandboxLimits, concurrency: int, workers: int) -> dict:
    """Every spec's scripted solution then the verifier, ``workers`` threads over one pool: episodes/s, reward."""
    pool = SandboxPool(limits, max_concurrent=concurrency)

    def play(spec) -> float:
        box = pool.acquire(spec.sandbox_spec())
        try:
            for cmd in spec.solution:
                box.run(cmd)
            return box.verify(spec.test_sh, spec.test_files)
        finally:
            pool.release(box)

    t = time.perf_counter()
    with cf.ThreadPoolExecutor(workers) as ex:
        rewards = list(ex.map(play, specs))
    wall = time.perf_counter() - t
    return {"concurrency": concurrency, "workers": workers, "episodes": len(specs), "wall_s": round(wall, 3),
            "episodes_per_s": round(len(specs) / wall, 2), "mean_reward": sum(rewards) / len(rewards),
            "commands": sum(len(s.solution) for s in specs)}


def cuda_ballast(gb: float):
    import torch

    dev = torch.empty(int(gb * (1 << 30)), dtype=torch.uint8, device="cuda")
    host = torch.ones(int(gb * (1 << 30)), dtype=torch.uint8)  # touched: page tables a fork copies
    return dev, host


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--commit", default=None)
    ap.add_argument("--episodes", type=int, default=128)
    ap.add_argument("--workers", type=int, default=8, help="env_workers threads (task.env_workers)")
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--cuda-gb", type=float, default=0.0)
    ap.add_argument("--others", type=int, default=0, help="other processes kept alive meanwhile")
    ap.add_argument("--proofs", default="namespace", help="comma-separated: namespace, scan")
    args = ap.parse_args()
    why = bwrap_available()
    if why:
        sys.exit(f"benchmarks/sandbox.py: {why}")
    proofs = args.proofs.split(",")
    if set(proofs) - {"namespace", "scan"}:
        sys.exit(f"benchmarks/sandbox.py: --proofs {args.proofs!r}: expected names from namespace, scan")
    ballast = cuda_ballast(args.cuda_gb) if args.cuda_gb else None
    others = [subprocess.Popen(["sleep", "3600"]) for _ in range(args.others)]
    specs = offline_agent_splits(args.episodes, 1, 0, None)["train"][: args.episodes]
    limits = SandboxLimits()
    out = {"command": " ".join(["python"] + sys.argv), "commit": git_commit(args.commit),
           "machine": {"host": platform.node(), "cores": len(os.sched_getaffinity(0)), "kernel": platform.release(),
                       "python": platform.python_version(), "as_root": os.geteuid() == 0},
           "cuda_gb": args.cuda_gb, "others": args.others,
           "processes_alive": sum(name.isdigit() for name in os.listdir("/proc")), "proofs": {}}
    real = processes.namespace_init_pidfd
    try:
        for proof in proofs:
            processes.namespace_init_pidfd = real if proof == "namespace" else (lambda info_r: None)
            out["proofs"][proof] = {
                "lifecycle_ms": lifecycle(specs[0], limits, args.reps),
                "episodes": [episodes(specs, limits, int(c), args.workers) for c in args.concurrency.split(",")]}
    finally:
        processes.namespace_init_pidfd = real
        for proc in others:
            proc.kill()
            proc.wait()
    del ballast
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "sandbox.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
