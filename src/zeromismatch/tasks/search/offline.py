"""An offline knowledge base generated from a seed: people (born in a city, with an occupation), cities (in a
country), the passages a retriever indexes, and questions that need one search (where was X born? what is X's
job? which country is city C in?) or two (which country was X born in? -> X's city, then that city's country).

    kb = generate_kb(n_people=300, seed=0)        # deterministic: same arguments, same KB
    files = write_offline_search(out_dir, n_people=300, n_heldout=40, seed=0)

Files (the published layouts, so the loaders of data.py read both ours and the real ones):
- ``corpus.jsonl``: wiki-18 style, one ``{"id": "12", "contents": "\\"Title\\"\\ntext"}`` per passage;
- ``train.parquet`` / ``heldout.parquet``: Search-R1's rows (``id``, ``question``, ``golden_answers``,
  ``data_source``, ``prompt``, ``ability``, ``reward_model.ground_truth.target``, ``extra_info``);
- ``sft.jsonl``: one scripted demonstration per train question: its searches (query + the ids of the passages
  the retriever returns, found by the same BM25 index the service serves), the answer, ``level`` = hops.

Held-out questions are about people none of whose questions are in train, half single-hop, half two-hop.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .format import SEARCH_R1_TEMPLATE
from .index import BM25Index

# People have one-word names of two syllables (576 possible): a tiny tokenizer gives each its own token, so a
# search query is one copied token, which a 4-layer model learns within a few minutes of SFT.
SYLLABLES = (
    "ba", "co", "da", "fe", "go", "ha", "ki", "lo", "ma", "no", "pe", "ro", "sa", "tu", "vi", "we", "zo", "ri",
    "mu", "ne", "ta", "jo", "li", "du",
)  # fmt: skip
CITIES = (
    "Amberly", "Brisk", "Caldor", "Dunmere", "Elmont", "Falkirk", "Glenrow", "Harwick", "Islay", "Jorvik",
    "Kestrel", "Lyndon", "Marrow", "Norwood", "Oakham", "Pellar", "Quarry", "Redhill", "Stanby", "Thornby",
    "Umber", "Valemo", "Westby", "Yarrow",
)  # fmt: skip
COUNTRIES = ("Aldoria", "Brevia", "Cantor", "Delmar", "Estria", "Fennland", "Galia", "Hollin")
JOBS = ("baker", "pilot", "doctor", "farmer", "singer", "painter", "teacher", "sailor", "judge", "miner", "tailor", "poet")
DATA_SOURCE = "offline_kb"


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str

    def contents(self) -> str:
        """wiki-18's ``contents``: the quoted title, a newline, the text."""
        return f'"{self.title}"\n{self.text}'


@dataclass(frozen=True)
class Question:
    question: str
    answer: str
    hops: int
    queries: tuple[str, ...]  # what a scripted demonstration searches, in order
    subject: str  # the person (or city) it is about: the train / held-out split is by subject


@dataclass(frozen=True)
class KnowledgeBase:
    passages: list[Passage]
    questions: list[Question]


def generate_kb(n_people: int = 300, seed: int = 0) -> KnowledgeBase:
    """People with unique names (not a city's), each born in a city and with an occupation; each city in a country."""
    rng = random.Random(f"search-kb:{seed}")
    country_of = {c: rng.choice(COUNTRIES) for c in CITIES}
    names: list[str] = []
    seen = set()
    if n_people > len(SYLLABLES) ** 2:
        raise ValueError(f"n_people={n_people}: at most {len(SYLLABLES) ** 2} distinct names")
    while len(names) < n_people:
        name = "".join(rng.choice(SYLLABLES) for _ in range(2)).capitalize()
        if name not in seen and name not in CITIES:
            seen.add(name)
            names.append(name)
    passages, questions = [], []
    for city in CITIES:
        passages.append(Passage(str(len(passages)), city, f"{city} is a city in {country_of[city]}."))
        questions.append(Question(f"Which country is {city} in?", country_of[city], 1, (city,), city))
    for name in names:
        city, job = rng.choice(CITIES), rng.choice(JOBS)
        passages.append(Passage(str(len(passages)), name, f"{name} was born in {city} and works as a {job}."))
        questions += [
            Question(f"Where was {name} born?", city, 1, (name,), name),
            Question(f"What is the job of {name}?", job, 1, (name,), name),
            Question(f"Which country was {name} born in?", country_of[city], 2, (name, city), name),
        ]
    return KnowledgeBase(passages, questions)


