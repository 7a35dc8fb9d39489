"""MathTask: offline data on demand, deterministic prompt order, rendered prompts, reward on decoded
responses with the tiny tokenizer, the 30 held-out prompts, the tokenizer cache, the hub-layout path."""

from __future__ import annotations

import itertools
import json

import pytest

from zeromismatch.tasks.base import PromptItem, Task, cycle_shuffled
from zeromismatch.tasks.math.offline import HELDOUT_SIZE, write_offline_math
from zeromismatch.tasks.math.task import MathTask, ensure_offline_math, get_tokenizer, tokenizer_fingerprint
from zeromismatch.tasks.math.prompts import render_prompt
from zeromismatch.tasks.tokenizer import ENDOFTEXT, IM_END

N_TRAIN = 200


def _cfg(root, **task_over):
    task = {
        "name": "math",
        "source": "offline",
        "offline": {
            "dir": str(root / "offline"),
            "n_train": N_TRAIN,
            "seed": 0,
            "train": str(root / "offline" / "train.parquet"),
            "eval": str(root / "offline" / "heldout.parquet"),
            "sft": str(root / "offline" / "sft.jsonl"),
            "levels": None,
        },
        "reward_timeout_s": 3.0,
        "chat_template_kwargs": {},
        "tokenizer_cache": str(root / "tok"),
    }
    for k, v in task_over.items():
        if k == "levels":
            task["offline"]["levels"] = v
        else:
            task[k] = v
    return {"model": {"preset": "tiny", "overrides": {}, "checkpoint": None, "tokenizer": None}, "task": task}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("math_task")


@pytest.fixture(scope="module")
def cfg(root):
    return _cfg(root)


@pytest.fixture(scope="module")
def tok(cfg):
    return get_tokenizer(cfg)


@pytest.fixture(scope="module")
def task(cfg, tok):
    with MathTask(cfg["task"], tok, seed=0) as t:
        yield t


def _levels(cfg):
    with open(cfg["task"]["offline"]["sft"]) as f:
        return [json.loads(line)["level"] for line in f]


def test_offline_data_written_once_and_gitignored(cfg, task):
    off = cfg["task"]["offline"]
    paths = ensure_offline_math(cfg["task"])
    assert {p.name for p in paths.values()} == {"train.parquet", "heldout.parquet", "sft.jsonl"}
    assert (paths["train"].parent / ".gitignore").read_text().splitlines()[-1] == "*"
    mtimes = {k: p.stat().st_mtime_ns for k, p in paths.items()}
    ensure_offline_math(cfg["task"])  # present: not rewritten
    assert {k: p.stat().st_mtime_ns for k, p in paths.items()} == mtimes
    meta = json.loads((paths["train"].parent / "meta.json").read_text())
    assert (meta["n_train"], meta["seed"], len(meta["generator_sha256"])) == (off["n_train"], 0, 16)
    # files from another generator version (or n_train) are rewritten
    sft_bytes = paths["sft"].read_bytes()
    (paths["train"].parent / "meta.json").write_text(json.dumps({**meta, "generator_sha256": "old"}))
    paths["sft"].write_text("stale\n")
    ensure_offline_math(cfg["task"])
    assert json.loads((paths["train"].parent / "meta.json").read_text()) == meta
    assert paths["sft"].read_bytes() == sft_bytes
    assert task.num_train == N_TRAIN


def test_protocol(task, tok):
    assert isinstance(task, Task) and task.name == "math" and task.max_turns == 1
    assert set(task.stop_token_ids) == {tok.convert_tokens_to_ids(IM_END), tok.convert_tokens_to_ids(ENDOFTEXT)}
    assert tok.eos_token_id in task.stop_token_ids
    item = next(task.train_prompts())
    # the default episode is single-turn: done after the first model turn, scored by task.reward on it
    ep = task.start_episode(item, 0)
    answer = tok.encode("Answer: " + item.gold, add_special_tokens=False)
    assert ep.step(answer, "stop").done
    assert ep.reward() == task.reward(answer, item.gold) == 1.0
    ep.close()


def test_prompt_order_deterministic_and_reshuffled(cfg, tok, task):
    n = task.num_train
    first = [(x.prompt_id, x.prompt_ids, x.gold) for x in itertools.islice(task.train_prompts(), 2 * n + 5)]
    with MathTask(cfg["task"], tok, seed=0) as again:
        assert [(x.prompt_id, x.prompt_ids, x.gold) for x in itertools.islice(again.train_prompts(), 2 * n + 5)] == first
    ids = [i for i, _, _ in first]
    assert sorted(ids[:n]) == list(range(n)) and sorted(ids[n : 2 * n]) == list(range(n))  # epochs are permutations
    assert ids[:n] != ids[n : 2 * n]  # reshuffled per epoch
    assert ids[:n] != list(range(n))  # shuffled at all
    with MathTask(cfg["task"], tok, seed=1) as other:
        assert [x.prompt_id for x in itertools.islice(other.train_prompts(), n)] != ids[:n]
    # resume: start=k continues the same sequence
    assert [x.prompt_id for x in itertools.islice(task.train_prompts(start=n - 3), 10)] == ids[n - 3 : n + 7]
    # the same problem always renders to the same ids, whatever epoch
    by_id = {}
    for i, p, g in first:
        assert by_id.setdefault(i, (p, g)) == (p, g)


