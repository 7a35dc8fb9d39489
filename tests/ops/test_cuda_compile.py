"""bi_chunk's GDN kernels compile for the GPU they run on (sm_90), here on a CPU: Triton's interpreter, which
runs them in the other tests of this folder, executes Python and accepts constructs the compiler rejects. And
the compiled arithmetic is the designed one: the tf32 kernels' products are tensor-core mma instructions (the
bit-equality of decode and chunked rows rests on their row independence), the ieee ones have none."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")
HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(os.path.dirname(HERE)), "src")


@pytest.fixture(scope="module")
def opcodes():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([SRC, env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, os.path.join(HERE, "cuda_compile.py")], env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kernel", ["dot", "rows", "values", "prep", "scan"])
def test_tf32_kernels_compile_to_tensor_core_products(opcodes, kernel):
    ops = opcodes[f"{kernel}_tf32"]
    assert any(op.startswith("mma.sync") or op.startswith("wgmma") for op in ops), sorted(ops)


@pytest.mark.parametrize("kernel", ["chain", "dot", "rows", "values", "prep", "scan"])
def test_ieee_kernels_compile_to_fma_chains(opcodes, kernel):
    ops = opcodes[f"{kernel}_ieee"]
    assert not any("mma" in op for op in ops) and any(op.startswith("fma.rn.f32") for op in ops), sorted(ops)
