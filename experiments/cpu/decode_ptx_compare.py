#!/usr/bin/env python
"""Compile bi_chunk's GDN kernels for sm_90 on a machine without a GPU from two source trees and compare them: per
kernel and arithmetic, the PTX instruction counts by opcode (tests/ops/cuda_compile.py compiles them). For a
change meant to move code without changing arithmetic (helpers factored out, lines reordered), equal counts of every
floating-point opcode mean the same operations run, in an order the compiler chose; a GPU run then checks the bits.

    python experiments/cpu/decode_ptx_compare.py OLD_SRC NEW_SRC [--out FILE.json]

OLD_SRC / NEW_SRC: folders holding the `zeromismatch` package (`git archive <commit> src | tar -x -C DIR`: DIR/src).
Each tree compiles in its own process.
"""

import argparse
import json
import os
import re
import subprocess
import sys

COMPILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "ops", "cuda_compile.py")
FP = re.compile(r".*(\.f32|\.f16|\.bf16|\.tf32|mma|ex2|lg2)")  # floating-point opcodes (integer ones: addressing)


def opcodes(tree: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.abspath(tree)
    res = subprocess.run([sys.executable, COMPILE], env=env, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old_src")
    ap.add_argument("new_src")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    old, new = opcodes(args.old_src), opcodes(args.new_src)
    report = {}
    for kernel in sorted(set(old) & set(new)):
        a, b = old[kernel], new[kernel]
        diff = {op: [a.get(op, 0), b.get(op, 0)] for op in sorted(set(a) | set(b)) if a.get(op, 0) != b.get(op, 0)}
        report[kernel] = {"instructions": [sum(a.values()), sum(b.values())],
                          "fp_opcode_diffs": {op: v for op, v in diff.items() if FP.match(op)},
                          "other_opcode_diffs": {op: v for op, v in diff.items() if not FP.match(op)}}
        print(kernel, report[kernel])
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": " ".join(["python"] + sys.argv), "report": report}, f, indent=1)


if __name__ == "__main__":
    main()
