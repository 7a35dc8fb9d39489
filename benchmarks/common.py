"""What every GPU benchmark shares: timing (do_bench median, CUDA-graph replay), inputs, and the JSON header
(command, commit, machine, versions, numerics policies) that names the run a number came from.

Benchmarks write JSON and never assert a time. Run from the repo root (`benchmarks/run_h200.sh` runs them all):

    PYTHONPATH=src python benchmarks/<name>.py --out DIR [--commit SHA]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEV = "cuda"


def parse_args(description: str, extra=None) -> argparse.Namespace:
    """--out (folder for the JSON) and --commit (the device copy of the tree may have no .git); exits in one
    line without CUDA or Triton."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--commit", default=None, help="git commit of the tree (default: git rev-parse HEAD)")
    if extra:
        extra(ap)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit(f"{os.path.basename(sys.argv[0])}: needs a CUDA device (none found)")
    try:
        import triton  # noqa: F401
    except ImportError:
        sys.exit(f"{os.path.basename(sys.argv[0])}: needs triton (pip install triton)")
    from zeromismatch.ops.device import configure_cuda

    configure_cuda()
    os.makedirs(args.out, exist_ok=True)
    return args


def git_commit(given: str | None) -> str:
    """``given`` (--commit), else the tree's HEAD."""
    if given:
        return given
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no .git: pass --commit)"


def _nvidia_smi() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "nvidia-smi unavailable"


def header(args: argparse.Namespace) -> dict:
    """The run's provenance: command, commit, machine, versions, and the numerics policies the kernels used."""
    import triton

    from zeromismatch.ops.gdn import DEFAULT_CHUNK_DOTS
    from zeromismatch.ops.gdn import chunk_triton, recurrent_triton
    from zeromismatch.ops.linear.policy import DEFAULT_GEMM_POLICY

    p = torch.cuda.get_device_properties(0)
    return {
        "command": " ".join(["python"] + sys.argv),
        "commit": git_commit(args.commit),
        "machine": {"gpu": torch.cuda.get_device_name(0), "sm_count": p.multi_processor_count,
                    "nvidia_smi": _nvidia_smi()},
        "versions": {"torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda},
        "numerics": {"gemm_policy": DEFAULT_GEMM_POLICY, "chunk_dots": DEFAULT_CHUNK_DOTS,
                     "recurrent_kernel": {"BV": recurrent_triton.BV, "num_warps": recurrent_triton.NUM_WARPS,
                                          "num_stages": recurrent_triton.NUM_STAGES},
                     "chunk_kernels": {"num_warps": chunk_triton.NUM_WARPS, "bv_max": chunk_triton.BV_MAX}},
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_json(args: argparse.Namespace, name: str, results: dict) -> str:
    """$OUT/<name>.json: {"run": header, "results": results}; rewritten as sections finish (a timeout keeps
    what was measured)."""
    path = os.path.join(args.out, f"{name}.json")
    if not hasattr(args, "_header"):
        args._header = header(args)
    with open(path, "w") as f:
        json.dump({"run": args._header, "results": results}, f, indent=1, default=str)
    return path


def log(*a) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def bench(fn, warmup: int = 10, rep: int = 40) -> float:
    """Median ms with CUDA events (triton.testing.do_bench)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def matmul_tflops(n: int = 8192) -> float:
    """This GPU's measured dense bf16 matmul rate (TFLOP/s): an n x n x n torch.matmul, median of `bench`."""
    a, b = rand(n, n, seed=1), rand(n, n, seed=2)
    return 2 * n**3 / (bench(lambda: a @ b, warmup=20, rep=100) * 1e-3) / 1e12


def bench_graph(fns, reps: int = 8) -> float:
    """GPU ms per call: the calls fns[0..n-1] (rotating over distinct inputs, more bytes than the L2) captured
    `reps` times in one CUDA graph and replayed, so the host's launch overhead is excluded."""
    for f in fns:
        f()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            for f in fns:
                f()
    return bench(lambda: g.replay(), warmup=10, rep=50) / (reps * len(fns))


def rand(*shape, dtype=torch.bfloat16, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator(device=DEV).manual_seed(seed)
    return (torch.randn(*shape, device=DEV, generator=g) * scale).to(dtype)


def cu_seqlens(lens) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device=DEV, dtype=torch.int32)


def kernel_profile(fn, title: str, reps: int = 1) -> str:
    """The top kernels of `reps` calls of fn (torch.profiler; kernels replayed from a CUDA graph included), how
    many ran and their GPU time, as a text table; the caller has warmed fn up."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_ms = sum(e.self_device_time_total for e in kernels) / 1e3 / reps
    head = f"== {title}: {len(kernels) / reps:.0f} kernels, {gpu_ms:.3f} ms of GPU kernel time per call\n"
    return head + prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=70)


def op_profile(fn, title: str, rows: int = 40) -> str:
    """The torch ops of one eager call of fn by GPU time, grouped by op and input shapes (what a graph replay's
    kernel list cannot say: which op of the model launched a kernel)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        fn()
        torch.cuda.synchronize()
    table = prof.key_averages(group_by_input_shape=True).table(
        sort_by="self_cuda_time_total", row_limit=rows, max_name_column_width=40, max_shapes_column_width=90)
    return f"== {title} (eager, one call, ops by GPU time)\n" + table
