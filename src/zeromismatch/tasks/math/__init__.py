"""Math RL task (DAPO recipe): data loaders, offline problems, the DAPO prompt, the reward.

Cheap to import: ``datasets`` is imported only when a loader runs, and math-verify only inside
the reward's worker process. ``MathTask`` (task.py) is the RL task over all of it.
"""

from zeromismatch.tasks.math.data import MathProblem, load_aime2025, load_dapo_math, load_math_problems
from zeromismatch.tasks.math.offline import OfflineProblem, offline_math_splits, write_offline_math
from zeromismatch.tasks.math.prompts import dapo_prompt, extract_answer, strip_dapo_template
from zeromismatch.tasks.math.reward import MathVerifier, batch_reward, math_reward

# task.py needs tasks/tokenizer.py, which imports this package's prompts module: export its names lazily
# (PEP 562) so that importing either module first works.
_TASK_NAMES = ("MathTask", "ensure_offline_math", "get_tokenizer", "tiny_tokenizer", "tokenizer_fingerprint")


def __getattr__(name: str):
    if name in _TASK_NAMES:
        from zeromismatch.tasks.math import task

        return getattr(task, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    "strip_dapo_template",
    "tiny_tokenizer",
    "tokenizer_fingerprint",
    "write_offline_math",
]
