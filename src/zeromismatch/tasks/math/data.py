"""Loaders for math RL data, normalized to ``MathProblem``.

Accepted layouts (detected from the column names, not from the dataset name):

* verl DAPO-Math-17k: ``prompt`` = ``[{"role": "user", "content": ...}]`` with the DAPO
  instruction wrapped around the problem, ``reward_model`` = ``{"ground_truth": ..., ...}``,
  ``data_source``.
* processed DAPO: ``prompt`` or ``source_prompt`` as a plain string, and the answer in
  ``ground_truth`` / ``solution``.
* AIME-style dumps: ``problem`` or ``question``, and ``answer``.

A source is a hub name (handed to ``datasets.load_dataset``) or a local parquet / jsonl / json
file or a directory of them. ``problem`` is always the bare problem: the DAPO wrapper is removed
when present, so prompts can be re-rendered with whatever template the run uses.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets

from zeromismatch.errors import InputFileError, MissingFileError, parse_json
from zeromismatch.tasks.math.prompts import strip_dapo_template

DAPO_HUB_NAME = "BytedTsinghua-SIA/DAPO-Math-17k"
AIME2025_HUB_NAME = "MathArena/aime_2025"

# Column preference, first present wins. "solution" comes after "answer" because AIME dumps
# use "solution" for the worked solution, while processed DAPO uses it for the answer.
_PROBLEM_COLUMNS = ("prompt", "source_prompt", "problem", "question")
_ANSWER_COLUMNS = ("reward_model", "ground_truth", "answer", "solution")

_FILE_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}


@dataclass(frozen=True)
class MathProblem:
    problem: str  # bare problem text, no instruction template
    answer: str  # gold answer as text, graded by math-verify
    source: str  # data_source column when present, else the dataset name / file stem
    idx: int  # row position in the loaded split: stable for a fixed file


def load_math_problems(
    source: str | os.PathLike, split: str = "train", dedupe: bool = False, **load_kwargs
) -> list[MathProblem]:
    """Load any supported layout (module doc) from a hub name or a local path.

    ``split`` is the hub split, or for a local directory picks ``<split>*`` files when present.
    ``dedupe`` keeps the first of rows with the same (problem, answer); ``idx`` still points at
    the original row. ``load_kwargs`` go to ``datasets.load_dataset`` (e.g. ``name=`` for a hub
    config, ``cache_dir=``). Raises ValueError naming the source and the bad column.
    """
    dataset, label = _load_raw(source, split, load_kwargs)
    columns = list(dataset.column_names)
    problem_col = next((c for c in _PROBLEM_COLUMNS if c in columns), None)
    answer_col = next((c for c in _ANSWER_COLUMNS if c in columns), None)
    if problem_col is None or answer_col is None:
        missing = "problem" if problem_col is None else "answer"
        wanted = _PROBLEM_COLUMNS if problem_col is None else _ANSWER_COLUMNS
        raise ValueError(
            f"{label}: no {missing} column; expected one of {list(wanted)}, found {columns}"
        )
    default_source = Path(label).stem if Path(label).exists() else label
    # Decode only what we use: the verl file carries extra_info etc. on every row.
    dataset = dataset.select_columns(
        [problem_col, answer_col] + (["data_source"] if "data_source" in columns else [])
    )

    problems, seen = [], set()
    for i, row in enumerate(dataset):
        where = f"{label}, row {i}"
        problem = _problem_text(row[problem_col], problem_col, where)
        answer = _answer_text(row[answer_col], answer_col, where)
        if dedupe:
            if (problem, answer) in seen:
                continue
            seen.add((problem, answer))
        source_name = str(row.get("data_source") or default_source)
        problems.append(MathProblem(problem, answer, source_name, idx=i))
    return problems


def load_dapo_math(
    source: str | os.PathLike = DAPO_HUB_NAME, split: str = "train", dedupe: bool = True, **load_kwargs
) -> list[MathProblem]:
    """DAPO-Math-17k, verl or processed layout (also any offline split we write).

    Deduplicates by default: the verl release of DAPO-Math-17k repeats each of its ~17.9k
    problems about 100 times (~1.79M rows), which would silently skew epochs and eval counts.
    """
    return load_math_problems(source, split, dedupe=dedupe, **load_kwargs)


def load_aime2025(
    source: str | os.PathLike = AIME2025_HUB_NAME,
    split: str = "train",
    expected: int | None = 30,
    **load_kwargs,
) -> list[MathProblem]:
    """AIME 2025 (I and II, 30 problems). ``expected`` guards against loading the wrong set
    (e.g. only one of the two exams, or a multi-year dump); pass None to skip the check."""
    problems = load_math_problems(source, split, **load_kwargs)
    if expected is not None and len(problems) != expected:
        raise ValueError(
            f"{source}: {len(problems)} problems, expected {expected} for AIME 2025 "
            "(pass expected=None to load a different count)"
        )
    return problems


# ----- internals -----


def _load_raw(source, split: str, load_kwargs: dict):
    path = Path(source).expanduser()
    if not path.exists():
        # "org/name" is a hub id; something that looks like a path is a typo we should report,
        # not a hub lookup that fails later with a network error.
        text = str(source)
        if text.endswith(tuple(_FILE_BUILDERS)) or text.startswith(("/", "./", "../", "~")):
            raise MissingFileError(f"file not found: {source}")
        return datasets.load_dataset(str(source), split=split, **load_kwargs), str(source)

    files = _data_files(path, split)
    kinds = {_FILE_BUILDERS[f.suffix] for f in files}
    if len(kinds) > 1:
        raise ValueError(f"{path}: mixes parquet and json files; keep one format per directory")
    for f in files:
        if f.suffix == ".jsonl":
            check_jsonl(f)
    data_files = [str(f) for f in files]
    ds = datasets.load_dataset(kinds.pop(), data_files=data_files, split="train", **load_kwargs)
    return ds, str(path)


def check_jsonl(path: Path) -> None:
    """Every non-blank line of ``path`` is a JSON object; else InputFileError naming the file and the line
    (datasets' own error names neither)."""
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, start=1):
            if line.strip() and not isinstance(parse_json(line, path, i), dict):
                raise InputFileError(f"{path}:{i}: expected a JSON object per line")


