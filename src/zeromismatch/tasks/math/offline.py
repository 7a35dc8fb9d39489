"""Offline math tasks: seeded integer-answer word problems in the DAPO-Math-17k verl layout.

Our machines cannot fetch DAPO-Math-17k or AIME, so tiny-model runs train on these instead.
Problems and worked solutions are deliberately short (< 80 and < 120 characters) so that a tiny
model with ~100-token responses can learn the easy levels from SFT and improve with RL.

Levels: 1 = one addition/subtraction, 2 = one product (plus an offset), 3 = three operations,
4 = a linear equation, a remainder, a sum 1..n, or a 2x2 system. ``train`` is mostly levels 1-3;
``heldout`` (30 problems, fixed by its own seed, disjoint from train) is levels 2-4 (mean 2.9) and plays
the role AIME plays in the real recipe.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from zeromismatch.tasks.math.prompts import dapo_prompt

DATA_SOURCE = "zeromismatch/offline_math"
HELDOUT_SIZE = 30
HELDOUT_SEED = 2025  # fixed so every run evaluates on the same 30 problems
TRAIN_LEVELS = {1: 0.30, 2: 0.35, 3: 0.25, 4: 0.10}  # level 4 appears so held-out formats are not unseen
# harder than train on average (mean level 2.9 vs 2.15) but within reach of a tiny model after SFT + a few
# minutes of RL: on a levels 3-4 set the tiny model scores 0/30 both before and after RL, which hides progress
HELDOUT_LEVELS = {2: 0.3, 3: 0.5, 4: 0.2}
_MAX_DRAWS = 1000


@dataclass(frozen=True)
class OfflineProblem:
    problem: str
    solution: str  # worked solution whose last line is "Answer: <answer>"
    answer: int
    level: int


def _done(steps: str, answer: int) -> str:
    return f"{steps}\nAnswer: {answer}"


# ----- one generator per problem type; each takes an rng and returns (problem, solution, answer)


def _add(r: random.Random):
    a, b = r.randint(2, 30), r.randint(2, 30)
    name, thing = r.choice(_NAMES), r.choice(_THINGS)
    if r.random() < 0.5:
        return f"What is {a} + {b}?", _done(f"{a} + {b} = {a + b}.", a + b), a + b
    return (
        f"{name} has {a} {thing} and gets {b} more. How many {thing} now?",
        _done(f"{a} + {b} = {a + b}.", a + b),
        a + b,
    )


def _sub(r: random.Random):
    a = r.randint(10, 50)
    b = r.randint(1, a - 1)
    name, thing = r.choice(_NAMES), r.choice(_THINGS)
    if r.random() < 0.5:
        return f"What is {a} - {b}?", _done(f"{a} - {b} = {a - b}.", a - b), a - b
    return (
        f"{name} has {a} {thing} and gives away {b}. How many are left?",
        _done(f"{a} - {b} = {a - b}.", a - b),
        a - b,
    )


def _mul_add(r: random.Random):
    a, b, c = r.randint(2, 12), r.randint(2, 12), r.randint(1, 50)
    p = a * b
    if r.random() < 0.5:
        return f"What is {a} * {b} + {c}?", _done(f"{a} * {b} = {p}. {p} + {c} = {p + c}.", p + c), p + c
    c = r.randint(1, p - 1)
    return f"What is {a} * {b} - {c}?", _done(f"{a} * {b} = {p}. {p} - {c} = {p - c}.", p - c), p - c


def _groups(r: random.Random):
    a, b = r.randint(2, 12), r.randint(2, 12)
    thing, box = r.choice(_THINGS), r.choice(("bag", "box", "jar", "tray"))
    return (
        f"A {box} holds {a} {thing}. How many {thing} are in {b} {box}s?",
        _done(f"{b} * {a} = {a * b}.", a * b),
        a * b,
    )


def _paren(r: random.Random):
    a, b, c = r.randint(2, 20), r.randint(2, 20), r.randint(2, 9)
    s = a + b
    d = r.randint(1, s * c - 1)
    ans = s * c - d
    return (
        f"What is ({a} + {b}) * {c} - {d}?",
        _done(f"{a} + {b} = {s}. {s} * {c} = {s * c}. {s * c} - {d} = {ans}.", ans),
        ans,
    )


def _two_products(r: random.Random):
    a, b, c, d = (r.randint(2, 12) for _ in range(4))
    ans = a * b + c * d
    return (
        f"What is {a} * {b} + {c} * {d}?",
        _done(f"{a} * {b} = {a * b}. {c} * {d} = {c * d}. {a * b} + {c * d} = {ans}.", ans),
        ans,
    )


def _packs(r: random.Random):
    a, b = r.randint(2, 12), r.randint(2, 12)
    c = r.randint(1, a * b - 1)
    name = r.choice(_NAMES)
    ans = a * b - c
    return (
        f"{name} buys {a} packs of {b} cards and gives away {c}. How many are left?",
        _done(f"{a} * {b} = {a * b}. {a * b} - {c} = {ans}.", ans),
        ans,
    )


def _linear(r: random.Random):
    a, x, b = r.randint(2, 9), r.randint(-9, 20), r.randint(1, 40)
    c = a * x + b
    return (
        f"Solve {a}x + {b} = {c}. What is x?",
        _done(f"{a}x = {c} - {b} = {c - b}. x = {c - b} / {a} = {x}.", x),
        x,
    )


def _remainder(r: random.Random):
    n, m = r.randint(100, 999), r.randint(3, 13)
    q, rem = divmod(n, m)
    return (
        f"What is the remainder when {n} is divided by {m}?",
        _done(f"{m} * {q} = {m * q}. {n} - {m * q} = {rem}.", rem),
        rem,
    )


def _sum_to(r: random.Random):
    n = r.randint(5, 60)
    s = n * (n + 1) // 2
    return (
        f"What is the sum of the integers from 1 to {n}?",
        _done(f"{n} * {n + 1} / 2 = {s}.", s),
        s,
    )


def _system(r: random.Random):
    x, y = r.randint(1, 20), r.randint(1, 20)
    if x < y:
        x, y = y, x
    s, d = x + y, x - y
    return (
        f"If x + y = {s} and x - y = {d}, what is x * y?",
        _done(f"x = ({s} + {d}) / 2 = {x}. y = {s} - {x} = {y}. x * y = {x * y}.", x * y),
        x * y,
    )


_NAMES = ("Ann", "Ben", "Cal", "Dee", "Eli", "Fay", "Gus", "Ivy", "Max", "Sam", "Tom", "Zoe")
_THINGS = ("apples", "books", "coins", "eggs", "pens", "shells", "stamps", "toys")

LEVEL_GENERATORS: dict[int, tuple[Callable[[random.Random], tuple[str, str, int]], ...]] = {
    1: (_add, _sub),
    2: (_mul_add, _groups),
    3: (_paren, _two_products, _packs),
    4: (_linear, _remainder, _sum_to, _system),
}


def make_problem(rng: random.Random, level: int) -> OfflineProblem:
    """One problem of the given difficulty level (1-4)."""
    if level not in LEVEL_GENERATORS:
        raise ValueError(f"level must be one of {sorted(LEVEL_GENERATORS)}, got {level}")
    problem, solution, answer = rng.choice(LEVEL_GENERATORS[level])(rng)
    return OfflineProblem(problem, solution, answer, level)


def generate_problems(
    n: int,
    seed: int,
    levels: Mapping[int, float] = TRAIN_LEVELS,
    exclude: Iterable[str] = (),
) -> list[OfflineProblem]:
    """``n`` distinct problems, levels drawn from the ``levels`` weights, none whose text is in
    ``exclude``. Raises ValueError when a level runs out of new problems (roughly n > 40k)."""
    rng = random.Random(seed)
    keys, weights = list(levels), list(levels.values())
    seen = set(exclude)
    out: list[OfflineProblem] = []
    for _ in range(n):
        level = rng.choices(keys, weights)[0]
        # Redraw within the level on a repeat, so the level mix stays as asked.
        for _attempt in range(_MAX_DRAWS):
            p = make_problem(rng, level)
            if p.problem not in seen:
                break
        else:
            raise ValueError(
                f"no new level-{level} problem in {_MAX_DRAWS} draws after {len(out)} problems: "
                f"{n} distinct problems exceed what the offline generator offers; ask for fewer"
            )
        seen.add(p.problem)
        out.append(p)
    return out


def heldout_problems(seed: int = HELDOUT_SEED) -> list[OfflineProblem]:
    """The fixed 30-problem evaluation set (levels 2-4, harder than train on average)."""
    return generate_problems(HELDOUT_SIZE, seed, HELDOUT_LEVELS)


def offline_math_splits(n_train: int, seed: int = 0) -> dict[str, list[OfflineProblem]]:
    """``{"train": n_train distinct problems, "heldout": the fixed 30}``, disjoint."""
    if n_train < 1:
        raise ValueError(f"n_train must be >= 1, got {n_train}")
    heldout = heldout_problems()
    train = generate_problems(n_train, seed, exclude={p.problem for p in heldout})
    return {"train": train, "heldout": heldout}


def to_verl_rows(problems: list[OfflineProblem]) -> list[dict]:
    """Rows in the verl DAPO-Math-17k layout (what ``data.load_dapo_math`` reads)."""
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": dapo_prompt(p.problem)}],
            "ability": "MATH",
            "reward_model": {"ground_truth": str(p.answer), "style": "rule-lang"},
            "extra_info": {"index": i, "level": p.level, "solution": p.solution},
        }
        for i, p in enumerate(problems)
    ]


def tokenizer_corpus(problems: list[OfflineProblem], template_copies: int = 64) -> list[str]:
    """Texts to train a tiny tokenizer on: every problem and worked solution, plus the DAPO
    instruction text. The instruction is added ``template_copies`` times rather than once per
    problem: enough for BPE to merge it into whole words, without making it most of the corpus
    (which would triple training time for nothing)."""
    texts = [t for p in problems for t in (p.problem, p.solution)]
    return texts + [dapo_prompt("")] * template_copies


def write_offline_math(out_dir: str | Path, n_train: int = 20000, seed: int = 0) -> dict[str, Path]:
    """Write ``train.parquet``, ``heldout.parquet`` (verl layout) and ``sft.jsonl`` to ``out_dir``.

    ``sft.jsonl`` has one line per train problem: ``problem`` (bare), ``prompt`` (the DAPO user
    message), ``response`` (worked solution ending in "Answer: N"), ``answer``, ``level``.
    Returns the written paths by name. Same arguments, same bytes.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    splits = offline_math_splits(n_train, seed)
    paths = {}
    for name, problems in splits.items():
        paths[name] = out / f"{name}.parquet"
        pq.write_table(pa.Table.from_pylist(to_verl_rows(problems)), paths[name])
    paths["sft"] = out / "sft.jsonl"
    with open(paths["sft"], "w") as f:
        for p in splits["train"]:
            record = {
                "problem": p.problem,
                "prompt": dapo_prompt(p.problem),
                "response": p.solution,
                "answer": str(p.answer),
                "level": p.level,
            }
            f.write(json.dumps(record) + "\n")
    return paths
