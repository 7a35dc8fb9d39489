"""The published layouts: Search-R1's parquet rows and a wiki-18 style corpus JSONL, on fixture files the tests
write in those schemas."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zeromismatch.errors import InputFileError, MissingFileError
from zeromismatch.tasks.search.data import load_corpus_jsonl, load_search_r1_parquet
from zeromismatch.tasks.search.format import SEARCH_R1_TEMPLATE, format_passages
from zeromismatch.tasks.search.offline import generate_kb, split_questions, write_offline_search

ROWS = [
    {
        "id": "train_0", "question": "who got the first nobel prize in physics?", "golden_answers": ["Wilhelm Conrad Röntgen"],
        "data_source": "nq", "prompt": [{"role": "user", "content": SEARCH_R1_TEMPLATE.format(question="who got the first nobel prize in physics?")}],
        "ability": "fact-reasoning", "reward_model": {"style": "rule", "ground_truth": {"target": ["Wilhelm Conrad Röntgen"]}},
        "extra_info": {"split": "train", "index": 0},
    },
    {
        "id": "train_1", "question": "Which magazine was started first, Arthur's Magazine or First for Women?",
        "golden_answers": ["Arthur's Magazine", "Arthurs Magazine"], "data_source": "hotpotqa",
        "prompt": [{"role": "user", "content": "x"}], "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": ["Arthur's Magazine", "Arthurs Magazine"]}},
        "extra_info": {"split": "train", "index": 1},
    },
]  # fmt: skip


def test_search_r1_parquet(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    items = load_search_r1_parquet(path)
    assert [i.question for i in items] == [r["question"] for r in ROWS]
    assert items[1].golden_answers == ("Arthur's Magazine", "Arthurs Magazine")
    assert (items[0].data_source, items[0].id, items[0].extra["index"]) == ("nq", "train_0", 0)
    assert [i.id for i in load_search_r1_parquet(path, data_source="hotpotqa")] == ["train_1"]
    with pytest.raises(InputFileError, match="no rows with data_source='triviaqa'"):
        load_search_r1_parquet(path, data_source="triviaqa")


def test_search_r1_parquet_from_prompt_and_reward_model(tmp_path):
    """verl-only rows (no question / golden_answers columns): the question after 'Question:', the target."""
    path = tmp_path / "verl.parquet"
    rows = [{k: v for k, v in ROWS[0].items() if k not in ("question", "golden_answers")}]
    pq.write_table(pa.Table.from_pylist(rows), path)
    (item,) = load_search_r1_parquet(path)
    assert item.question == ROWS[0]["question"] and item.golden_answers == ("Wilhelm Conrad Röntgen",)


def test_search_r1_parquet_errors(tmp_path):
    with pytest.raises(MissingFileError, match="file not found"):
        load_search_r1_parquet(tmp_path / "none.parquet")
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "q", "golden_answers": []}]), bad)
    with pytest.raises(InputFileError, match="row 0: golden answers must be a non-empty list"):
        load_search_r1_parquet(bad)


def test_wiki_corpus_jsonl(tmp_path):
    path = tmp_path / "wiki-18.jsonl"
    lines = [{"id": "0", "contents": '"Aaron"\nAaron is a prophet.'}, {"id": "1", "title": "Abba", "text": "A band."}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    docs = load_corpus_jsonl(path)
    assert docs == [lines[0], {"id": "1", "contents": '"Abba"\nA band.'}]
    assert format_passages(docs) == "Doc 1(Title: Aaron) Aaron is a prophet.\nDoc 2(Title: Abba) A band.\n"
    assert format_passages([{"document": docs[0], "score": 1.5}]) == "Doc 1(Title: Aaron) Aaron is a prophet.\n"
    (tmp_path / "bad.jsonl").write_text('{"id": 1}\n')
    with pytest.raises(InputFileError, match=r"bad.jsonl:1: needs a JSON object with a string 'contents'"):
        load_corpus_jsonl(tmp_path / "bad.jsonl")


def test_offline_kb_is_deterministic_and_split_by_person(tmp_path):
    a = write_offline_search(tmp_path / "a", n_people=20, n_heldout=4, seed=3)
    b = write_offline_search(tmp_path / "b", n_people=20, n_heldout=4, seed=3)
    assert all(a[k].read_bytes() == b[k].read_bytes() for k in a)
    kb = generate_kb(20, 3)
    train, held = split_questions(kb, 4, 3)
    assert sorted(q.hops for q in held) == [1, 1, 2, 2]
    assert not {q.subject for q in held} & {q.subject for q in train}
    # the loaders read what the writer wrote
    assert [i.question for i in load_search_r1_parquet(a["eval"])] == [q.question for q in held]
    assert len(load_corpus_jsonl(a["corpus"])) == len(kb.passages)
