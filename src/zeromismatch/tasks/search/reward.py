"""Exact match with SQuAD normalization, the Search-R1 reward: the predicted answer, lowercased, without
punctuation, without the articles a / an / the and with whitespace collapsed, equals one gold answer so
normalized. No answer (None) scores 0."""

from __future__ import annotations

import re
import string
from collections.abc import Iterable

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD's normalization, in its order: lowercase, drop punctuation, drop articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str | None, golds: Iterable[str]) -> float:
    """1.0 when the normalized prediction equals any normalized gold answer, else 0.0 (also for None)."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in golds))
