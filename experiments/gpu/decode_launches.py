#!/usr/bin/env python
"""Kernel launches in one engine decode step on the CUDA path, counted on a CPU under Triton's interpreter: every
torch op that launches a kernel (views and metadata ops left out) plus every Triton launch, per numerics mode.
A machine-independent count of what a decode step asks of the GPU (a graph replays the same launches).

    TRITON_INTERPRET=1 PYTHONPATH=src python experiments/gpu/decode_launches.py --out FILE.json \
        [--model tiny] [--layers N] [--eager]
"""

import argparse
import collections
import json
import os
import sys

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("set TRITON_INTERPRET=1 (zeromismatch.ops.device reads it at import)")

import torch  # noqa: E402
import triton.runtime.interpreter as interp  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from zeromismatch.generator import Engine, SamplingParams  # noqa: E402
from zeromismatch.models.qwen3_5 import build_model  # noqa: E402
from zeromismatch.ops.interpreter import emulate_gpu_arithmetic  # noqa: E402

NO_KERNEL = {"view", "_unsafe_view", "reshape", "expand", "slice", "select", "transpose", "t", "permute",
             "unsqueeze", "squeeze", "as_strided", "alias", "detach", "split", "split_with_sizes", "chunk", "unbind",
             "narrow", "lift_fresh", "empty", "empty_strided", "empty_like", "is_nonzero", "sym_size", "sym_stride",
             "new_empty", "new_empty_strided", "view_as", "_reshape_alias", "unflatten", "flatten", "diagonal",
             "promote_types", "result_type"}


class Launches(TorchDispatchMode):
    """Counts kernel-launching torch ops and Triton launches (the interpreter's own copies of a launch's
    arguments are not counted)."""

    def __init__(self):
        super().__init__()
        self.counts, self.inside = collections.Counter(), False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in NO_KERNEL and not self.inside:
            self.counts["aten." + name] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        run, mode = interp.GridExecutor.__call__, self

        def counted(grid, *a, **k):
            mode.counts["triton." + grid.fn.__name__] += 1
            mode.inside = True
            try:
                return run(grid, *a, **k)
            finally:
                mode.inside = False

        self._saved, interp.GridExecutor.__call__ = run, counted
        return super().__enter__()

    def __exit__(self, *exc):
        interp.GridExecutor.__call__ = self._saved
        return super().__exit__(*exc)


def decode_step_launches(model_name: str, mode: str, seqs: int = 2, graphs: bool = True,
                         **overrides) -> collections.Counter:
    """graphs=True: the GPU's decode path, the CUDA-graph runner's bucketed step (run without capture: a replay
    launches the same kernels) with the device sampler; False: the eager step with the host sampler."""
    model = build_model(model_name, mode, seed=1, **overrides).eval()
    eng = Engine(model, max_slots=seqs + 2, max_batched_tokens=256, max_model_len=256, cuda_graphs=graphs,
                 device_sampling=graphs)
    for i in range(seqs):
        eng.add_request(list(range(3 + i, 40 + i)), SamplingParams(max_new_tokens=8, seed=i))
    with torch.no_grad():
        while eng.waiting or any(s.num_uncomputed > 1 for s in eng.running):
            eng.step()
        eng.step()
        with Launches() as count:
            eng.step()  # one decode step: every sequence adds a token
    return count.counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--modes", default="stock,bi,bi_chunk")
    ap.add_argument("--eager", action="store_true", help="the eager step with the host sampler instead")
    ap.add_argument("--layers", type=int, default=None, help="the preset with this many layers (its layer pattern)")
    args = ap.parse_args()
    overrides = {} if args.layers is None else {"num_hidden_layers": args.layers}
    path = "eager, host sampler" if args.eager else "graph runner, device sampler"
    out = {"model": args.model, **overrides, "path": path, "modes": {}}
    with emulate_gpu_arithmetic():
        for mode in args.modes.split(","):
            c = decode_step_launches(args.model, mode, graphs=not args.eager, **overrides)
            out["modes"][mode] = {"launches": sum(c.values()),
                                  "triton": sum(v for k, v in c.items() if k.startswith("triton.")),
                                  "by_op": dict(c.most_common())}
            print(mode, out["modes"][mode]["launches"], flush=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
