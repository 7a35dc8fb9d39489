"""The opt-in gemm_policy=hybrid: bf16 GEMMs of M >= HYBRID_MIN_M on cuBLASLt with its workspace starved, the
rest on Triton. Rows must not depend on which side computed them (row-count invariance across the switch).
cuBLASLt reads its workspace size once, before CUDA starts, so the check runs in a fresh process."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

CHECK = """
import torch
from zeromismatch.ops.device import enable_cublaslt_invariant
enable_cublaslt_invariant()
from zeromismatch.ops.linear.triton import HYBRID_MIN_M, cublaslt_invariant_ready, linear_raw
assert cublaslt_invariant_ready()
g = torch.Generator(device="cuda").manual_seed(0)
for k, n in ((1024, 4096), (4096, 4096), (256, 512), (4096, 12352)):
    x = torch.randn(4096, k, device="cuda", generator=g).bfloat16()
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).bfloat16()
    full = linear_raw(x, w, policy="hybrid")
    for m in (1, 7, 64, 300, HYBRID_MIN_M - 1, HYBRID_MIN_M, 2048):
        assert torch.equal(linear_raw(x[:m], w, policy="hybrid"), full[:m]), (k, n, m)
print("hybrid invariant")
"""


def test_hybrid_policy_rows_invariant_across_the_switch():
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "hybrid invariant" in p.stdout, p.stderr[-3000:]
