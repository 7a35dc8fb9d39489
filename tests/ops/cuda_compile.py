"""Compile bi_chunk's GDN kernels for sm_90 (Hopper) on a machine without a GPU: Triton builds PTX and a cubin
without a driver. Each kernel at the launch options it runs with (ops/triton_math.EXACT, the warps of
chunk_triton's settings) and K = V = 128. Run as a script (a fresh process: kernels decorated while
TRITON_INTERPRET=1 is set are interpreted functions, which do not compile): prints {kernel_dots: {opcode: count}}
of each kernel's PTX as JSON. Used by tests/ops/test_cuda_compile.py and experiments/cpu/decode_ptx_compare.py."""

import collections
import json
import re

from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile

TARGET = GPUTarget("cuda", 90, 32)
INT_ARGS = {"HV": "i32", "T": "i32", "slot_ptr": "*i64", "pos_ptr": "*i32"}  # every other argument: *fp32


def kernels():
    """name -> (kernel, constexprs, warps) for each kernel and arithmetic it runs in."""
    from zeromismatch.ops.gdn import chunk_triton as ct
    from zeromismatch.ops.gdn import decode_triton as d

    w, base = ct.NUM_WARPS, {"K": 128, "C": 64, "KP": 128}
    out = {"chain_ieee": (d._decode_chain_kernel, {**base, "V": 128, "BV": 32}, w["chain"])}
    for dots in ("tf32", "ieee"):
        out[f"dot_{dots}"] = (d._decode_kernel, {**base, "V": 128, "BV": 32, "VSPLIT": 1, "DOTS": dots}, w["decode"])
        out[f"rows_{dots}"] = (d._decode_rows_kernel, {**base, "DOTS": dots}, w["rows"])
        out[f"values_{dots}"] = (d._decode_values_kernel, {**base, "V": 128, "BV": 32, "DOTS": dots}, w["values"])
        out[f"prep_{dots}"] = (ct._prep_kernel, {"K": 128, "V": 128, "C": 64, "BV": 64, "STORE_T": True, "DOTS": dots,
                                                 "WHOLE_TILE": dots != "ieee"}, w["prep"])
        out[f"scan_{dots}"] = (ct._scan_kernel, {"K": 128, "V": 128, "C": 64, "BV": 16, "STORE_STATES": True,
                                                 "STORE_U": True, "DOTS": dots}, w["scan"])
    return out


def ptx_opcodes(fn, consts: dict, warps: int) -> dict:
    from zeromismatch.ops.triton_math import EXACT

    consts = {k: v for k, v in consts.items() if k in fn.arg_names}
    types = {n: INT_ARGS.get(n, "*fp32") for n in fn.arg_names}
    types.update({k: "constexpr" for k in consts})
    src = ASTSource(fn, types, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
    ptx = compile(src, target=TARGET, options={"num_warps": warps, "num_stages": 1, **EXACT}).asm["ptx"]
    return dict(collections.Counter(m.group(1) for m in re.finditer(r"^\s*(?:@!?%p\d+\s+)?([a-z][\w.]*)\s", ptx, re.M)))


if __name__ == "__main__":
    print(json.dumps({name: ptx_opcodes(*spec) for name, spec in kernels().items()}))
