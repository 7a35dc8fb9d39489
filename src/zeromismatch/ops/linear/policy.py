"""The CUDA GEMM's tile policies (triton.py says what each means; conf/numerics `gemm_policy` picks one) and the
lm_head's forms (head.py; `lm_head`)."""

GEMM_POLICIES = ("fixed", "adaptive", "hybrid")
DEFAULT_GEMM_POLICY = "adaptive"

# the fp32 lm_head's CUDA form (conf/numerics `lm_head`; head.py): bf16 operands into an fp32 tensor-core
# accumulator, or the fp32 GEMM of the casts
HEAD_FORMS = ("tensor_core", "fp32")
DEFAULT_HEAD = "tensor_core"