def _data_files(path: Path, split: str) -> list[Path]:
    """The files behind a local path: the file itself, or in a directory the files named after
    ``split`` (``train.parquet``, ``train-00000-of-00002.parquet``) if any, else all of them."""
    if path.is_file():
        if path.suffix not in _FILE_BUILDERS:
            raise ValueError(f"{path}: unsupported file type; use one of {sorted(_FILE_BUILDERS)}")
        return [path]
    files = sorted(f for f in path.rglob("*") if f.is_file() and f.suffix in _FILE_BUILDERS)
    if not files:
        raise ValueError(f"{path}: no {sorted(_FILE_BUILDERS)} files in this directory")
    named = [
        f for f in files if f.stem == split or f.stem.startswith(f"{split}-") or f.parent.name == split
    ]
    return named or files


def _problem_text(value: Any, column: str, where: str) -> str:
    if isinstance(value, list):  # chat messages: the last user turn holds the problem
        users = [m for m in value if isinstance(m, dict) and m.get("role") == "user"]
        if not users or not isinstance(users[-1].get("content"), str):
            raise ValueError(
                f"{where}: column '{column}' is a message list without a user message "
                "with string content"
            )
        value = users[-1]["content"]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(
            f"{where}: column '{column}' must be a non-empty string or a message list, "
            f"got {value!r:.80}"
        )
    bare = strip_dapo_template(value)
    return (bare if bare is not None else value).strip()


def _answer_text(value: Any, column: str, where: str) -> str:
    if column == "reward_model":
        if not isinstance(value, dict) or "ground_truth" not in value:
            raise ValueError(
                f"{where}: column 'reward_model' has no 'ground_truth' field, got {value!r:.80}"
            )
        value = value["ground_truth"]
    if isinstance(value, float) and value.is_integer():  # AIME answers stored as floats
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: column '{column}' must hold a non-empty answer, got {value!r:.80}")
    return value.strip()
