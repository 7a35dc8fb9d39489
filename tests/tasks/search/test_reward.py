"""Exact match with SQuAD normalization (the Search-R1 reward)."""

from __future__ import annotations

import pytest

from zeromismatch.tasks.search.reward import exact_match, normalize_answer


@pytest.mark.parametrize(
    "text, normalized",
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("  an   apple!  ", "apple"),
        ("U.S.A.", "usa"),
        ("A Tale of Two Cities", "tale of two cities"),
        ("Theatre", "theatre"),  # 'the' only as a word
        ("rock-'n'-roll", "rocknroll"),
        ("", ""),
    ],
)
def test_normalize_answer(text, normalized):
    assert normalize_answer(text) == normalized


def test_exact_match_against_any_gold():
    golds = ["Barack Obama", "Obama"]
    assert exact_match("obama.", golds) == 1.0
    assert exact_match("the Barack  Obama", golds) == 1.0
    assert exact_match("Michelle Obama", golds) == 0.0
    assert exact_match("Barack Obama was president", golds) == 0.0  # exact, not containment
    assert exact_match(None, golds) == 0.0
    assert exact_match("", ["a"]) == 1.0  # an article alone normalizes to the empty answer
    assert exact_match("x", []) == 0.0
