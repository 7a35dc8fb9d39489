"""The CUDA GEMM's tile policies (triton.py says what each means); conf/numerics `gemm_policy` picks one."""

GEMM_POLICIES = ("fixed", "adaptive", "hybrid")
DEFAULT_GEMM_POLICY = "adaptive"
