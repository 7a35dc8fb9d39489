"""Batch-invariant matmuls: every output row depends only on its own input row, never on how many rows (or batch
items) share the call. `linear` serves every projection of the `bi` / `bi_chunk` modes, `bmm` their blocked
attention.

- dispatch.py     `linear` and `bmm`: the CPU form or the CUDA one, by the tensor's device
- cpu.py          the CPU GEMM (fixed-shape row blocks, one MKL thread each)
- triton.py       the CUDA GEMM: fixed K order, no split-K; its tile config is chosen by the gemm policy
- bmm_triton.py   the CUDA batched matmul: tile config from the matrix shape only, never the batch count
- policy.py       the CUDA GEMM's tile policies (conf/numerics `gemm_policy`)
- autograd.py     a linear whose forward is a given kernel, its backward plain torch (triton.py, head.py)
- head.py         the fp32 lm_head (stock and invariant): bf16 operands, exact products, fp32 sums and logits
"""

from __future__ import annotations

from .dispatch import bmm, linear
from .head import invariant_logits, stock_logits
from .policy import DEFAULT_GEMM_POLICY, DEFAULT_HEAD, GEMM_POLICIES, HEAD_FORMS

__all__ = ["DEFAULT_GEMM_POLICY", "DEFAULT_HEAD", "GEMM_POLICIES", "HEAD_FORMS", "bmm", "invariant_logits", "linear",
           "stock_logits"]
