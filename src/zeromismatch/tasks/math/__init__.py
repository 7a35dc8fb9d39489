"""Math RL task (DAPO recipe): data loaders, offline problems, the DAPO prompt, the reward.

Cheap to import: ``datasets`` is imported only when a loader runs, and math-verify only inside
the reward's worker process.
"""

from zeromismatch.tasks.math.data import MathProblem, load_aime2025, load_dapo_math, load_math_problems
from zeromismatch.tasks.math.offline import OfflineProblem, offline_math_splits, write_offline_math
from zeromismatch.tasks.math.prompts import dapo_prompt, extract_answer, strip_dapo_template
from zeromismatch.tasks.math.reward import MathVerifier, batch_reward, math_reward

__all__ = [
    "MathProblem",
    "MathVerifier",
    "OfflineProblem",
    "batch_reward",
    "dapo_prompt",
    "extract_answer",
    "load_aime2025",
    "load_dapo_math",
    "load_math_problems",
    "math_reward",
    "offline_math_splits",
    "strip_dapo_template",
    "write_offline_math",
]
