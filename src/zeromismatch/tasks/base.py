"""What the RL job needs from a task: prompts in a reproducible order, a held-out set, a reward.

    task = MathTask(cfg.task, tokenizer, seed=cfg.seed)
    it = task.train_prompts()                 # infinite, deterministic from the seed
    item = next(it)                           # PromptItem(prompt_id, prompt_ids, gold)
    ... generate with SamplingParams(stop_token_ids=task.stop_token_ids) ...
    r = task.reward(response_ids, item.gold)  # float, never raises
    evals = task.eval_prompts()               # fixed list (30 for math)
    ids, mask = task.sft_example(record)      # an SFT demonstration: tokens, 1 where the model's turns are

One rollout is an ``Episode`` (``task.start_episode(item, sample_index)``): after each model turn the rollout
worker calls ``episode.step(response_ids, finish_reason)`` (``response_ids``: that turn's tokens only;
``finish_reason`` 'stop' or 'length'), which answers tokens to append (a tool's output, masked from the loss
and from the mismatch metrics) or ``done``; once done, ``episode.reward()`` scores the whole rollout and
``episode.close()`` frees what it holds (a sandbox). Single-turn tasks (math) keep the default episode: done
after the first turn, scored by ``Task.reward``. The runner is generator/episodes.py (RL rollouts and the
held-out evaluation alike).

Threads: for a multi-turn task (``max_turns > 1``) start_episode, step, reward and close run on a pool of
``env_workers`` threads beside the engine (a retriever call, a shell command may block; the other sequences
keep decoding). One episode's calls never overlap; different episodes' calls do, so state an episode shares
(a retriever client, the task) must be thread-safe. ``close`` is called exactly once per started episode: after
reward, when the episode is truncated (turn limit, context cap: scored 0 without calling reward), or when the
run stops. ``step`` / ``reward`` raise ``ToolError`` for an infrastructure failure (a dead retriever): the run
stops with that message instead of scoring the rollout 0.

Limits: ``max_turns``, ``max_tokens_per_turn``, ``max_context_tokens`` and ``env_workers`` are Task attributes;
build_task sets them from the task's yaml keys of the same names (``configure_episodes``; the keys go into
config_schema.py's TASK entry, e.g. ``**EPISODE_KEYS``).

Also here: ``cycle_shuffled`` (the epoch order every task uses) and ``locked`` (one builder per cache
entry across processes, for the data, tokenizer and SFT caches).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import shutil
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


@dataclass(frozen=True)
class PromptItem:
    prompt_id: int  # position in the task's train (or eval) list: stable across epochs and runs
    prompt_ids: list[int] = field(repr=False)  # chat-formatted prompt, generation header included
    gold: str  # what ``Task.reward`` compares against (the gold answer for math)


@dataclass(frozen=True)
class TurnResult:
    """What an episode answers after a model turn: tokens to append (a tool's output, masked from the loss)
    before generating again, or ``done`` (then ``append_ids`` is empty)."""

    append_ids: list[int] = field(default_factory=list)
    done: bool = False


class ToolError(RuntimeError):
    """An environment's infrastructure failed (retriever unreachable, sandbox could not start): not the
    policy's fault, so the rollout must not be scored. The message names what failed (URL, request)."""


class Episode:
    """One rollout's environment: the default is single-turn (done after the first model turn, scored by the
    task's ``reward`` on that turn's tokens). Multi-turn tasks subclass it."""

    def __init__(self, task: "Task", item: PromptItem):
        self.task, self.item = task, item
        self.responses: list[list[int]] = []  # model turns so far

    def step(self, response_ids: Sequence[int], finish_reason: str | None) -> TurnResult:
        """Called after each model turn (``finish_reason`` 'stop' or 'length'); may block."""
        self.responses.append(list(response_ids))
        return TurnResult(done=True)

    def reward(self) -> float:
        """The rollout's reward once ``step`` answered done. Never raises for the policy's output."""
        return self.task.reward(self.responses[-1] if self.responses else [], self.item.gold)

    def close(self) -> None:
        """Free what the episode holds; called once, also when the run fails."""


class Task(ABC):
    """The RL task protocol (module doc). Subclasses set ``name`` and implement the abstract members."""

    name: str = "task"
    # Rollout limits (generator/episodes.py). build_task sets them from the task's yaml keys of the same names
    # (configure_episodes); a Task subclass may also set them itself.
    max_turns: int = 1  # model turns per episode; an episode not done after them is truncated (reward 0)
    max_tokens_per_turn: int | None = None  # per-turn token cap; None: rl.max_new_tokens
    max_context_tokens: int | None = None  # prompt + turns + tool tokens; None: the engine's max_model_len
    env_workers: int = 4  # threads running episodes' start / step / reward / close beside the engine

    @property
    @abstractmethod
    def stop_token_ids(self) -> tuple[int, ...]:
        """Token ids that end a generation (pass them to SamplingParams)."""

    @abstractmethod
    def train_prompts(self, start: int = 0) -> Iterator[PromptItem]:
        """Infinite iterator over training prompts: epoch e is a permutation of the train set fixed by
        (seed, e), so two tasks built with the same seed yield the same sequence. ``start`` skips that many
        items (resume)."""

    @abstractmethod
    def eval_prompts(self) -> list[PromptItem]:
        """The held-out evaluation set, in a fixed order."""

    @abstractmethod
    def reward(self, response_ids: Sequence[int], gold: Any) -> float:
        """Score one response (generated token ids, stop token included or not). Never raises."""

    def configure_episodes(self, task_cfg: Any) -> None:
        """Take the episode limits a task's yaml sets (max_turns, max_tokens_per_turn, max_context_tokens,
        env_workers; absent or null keys keep the class defaults)."""
        for key in ("max_turns", "max_tokens_per_turn", "max_context_tokens", "env_workers"):
            value = task_cfg.get(key) if task_cfg is not None else None
            if value is not None:
                setattr(self, key, int(value))

    def start_episode(self, item: PromptItem, sample_index: int) -> Episode:
        """A fresh episode for sample ``sample_index`` of ``item``'s group. Multi-turn tasks (``max_turns > 1``)
        return their own Episode subclass."""
        return Episode(self, item)

    def sft_example(self, record: dict) -> tuple[list[int], list[int]]:
        """One record of the task's SFT file as (token ids, loss mask): the prompt as RL renders it, then the
        demonstration; mask 1 on the tokens the model is trained to produce (its turns), 0 on the prompt and
        on tool output. Tasks with an SFT warm start implement it."""
        raise NotImplementedError(f"task {self.name!r} has no SFT demonstrations (Task.sft_example)")

    def close(self) -> None:
        """Release resources (reward worker processes, tool sandboxes)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def cycle_shuffled(n: int, seed: int, start: int = 0) -> Iterator[int]:
    """Indices 0..n-1 forever: epoch e is ``random.Random(f"{seed}:{e}")``'s shuffle of range(n) (stable
    across Python versions and platforms for a given seed), reshuffled every epoch. ``start`` skips items."""
    if n < 1:
        raise ValueError("cannot cycle over an empty set of prompts")
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    epoch, offset = divmod(start, n)
    while True:
        order = list(range(n))
        random.Random(f"{seed}:{epoch}").shuffle(order)
        yield from order[offset:]
        epoch, offset = epoch + 1, 0


@contextlib.contextmanager
def locked(path: str | os.PathLike):
    """Exclusive inter-process lock on ``<path>.lock`` (created if missing). Cache builders take it, check
    whether the entry exists, and build it only if not, so parallel runs (a sweep) build it once."""
    lock = Path(f"{os.fspath(path)}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_dir(out: Path, write: Callable[[Path], None]) -> None:
    """Make the cache entry ``out`` appear whole or not at all: ``write(tmp)`` into a fresh directory beside it,
    fsync its files and itself, rename it to ``out``, fsync the parent (so the rename survives a crash). Call it
    holding ``out``'s lock; temporary directories of ``out`` left by killed writers are removed first."""
    for stale in out.parent.glob(f".{out.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    tmp.mkdir()
    try:
        write(tmp)
        for f in tmp.iterdir():
            _fsync(f)
        _fsync(tmp)
        shutil.rmtree(out, ignore_errors=True)  # an incomplete entry (the caller checked under the lock)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync(out.parent)
