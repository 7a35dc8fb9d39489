"""Loaders for the published Search-R1 layouts (and our offline files, written in the same layouts).

    items = load_search_r1_parquet("train.parquet")   # [QAItem(question, golden_answers, data_source, ...)]
    docs = load_corpus_jsonl("wiki-18.jsonl")          # [{"id", "contents"}], contents = '"Title"\\ntext'

Search-R1's parquet (its data scripts, verl layout) carries per row: ``id``, ``question``, ``golden_answers``
(a list), ``data_source`` (nq, hotpotqa, ...), ``prompt`` ([{role: user, content: instruction + question}]),
``ability``, ``reward_model`` ({style: rule, ground_truth: {target: [answers]}}) and ``extra_info``
({split, index}). Only the question and the answers are needed: a file without ``question`` /
``golden_answers`` columns is read from ``prompt`` (the text after "Question: ") and
``reward_model.ground_truth.target``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from ...errors import InputFileError, MissingFileError


@dataclass(frozen=True)
class QAItem:
    question: str
    golden_answers: tuple[str, ...]
    data_source: str = ""
    id: str = ""
    extra: dict = field(default_factory=dict, compare=False)  # extra_info of the row


def _answers(value, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(a, (str, int, float)) for a in value):
        raise InputFileError(f"{where}: golden answers must be a non-empty list of strings, got {value!r}")
    return tuple(str(a) for a in value)


def _question_from_prompt(prompt, where: str) -> str:
    text = prompt[-1]["content"] if isinstance(prompt, list) and prompt else prompt
    if not isinstance(text, str):
        raise InputFileError(f"{where}: no question column and no prompt text")
    return text.rsplit("Question:", 1)[-1].strip()


def load_search_r1_parquet(path: str | os.PathLike, data_source: str | None = None) -> list[QAItem]:
    """QA items of a Search-R1 parquet (module doc), optionally only rows of ``data_source``."""
    if not Path(path).is_file():
        raise MissingFileError(f"file not found: {path} (a Search-R1 parquet: question, golden_answers, data_source)")
    rows = pq.read_table(path).to_pylist()
    if not rows:
        raise InputFileError(f"{path}: no rows")
    cols = set(rows[0])
    if "question" not in cols and "prompt" not in cols:
        raise InputFileError(f"{path}: not the Search-R1 layout (question / golden_answers); found {sorted(cols)}")
    items = []
    for i, r in enumerate(rows):
        where = f"{path}, row {i}"
        q = r["question"] if r.get("question") is not None else _question_from_prompt(r.get("prompt"), where)
        gold = r.get("golden_answers")
        if gold is None:
            gold = ((r.get("reward_model") or {}).get("ground_truth") or {}).get("target")
        item = QAItem(str(q).strip(), _answers(gold, where), str(r.get("data_source") or ""), str(r.get("id") or i),
                      dict(r.get("extra_info") or {}))  # fmt: skip
        if data_source is None or item.data_source == data_source:
            items.append(item)
    if not items:
        raise InputFileError(f"{path}: no rows with data_source={data_source!r}")
    return items


def load_corpus_jsonl(path: str | os.PathLike) -> list[dict]:
    """Passages of a wiki-18 style JSONL: one ``{"id": ..., "contents": "\\"Title\\"\\ntext"}`` per line (a
    ``title`` + ``text`` line is accepted and turned into that form)."""
    if not Path(path).is_file():
        raise MissingFileError(f"file not found: {path} (a corpus JSONL: one {{\"id\", \"contents\"}} per line)")
    docs = []
    with open(path) as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputFileError(f"{path}:{n}: not JSON ({e.msg})") from None
            if isinstance(d, dict) and "contents" not in d and isinstance(d.get("text"), str):
                d = {"id": d.get("id", str(len(docs))), "contents": f'"{d.get("title", "")}"\n{d["text"]}'}
            if not isinstance(d, dict) or not isinstance(d.get("contents"), str):
                raise InputFileError(f"{path}:{n}: needs a JSON object with a string 'contents'")
            docs.append({"id": str(d.get("id", len(docs))), "contents": d["contents"]})
    if not docs:
        raise InputFileError(f"{path}: no passages")
    return docs
