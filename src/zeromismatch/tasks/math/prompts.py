"""The DAPO math prompt, its rendering through a chat template, and the answer extraction that goes
with it.

DAPO-Math-17k asks for the final answer on a last line of the form ``Answer: <answer>``; the
reward reads that line back. Both halves live here so the template and the parser cannot drift.
"""

from __future__ import annotations

import re

from zeromismatch.tasks.tokenizer import render_chat

# Exact wrapper text of DAPO-Math-17k (verl parquet), so that prompts we render for our own data
# are token-for-token the prompts the published runs trained on, and so the loader can strip it.
DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of "
    "the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'

# Case-insensitive like the DAPO reward; "**Answer:** 42" (markdown) also matches.
_ANSWER_RE = re.compile(r"answer\s*:", re.IGNORECASE)


def dapo_prompt(problem: str) -> str:
    """User-turn text for a bare problem: the DAPO instruction wrapped around it."""
    return f"{DAPO_PREFIX}{problem}{DAPO_SUFFIX}"


def strip_dapo_template(text: str) -> str | None:
    """The bare problem if ``text`` is exactly ``dapo_prompt(problem)``, else None."""
    if text.startswith(DAPO_PREFIX) and text.endswith(DAPO_SUFFIX):
        return text[len(DAPO_PREFIX) : len(text) - len(DAPO_SUFFIX)]
    return None


def extract_answer(text: str | None) -> str | None:
    """The answer written after the last ``Answer:`` in ``text``, or None if there is none.

    Takes the rest of that line; when it is empty ("Answer:\\n42") the next non-empty line.
    Light clean-up only (markdown bold, a trailing full stop, enclosing ``$``/``\\(..\\)``), since
    math-verify does the real normalization.
    """
    if not isinstance(text, str):
        return None
    last = None
    for last in _ANSWER_RE.finditer(text):
        pass
    if last is None:
        return None
    rest = text[last.end() :]
    lines = rest.split("\n")
    candidate = lines[0].strip(" \t*")
    if not candidate:
        candidate = next((ln.strip(" \t*") for ln in lines[1:] if ln.strip(" \t*")), "")
    candidate = clean_answer(candidate)
    return candidate or None


def clean_answer(answer: str) -> str:
    """Strip decoration around a final answer: whitespace, bold, trailing '.', math delimiters."""
    a = answer.strip().strip("*").strip()
    a = a.rstrip(".").strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(a) >= len(left) + len(right) and a.startswith(left) and a.endswith(right):
            a = a[len(left) : len(a) - len(right)].strip()
            break
    return a.rstrip(".").strip()


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text`` (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return None  # unbalanced: a truncated response, nothing to grade


_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")


def last_number(text: str) -> str | None:
    """The last number (integer or decimal) in ``text``, or None."""
    last = None
    for last in _NUMBER_RE.finditer(text):
        pass
    return last.group(0) if last else None


def render_prompt(
    tokenizer, problem_text: str, *, dapo_template: bool = True, **template_kwargs
) -> list[int]:
    """Token ids of the chat-formatted user turn plus the assistant header (generation prompt).

    With ``dapo_template`` the bare problem is first wrapped in the DAPO instruction; pass False
    when ``problem_text`` is already the full user message. ``template_kwargs`` reach the chat
    template (e.g. ``enable_thinking=False`` for Qwen3.5).
    """
    return render_chat(tokenizer, dapo_prompt(problem_text) if dapo_template else problem_text, **template_kwargs)
