#!/usr/bin/env python
"""Compile bi_chunk's decode kernels for sm_90 on a machine without a GPU (Triton compiles to PTX without a driver)
from two source trees and compare them: per kernel and arithmetic, the PTX instruction counts by opcode. For a
change meant to move code without changing arithmetic (helpers factored out, lines reordered), equal counts of every
floating-point opcode mean the same operations run, in an order the compiler chose; a GPU run then checks the bits.

    python experiments/cpu/decode_ptx_compare.py OLD_SRC NEW_SRC [--out FILE.json]

OLD_SRC / NEW_SRC: folders holding the `zeromismatch` package (`git archive <commit> src | tar -x -C DIR`: DIR/src).
Each tree compiles in its own process.
"""

import argparse
import collections
import json
import os
import re
import subprocess
import sys

KERNELS = {  # name -> (kernel, extra constexprs, warps)
    "dot": ("_decode_kernel", {"V": 128, "BV": 32, "VSPLIT": 1}, 4),
    "rows": ("_decode_rows_kernel", {}, 2),
    "values": ("_decode_values_kernel", {"V": 128, "BV": 32}, 4),
}


def opcode_counts() -> dict:
    """In a child process whose sys.path starts at one tree: {kernel_dots: {opcode: count}}."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from zeromismatch.ops.gdn import decode_triton
    from zeromismatch.ops.triton_math import EXACT

    out = {}
    for dots in ("tf32", "ieee"):
        for name, (attr, extra, warps) in KERNELS.items():
            fn = getattr(decode_triton, attr)
            consts = {"K": 128, "C": 64, "KP": 128, "DOTS": dots, **extra}
            consts = {k: v for k, v in consts.items() if k in fn.arg_names}
            types = {n: "*fp32" for n in fn.arg_names}
            types.update({"HV": "i32", "slot_ptr": "*i64", "pos_ptr": "*i32", **{k: "constexpr" for k in consts}})
            src = ASTSource(fn, types, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
            ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                 options={"num_warps": warps, "num_stages": 1, **EXACT}).asm["ptx"]
            ops = collections.Counter(m.group(1) for m in re.finditer(r"^\s*(?:@!?%p\d+\s+)?([a-z][\w.]*)\s", ptx, re.M))
            out[f"{name}_{dots}"] = dict(ops)
    return out


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "--child":
        print(json.dumps(opcode_counts()))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old_src")
    ap.add_argument("new_src")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    counts = {}
    for side, tree in (("old", args.old_src), ("new", args.new_src)):
        env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
        env.pop("TRITON_INTERPRET", None)
        res = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True, check=True)
        counts[side] = json.loads(res.stdout.strip().splitlines()[-1])
    fp = re.compile(r".*(\.f32|\.f16|\.bf16|\.tf32|mma|ex2|lg2)")  # floating-point opcodes (integer ones: addressing)
    report = {}
    for kernel in counts["old"]:
        a, b = counts["old"][kernel], counts["new"][kernel]
        diff = {op: [a.get(op, 0), b.get(op, 0)] for op in set(a) | set(b) if a.get(op, 0) != b.get(op, 0)}
        report[kernel] = {"instructions": [sum(a.values()), sum(b.values())],
                          "fp_opcode_diffs": {op: v for op, v in diff.items() if fp.match(op)},
                          "other_opcode_diffs": {op: v for op, v in diff.items() if not fp.match(op)}}
        print(kernel, report[kernel])
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": " ".join(["python"] + sys.argv), "report": report}, f, indent=1)


if __name__ == "__main__":
    main()