def test_prompts_are_rendered_dapo_prompts(task, tok):
    item = task.train_item(7)
    problem, gold = task._train[7]
    assert item == PromptItem(7, render_prompt(tok, problem), gold)
    text = tok.decode(item.prompt_ids)
    assert text.startswith("<|im_start|>user\nSolve the following math problem")
    assert problem in text and text.endswith("<|im_start|>assistant\n")
    item.prompt_ids.append(-1)  # callers get copies: the task's cache cannot be corrupted
    assert task.train_item(7).prompt_ids[-1] != -1


def test_eval_prompts(task):
    evals = task.eval_prompts()
    assert len(evals) == HELDOUT_SIZE == 30
    assert [e.prompt_id for e in evals] == list(range(30))
    assert all(e.gold.lstrip("-").isdigit() for e in evals)
    assert [e.prompt_ids for e in task.eval_prompts()] == [e.prompt_ids for e in evals]


def test_levels_filter(root, tok):
    cfg = _cfg(root, levels=[1])
    with MathTask(cfg["task"], tok, seed=0) as t:
        levels = _levels(cfg)
        train_problems = [json.loads(line)["problem"] for line in open(cfg["task"]["offline"]["sft"])]
        level1 = {p for p, lv in zip(train_problems, levels) if lv == 1}
        assert t.num_train == len(level1) > 0
        assert {t._train[i][0] for i in range(t.num_train)} == level1


def test_reward_on_decoded_responses(task, tok):
    eos = tok.eos_token_id

    def ids(text):
        return tok.encode(text, add_special_tokens=False)

    assert task.reward(ids("17 + 25 = 42.\nAnswer: 42") + [eos], "42") == 1.0
    assert task.reward(ids("17 + 25 = 42.\nAnswer: 42"), "42") == 1.0  # truncated (no eos): still graded
    assert task.reward(ids("17 + 25 = 41.\nAnswer: 41") + [eos], "42") == 0.0
    assert task.reward(ids("x = -3.\nAnswer: -3") + [eos], "-3") == 1.0
    # only the text before the first stop token counts
    assert task.reward(ids("Answer: 7") + [eos] + ids("Answer: 42"), "42") == 0.0
    # a real item, answered correctly
    item = next(task.train_prompts())
    assert task.reward(ids(f"Answer: {item.gold}") + [eos], item.gold) == 1.0
    # never raises
    for bad in ([], [eos], [10**12], [-5], ["x"], None):
        assert task.reward(bad, "42") == 0.0
    assert task.reward(ids("Answer: 42"), None) == 0.0


def test_tokenizer_cached(cfg, tok, root):
    again = get_tokenizer(cfg)
    assert again.name_or_path == tok.name_or_path
    assert tokenizer_fingerprint(again) == tokenizer_fingerprint(tok)
    assert len(list((root / "tok").glob("*/tokenizer.json"))) == 1
    assert len(tok) <= 2048  # fits the tiny preset's vocab
    with pytest.raises(ValueError, match="needs its real tokenizer"):
        get_tokenizer({**cfg, "model": {"preset": "qwen3_5_9b", "overrides": {}, "checkpoint": None, "tokenizer": None}})


def test_hub_source_reads_local_files(tmp_path, tok):
    # the published-data path, fed local files in the verl layout (our machines cannot reach the hub)
    paths = write_offline_math(tmp_path / "verl", n_train=40, seed=3)
    cfg_task = {
        "name": "math",
        "source": "hub",
        "hub": {"train": str(paths["train"]), "train_split": "train", "eval": str(paths["heldout"]), "eval_split": "train"},
        "reward_timeout_s": 3.0,
    }
    with MathTask(cfg_task, tok, seed=0) as t:
        assert t.num_train == 40 and len(t.eval_prompts()) == 30
        item = next(t.train_prompts())
        assert t.reward(tok.encode(f"Answer: {item.gold}", add_special_tokens=False), item.gold) == 1.0


def test_cycle_shuffled():
    assert list(itertools.islice(cycle_shuffled(1, 0), 3)) == [0, 0, 0]
    a = list(itertools.islice(cycle_shuffled(5, 42), 15))
    assert a == list(itertools.islice(cycle_shuffled(5, 42), 15))
    assert list(itertools.islice(cycle_shuffled(5, 42, start=7), 8)) == a[7:15]
    with pytest.raises(ValueError):
        next(cycle_shuffled(0, 0))
