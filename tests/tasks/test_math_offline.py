"""Offline math generator: determinism, verl layout, difficulty split, correctness, SFT file."""

import json
import random
import re
import statistics

import pyarrow.parquet as pq
import pytest

from zeromismatch.tasks.math.data import load_dapo_math
from zeromismatch.tasks.math.offline import (
    HELDOUT_SIZE,
    LEVEL_GENERATORS,
    generate_problems,
    make_problem,
    offline_math_splits,
    write_offline_math,
)
from zeromismatch.tasks.math.prompts import dapo_prompt, extract_answer


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("offline")
    return write_offline_math(out, n_train=500, seed=1)


def test_same_seed_same_bytes(written, tmp_path):
    again = write_offline_math(tmp_path, n_train=500, seed=1)
    for name, path in written.items():
        assert path.read_bytes() == again[name].read_bytes(), name


def test_seed_changes_train_not_heldout():
    a, b = offline_math_splits(200, seed=0), offline_math_splits(200, seed=1)
    assert a["train"] != b["train"]
    assert a["heldout"] == b["heldout"]
    assert offline_math_splits(200, seed=0) == a


def test_verl_schema(written):
    table = pq.read_table(written["train"])
    assert set(table.column_names) >= {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    rows = table.to_pylist()
    assert len(rows) == 500
    for row in rows:
        (message,) = row["prompt"]
        assert message["role"] == "user"
        assert message["content"].startswith(dapo_prompt("")[:40])
        assert isinstance(row["reward_model"]["ground_truth"], str)
        assert row["extra_info"]["level"] in LEVEL_GENERATORS
    assert pq.read_table(written["heldout"]).num_rows == HELDOUT_SIZE


def test_loader_reads_offline_splits(written, tmp_path):
    splits = offline_math_splits(500, seed=1)
    cache = {"cache_dir": str(tmp_path / "hf_cache")}
    for name in ("train", "heldout"):
        loaded = load_dapo_math(written[name], **cache)
        assert [(p.problem, p.answer) for p in loaded] == [(p.problem, str(p.answer)) for p in splits[name]]


def test_heldout_is_harder_distinct_and_disjoint():
    splits = offline_math_splits(5000, seed=0)
    train, heldout = splits["train"], splits["heldout"]
    assert len({p.problem for p in train}) == len(train) == 5000
    assert len(heldout) == HELDOUT_SIZE
    assert len({p.problem for p in heldout}) == HELDOUT_SIZE
    assert {p.level for p in heldout} <= {2, 3, 4}
    assert not {p.problem for p in heldout} & {p.problem for p in train}
    train_levels = [p.level for p in train]
    assert statistics.mean(p.level for p in heldout) > statistics.mean(train_levels) + 0.5
    # "mostly levels 1-3", yet every level shows up so held-out formats are not unseen
    assert sum(lvl <= 3 for lvl in train_levels) / len(train_levels) > 0.8
    assert set(train_levels) == {1, 2, 3, 4}


def test_problems_short_and_solutions_correct():
    rng = random.Random(0)
    expr = re.compile(r"What is ([\d\s+\-*()]+)\?")
    for level in LEVEL_GENERATORS:
        for _ in range(2000):
            p = make_problem(rng, level)
            assert len(p.problem) < 80 and len(p.solution) < 120, p
            assert p.solution.endswith(f"\nAnswer: {p.answer}")
            assert extract_answer(p.solution) == str(p.answer)
            if m := expr.fullmatch(p.problem):  # plain arithmetic: check the gold answer itself
                assert eval(m.group(1)) == p.answer, p  # only digits, spaces, + - * ( )
    with pytest.raises(ValueError, match="level must be one of"):
        make_problem(rng, 9)


def test_exhausted_level_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(LEVEL_GENERATORS, 1, (lambda rng: ("1 + 1?", "2\nAnswer: 2", 2),))
    assert len(generate_problems(1, seed=0, levels={1: 1.0})) == 1
    with pytest.raises(ValueError, match="no new level-1 problem.*ask for fewer"):
        generate_problems(2, seed=0, levels={1: 1.0})


def test_sft_jsonl(written):
    lines = written["sft"].read_text().splitlines()
    assert len(lines) == 500
    train = offline_math_splits(500, seed=1)["train"]
    for line, p in zip(lines, train):
        rec = json.loads(line)
        assert rec["problem"] == p.problem
        assert rec["prompt"] == dapo_prompt(p.problem)
        assert rec["response"] == p.solution
        assert rec["answer"] == str(p.answer)
        assert rec["level"] == p.level