def split_questions(kb: KnowledgeBase, n_heldout: int, seed: int) -> tuple[list[Question], list[Question]]:
    """(train, held-out): held-out = n_heldout questions (half two-hop) about people kept out of train."""
    rng = random.Random(f"search-split:{seed}")
    people = sorted({q.subject for q in kb.questions if q.hops == 2})
    rng.shuffle(people)
    held_people = set(people[:n_heldout])
    by_person = {p: [q for q in kb.questions if q.subject == p] for p in held_people}
    heldout = []
    for i, p in enumerate(people[:n_heldout]):  # alternate one- and two-hop
        qs = by_person[p]
        heldout.append(next(q for q in qs if q.hops == 2) if i % 2 else rng.choice([q for q in qs if q.hops == 1]))
    train = [q for q in kb.questions if q.subject not in held_people]
    return train, heldout


def _rows(questions: list[Question], split: str, template: str) -> pa.Table:
    return pa.Table.from_pylist([
        {
            "id": f"{split}_{i}",
            "question": q.question,
            "golden_answers": [q.answer],
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": template.format(question=q.question)}],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": [q.answer]}},
            "extra_info": {"split": split, "index": i, "hops": q.hops},
        }
        for i, q in enumerate(questions)
    ])  # fmt: skip


def write_offline_search(
    out_dir: str | Path, n_people: int = 300, n_heldout: int = 40, seed: int = 0, topk: int = 3
) -> dict[str, Path]:
    """Write corpus.jsonl, train.parquet, heldout.parquet and sft.jsonl (module doc) to ``out_dir``; the SFT
    searches record the top-``topk`` passages of the BM25 index over the corpus. Same arguments, same bytes."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    kb = generate_kb(n_people, seed)
    train, heldout = split_questions(kb, n_heldout, seed)
    files = {k: out / n for k, n in (("corpus", "corpus.jsonl"), ("train", "train.parquet"),
                                     ("eval", "heldout.parquet"), ("sft", "sft.jsonl"))}  # fmt: skip
    with open(files["corpus"], "w") as f:
        for p in kb.passages:
            f.write(json.dumps({"id": p.id, "contents": p.contents()}) + "\n")
    pq.write_table(_rows(train, "train", SEARCH_R1_TEMPLATE), files["train"])
    pq.write_table(_rows(heldout, "test", SEARCH_R1_TEMPLATE), files["eval"])
    index = BM25Index([{"id": p.id, "contents": p.contents()} for p in kb.passages])
    with open(files["sft"], "w") as f:
        for q in train:
            searches = [{"query": s, "doc_ids": [d["id"] for d in index.search(s, topk)]} for s in q.queries]
            response = " ".join(f"<search> {s['query']} </search>" for s in searches) + f" <answer> {q.answer} </answer>"
            f.write(json.dumps({"prompt": q.question, "response": response, "searches": searches,
                                "answer": q.answer, "golden_answers": [q.answer], "level": q.hops}) + "\n")  # fmt: skip
    return files


def tokenizer_corpus(kb: KnowledgeBase, template: str) -> list[str]:
    """Texts a tiny tokenizer trains on: every passage and question, and the instruction (a few copies: enough
    for BPE to merge it into words without making it most of the corpus)."""
    return [p.contents() for p in kb.passages] + [q.question for q in kb.questions] + [template.format(question="")] * 64
