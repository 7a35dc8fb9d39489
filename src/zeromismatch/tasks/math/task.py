"""The math RL task (the DAPO recipe: binary math-verify reward, integer answers) over the offline problems
or the published data, and its tokenizer.

    tok = get_tokenizer(cfg)                          # tiny presets: trained once, cached
    task = MathTask(cfg.task, tok, seed=cfg.seed)
    item = next(task.train_prompts())                 # PromptItem(prompt_id, prompt_ids, gold)
    task.reward(response_ids, item.gold)              # 1.0 / 0.0 by math-verify, never raises

Data (cfg.task.source):
- ``offline`` (default): the generated problems of ``offline.py``. The files named by cfg.task.offline
  (train / eval / sft under ``offline.dir``) are written by ``write_offline_math`` when missing, once
  across parallel runs, with a ``.gitignore`` so they never reach git. ``offline.levels`` restricts the
  train prompts to some difficulty levels (null = all); the eval set is always the 30 held-out problems.
- ``hub``: DAPO-Math-17k for training and AIME 2025 for evaluation through ``data.py``'s loaders;
  cfg.task.hub.train / .eval are hub names or local paths (files or directories in the same layouts).

Prompts are ``render_prompt`` (DAPO instruction, chat template, generation header), rendered on first use
and kept. The reward decodes the response (cut at the first stop token, specials dropped) and scores it
with ``MathVerifier(timeout_s=cfg.task.reward_timeout_s)``; any failure scores 0.0.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

import zeromismatch.tasks.math.offline as offline_module
from zeromismatch.config import cfg_get, to_plain
from zeromismatch.tasks.base import PromptItem, Task, cycle_shuffled
from zeromismatch.tasks.math.data import load_aime2025, load_dapo_math
from zeromismatch.tasks.math.offline import HELDOUT_SIZE, offline_math_splits, tokenizer_corpus, write_offline_math
from zeromismatch.tasks.math.prompts import render_prompt, strip_dapo_template
from zeromismatch.tasks.math.reward import MathVerifier
from zeromismatch.tasks.offline_files import ensure_generated, source_sha
from zeromismatch.tasks.tokenizer import (  # noqa: F401 - TOKENIZER_FILES .. model_vocab_size: re-exported
    ENDOFTEXT,
    IM_END,
    TOKENIZER_FILES,
    cached_tiny_tokenizer,
    has_tokenizer,
    model_vocab_size,
    run_tokenizer,
    tokenizer_fingerprint,
)

OFFLINE_FILES = {"train": "train.parquet", "eval": "heldout.parquet", "sft": "sft.jsonl"}  # write_offline_math's


# ------------------------------------------------------------------------------------------- data


def offline_paths(cfg_task: Any) -> dict[str, Path]:
    """The offline files the config names: train / eval parquet and the SFT jsonl."""
    off = cfg_get(cfg_task, "offline")
    root = Path(cfg_get(off, "dir", "data/offline_math"))
    return {key: Path(cfg_get(off, key, root / name)) for key, name in OFFLINE_FILES.items()}


def ensure_offline_math(cfg_task: Any) -> dict[str, Path]:
    """Write the offline data set (``write_offline_math(offline.dir, n_train, seed)``) unless the files
    cfg.task.offline names exist for the same (n_train, seed, offline.py source); return those paths.
    Files appear atomically and once across processes (tasks/offline_files.ensure_generated). A named file that
    does not exist and is not one write_offline_math writes fails first (MissingFileError naming the
    task.offline key)."""
    off = cfg_get(cfg_task, "offline")
    root = Path(cfg_get(off, "dir", "data/offline_math"))
    n_train, seed = int(cfg_get(off, "n_train", 20000)), int(cfg_get(off, "seed", 0))
    meta = {"n_train": n_train, "seed": seed, "generator_sha256": source_sha(offline_module.__file__)}
    return ensure_generated(
        root, offline_paths(cfg_task), OFFLINE_FILES, meta,
        lambda tmp: write_offline_math(tmp, n_train=n_train, seed=seed),
        cfg_key="task.offline", writer="zeromismatch.tasks.math.task.ensure_offline_math",
    )  # fmt: skip


def read_offline_parquet(path: str | os.PathLike) -> list[tuple[str, str, int | None]]:
    """(bare problem, gold answer, level) per row of a verl-layout parquet written by ``write_offline_math``.
    Plain pyarrow: no ``datasets`` import (seconds) for files we wrote ourselves."""
    table = pq.read_table(path)
    cols = set(table.column_names)
    if not {"prompt", "reward_model"} <= cols:
        raise ValueError(f"{path}: not the verl layout (prompt, reward_model); found {sorted(cols)}")
    prompts = table.column("prompt").to_pylist()
    golds = table.column("reward_model").to_pylist()
    extras = table.column("extra_info").to_pylist() if "extra_info" in cols else [None] * len(prompts)
    rows = []
    for i, (msgs, rm, extra) in enumerate(zip(prompts, golds, extras)):
        text = msgs[-1]["content"] if isinstance(msgs, list) else msgs
        if not isinstance(text, str) or not isinstance(rm, dict) or "ground_truth" not in rm:
            raise ValueError(f"{path}, row {i}: malformed prompt or reward_model")
        bare = strip_dapo_template(text)
        level = (extra or {}).get("level")
        rows.append(((bare if bare is not None else text).strip(), str(rm["ground_truth"]).strip(), level))
    return rows


# -------------------------------------------------------------------------------------------- task


class MathTask(Task):
    """Single-turn math (module doc). ``seed`` fixes the training prompt order."""

    name = "math"
    max_turns = 1

    def __init__(self, cfg_task: Any, tokenizer, seed: int = 0):
        self.cfg = cfg_task
        self.tokenizer = tokenizer
        self.seed = int(seed)
        self.template_kwargs = dict(to_plain(cfg_get(cfg_task, "chat_template_kwargs", {})))
        source = cfg_get(cfg_task, "source", "offline")
        if source == "offline":
            paths = ensure_offline_math(cfg_task)
            train_rows = read_offline_parquet(paths["train"])
            levels = to_plain(cfg_get(cfg_get(cfg_task, "offline"), "levels"))
            if levels:
                levels = {int(x) for x in levels}
                if any(level is None for _, _, level in train_rows):
                    raise ValueError(f"{paths['train']}: no level column; task.offline.levels needs one")
                train_rows = [r for r in train_rows if r[2] in levels]
            self._train = [(p, a) for p, a, _ in train_rows]
            self._eval = [(p, a) for p, a, _ in read_offline_parquet(paths["eval"])]
            if len(self._eval) != HELDOUT_SIZE:
                raise ValueError(f"{paths['eval']}: {len(self._eval)} held-out problems, expected {HELDOUT_SIZE}")
        elif source == "hub":
            hub = cfg_get(cfg_task, "hub")
            train = load_dapo_math(cfg_get(hub, "train"), split=cfg_get(hub, "train_split", "train"))
            evals = load_aime2025(cfg_get(hub, "eval"), split=cfg_get(hub, "eval_split", "train"))
            self._train = [(p.problem, p.answer) for p in train]
            self._eval = [(p.problem, p.answer) for p in evals]
        else:
            raise ValueError(f"task.source must be 'offline' or 'hub', got {source!r}")
        if not self._train:
            raise ValueError("the math task has no training problems (check task.offline.levels / task.hub.train)")
        self._train_ids: dict[int, list[int]] = {}
        self._eval_items: list[PromptItem] | None = None
        self._stop = _stop_ids(tokenizer)
        self._verifier = MathVerifier(timeout_s=float(cfg_get(cfg_task, "reward_timeout_s", 3.0)),
                                      last_number_fallback=bool(cfg_get(cfg_task, "last_number_fallback", False)))

    # ----- Task protocol

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return self._stop

    @property
    def num_train(self) -> int:
        return len(self._train)

    def train_item(self, idx: int) -> PromptItem:
        """Train problem ``idx`` as a PromptItem (prompt rendered on first use)."""
        problem, gold = self._train[idx]
        ids = self._train_ids.get(idx)
        if ids is None:
            ids = self._train_ids[idx] = self.render(problem)
        return PromptItem(idx, list(ids), gold)

    def train_prompts(self, start: int = 0) -> Iterator[PromptItem]:
        for idx in cycle_shuffled(len(self._train), self.seed, start):
            yield self.train_item(idx)

    def eval_prompts(self) -> list[PromptItem]:
        if self._eval_items is None:
            self._eval_items = [PromptItem(i, self.render(p), a) for i, (p, a) in enumerate(self._eval)]
        return [PromptItem(x.prompt_id, list(x.prompt_ids), x.gold) for x in self._eval_items]

    def reward(self, response_ids: Sequence[int], gold: Any) -> float:
        try:
            return self._verifier.score(self.decode_response(response_ids), gold)
        except Exception:  # noqa: BLE001 - a reward never takes the run down; unreadable = wrong
            return 0.0

    def close(self) -> None:
        self._verifier.close()

    def sft_example(self, record: dict) -> tuple[list[int], list[int]]:
        """An sft.jsonl record as (token ids, loss mask): the user message rendered exactly as RL prompts are
        (``record['prompt']`` already carries the DAPO wrapper), then the worked solution + eos, trained on."""
        eos = self.tokenizer.eos_token_id
        if eos is None:
            raise ValueError("SFT needs a tokenizer with an eos token (the solution's end)")
        prompt = render_prompt(self.tokenizer, record["prompt"], dapo_template=False, **self.template_kwargs)
        target = self.tokenizer.encode(record["response"], add_special_tokens=False) + [eos]
        return prompt + target, [0] * len(prompt) + [1] * len(target)

    # ----- helpers

    def render(self, problem: str) -> list[int]:
        return render_prompt(self.tokenizer, problem, **self.template_kwargs)

    def decode_response(self, response_ids: Sequence[int]) -> str:
        """Response text: up to the first stop token, special tokens dropped."""
        ids = [int(t) for t in response_ids]
        stops = set(self._stop)
        cut = next((i for i, t in enumerate(ids) if t in stops), len(ids))
        return self.tokenizer.decode(ids[:cut], skip_special_tokens=True)


def _stop_ids(tokenizer) -> tuple[int, ...]:
    """eos plus Qwen's end-of-turn and end-of-text tokens where the vocabulary has them (a base checkpoint's
    eos is <|endoftext|>, an instruct one's <|im_end|>: stop on either)."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    vocab = tokenizer.get_vocab()
    for token in (IM_END, ENDOFTEXT):
        if token in vocab:
            ids.add(int(vocab[token]))
    if not ids:
        raise ValueError("tokenizer has no eos token and no <|im_end|> / <|endoftext|>: generations could not stop")
    return tuple(sorted(ids))


# --------------------------------------------------------------------------------------- tokenizer


def get_tokenizer(cfg: Any):
    """The run's tokenizer (tasks/tokenizer.run_tokenizer): model.tokenizer, the checkpoint's, or for tiny
    presets the byte-level BPE of ``tiny_tokenizer``."""
    return run_tokenizer(cfg, tiny_tokenizer)


def tiny_tokenizer(cfg_task: Any, vocab_size: int):
    """Byte-level BPE on the offline corpus (train + held-out problems and solutions of
    ``offline_math_splits(task.offline.n_train, task.offline.seed)``), trained once and cached under
    ``task.tokenizer_cache``. Used for every source: byte-level BPE encodes any text, it just compresses the
    offline problems best."""
    off = cfg_get(cfg_task, "offline")
    splits = offline_math_splits(int(cfg_get(off, "n_train", 20000)), int(cfg_get(off, "seed", 0)))
    corpus = tokenizer_corpus(splits["train"] + splits["heldout"])
    return cached_tiny_tokenizer(corpus, vocab_size, cfg_get(cfg_task, "tokenizer_cache", ".cache/tokenizers"))
