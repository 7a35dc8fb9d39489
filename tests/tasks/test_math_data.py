"""Loaders: both DAPO layouts, AIME-style dumps, local files and directories, clear errors."""

import json

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zeromismatch.tasks.math import data as math_data
from zeromismatch.tasks.math.data import MathProblem, load_aime2025, load_dapo_math, load_math_problems
from zeromismatch.tasks.math.prompts import dapo_prompt


@pytest.fixture
def cache(tmp_path):
    # Keep datasets' arrow cache inside the test's tmp dir instead of ~/.cache.
    return {"cache_dir": str(tmp_path / "hf_cache")}


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def verl_rows():
    return [
        {
            "data_source": "math_dapo",
            "prompt": [{"role": "user", "content": dapo_prompt("What is $1+1$?")}],
            "ability": "MATH",
            "reward_model": {"ground_truth": "2", "style": "rule-lang"},
            "extra_info": {"index": "a1"},
        },
        {
            # No DAPO wrapper: the raw content is kept as the problem.
            "data_source": "math_dapo",
            "prompt": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Compute \\frac{1}{2} + \\frac{1}{4}."},
            ],
            "ability": "MATH",
            "reward_model": {"ground_truth": "\\frac{3}{4}", "style": "rule-lang"},
            "extra_info": {"index": "a2"},
        },
    ]


EXPECTED_VERL = [
    MathProblem("What is $1+1$?", "2", "math_dapo", 0),
    MathProblem("Compute \\frac{1}{2} + \\frac{1}{4}.", "\\frac{3}{4}", "math_dapo", 1),
]


def test_verl_parquet(tmp_path, cache):
    path = write_parquet(tmp_path / "dapo.parquet", verl_rows())
    assert load_dapo_math(path, **cache) == EXPECTED_VERL


def test_verl_jsonl(tmp_path, cache):
    path = write_jsonl(tmp_path / "dapo.jsonl", verl_rows())
    assert load_dapo_math(str(path), **cache) == EXPECTED_VERL


def test_processed_layouts(tmp_path, cache):
    # open-r1 style: bare problem in `prompt`, answer in `solution`.
    processed = [
        {"prompt": "Find 2+3.", "solution": "5", "data_source": "math_dapo"},
        {"prompt": dapo_prompt("Find 7*6."), "solution": "42", "data_source": "math_dapo"},
    ]
    got = load_dapo_math(write_parquet(tmp_path / "p.parquet", processed), **cache)
    assert [(p.problem, p.answer) for p in got] == [("Find 2+3.", "5"), ("Find 7*6.", "42")]

    # `source_prompt` + `ground_truth`, no data_source: the file stem names the source.
    other = [{"source_prompt": "Find 9-4.", "ground_truth": "5"}]
    got = load_dapo_math(write_jsonl(tmp_path / "q.jsonl", other), **cache)
    assert got == [MathProblem("Find 9-4.", "5", "q", 0)]


def test_dapo_dedupe(tmp_path, cache):
    # The verl release repeats every problem ~100 times; load_dapo_math keeps the first copy.
    rows = verl_rows()
    path = write_parquet(tmp_path / "dup.parquet", [rows[0], rows[1], rows[0], rows[1], rows[0]])
    assert load_dapo_math(path, **cache) == EXPECTED_VERL
    assert len(load_dapo_math(path, dedupe=False, **cache)) == 5
    assert [p.idx for p in load_math_problems(path, **cache)] == [0, 1, 2, 3, 4]


def test_directory_picks_split_files(tmp_path, cache):
    write_parquet(tmp_path / "train.parquet", verl_rows())
    write_parquet(tmp_path / "test.parquet", verl_rows()[:1])
    assert len(load_dapo_math(tmp_path, split="train", **cache)) == 2
    assert len(load_dapo_math(tmp_path, split="test", **cache)) == 1


def test_aime_style(tmp_path, cache):
    rows = [{"problem_idx": i + 1, "problem": f"AIME problem {i}", "answer": 100 + i} for i in range(30)]
    got = load_aime2025(write_parquet(tmp_path / "aime.parquet", rows), **cache)
    assert len(got) == 30
    assert got[7] == MathProblem("AIME problem 7", "107", "aime", 7)

    # opencompass style: `question`, and a worked `solution` that must not be taken as the answer.
    rows = [{"question": f"Q{i}", "answer": str(i), "solution": "long text"} for i in range(30)]
    got = load_aime2025(write_jsonl(tmp_path / "aime2.jsonl", rows), **cache)
    assert [p.answer for p in got] == [str(i) for i in range(30)]

    with pytest.raises(ValueError, match="expected 30"):
        load_aime2025(write_jsonl(tmp_path / "short.jsonl", rows[:15]), **cache)


def test_hub_name_goes_to_load_dataset(monkeypatch):
    calls = []

    def fake_load_dataset(name, split=None, **kwargs):
        calls.append((name, split, kwargs))
        return datasets.Dataset.from_list([{"problem": f"P{i}", "answer": str(i)} for i in range(30)])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    got = load_aime2025()
    assert calls == [(math_data.AIME2025_HUB_NAME, "train", {})]
    assert got[0] == MathProblem("P0", "0", math_data.AIME2025_HUB_NAME, 0)


def test_missing_answer_column_names_file_and_column(tmp_path, cache):
    path = write_parquet(tmp_path / "bad.parquet", [{"prompt": "x", "data_source": "d"}])
    with pytest.raises(ValueError, match=r"bad\.parquet.*no answer column.*reward_model"):
        load_math_problems(path, **cache)


def test_missing_problem_column(tmp_path, cache):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"text": "x", "answer": "1"}])
    with pytest.raises(ValueError, match=r"bad\.jsonl.*no problem column.*'prompt'"):
        load_math_problems(path, **cache)


def test_malformed_rows(tmp_path, cache):
    no_gt = [{"prompt": [{"role": "user", "content": "x"}], "reward_model": {"style": "rule"}}]
    with pytest.raises(ValueError, match=r"no_gt\.jsonl, row 0.*ground_truth"):
        load_math_problems(write_jsonl(tmp_path / "no_gt.jsonl", no_gt), **cache)

    no_user = [{"prompt": [{"role": "system", "content": "x"}], "reward_model": {"ground_truth": "1"}}]
    with pytest.raises(ValueError, match=r"no_user\.jsonl, row 0.*user message"):
        load_math_problems(write_jsonl(tmp_path / "no_user.jsonl", no_user), **cache)

    empty = [{"problem": "ok", "answer": "1"}, {"problem": "ok", "answer": ""}]
    with pytest.raises(ValueError, match=r"empty\.jsonl, row 1.*'answer'"):
        load_math_problems(write_jsonl(tmp_path / "empty.jsonl", empty), **cache)


def test_bad_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.parquet"):
        load_math_problems(tmp_path / "missing.parquet")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ValueError, match="unsupported file type"):
        load_math_problems(tmp_path / "notes.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no .* files"):
        load_math_problems(tmp_path / "empty")
