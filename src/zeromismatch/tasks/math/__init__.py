"""Math RL task (DAPO recipe): data loaders, offline problems, the DAPO prompt, the reward, and
``MathTask`` (task.py), the RL task over all of it. math-verify is imported only inside the reward's
worker process (its timeouts need a process of their own).
"""

from zeromismatch.tasks.math.data import MathProblem, load_aime2025, load_dapo_math, load_math_problems
from zeromismatch.tasks.math.offline import OfflineProblem, offline_math_splits, write_offline_math
from zeromismatch.tasks.math.prompts import dapo_prompt, extract_answer, render_prompt, strip_dapo_template
from zeromismatch.tasks.math.reward import MathVerifier, batch_reward, math_reward
from zeromismatch.tasks.math.task import MathTask, ensure_offline_math, get_tokenizer, tiny_tokenizer, tokenizer_fingerprint

__all__ = [
    "MathProblem",
    "MathTask",
    "MathVerifier",
    "OfflineProblem",
    "batch_reward",
    "dapo_prompt",
    "ensure_offline_math",
    "extract_answer",
    "get_tokenizer",
    "load_aime2025",
    "load_dapo_math",
    "load_math_problems",
    "math_reward",
    "offline_math_splits",
    "render_prompt",
    "strip_dapo_template",
    "tiny_tokenizer",
    "tokenizer_fingerprint",
    "write_offline_math",
]
