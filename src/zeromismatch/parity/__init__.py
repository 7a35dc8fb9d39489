"""Trainer/generator parity: the generate -> rescore -> compare check (check.py) that `job=parity`, the
parity tests (tests/parity, tests/gpu) and the GPU benchmarks share, and the per-op activation audit
(audit.py) that says where two sides first diverge."""

from .audit import ActivationAudit
from .check import ParityCheck, check_parity, compare_logprobs, generate, random_prompts, run_parity

__all__ = ["ActivationAudit", "ParityCheck", "check_parity", "compare_logprobs", "generate", "random_prompts", "run_parity"]
