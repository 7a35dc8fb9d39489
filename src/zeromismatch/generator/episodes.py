"""Rollouts as episodes (tasks/base.py): model turns on the engine, environment turns beside it. The RL
rollouts (orchestration/rollouts.py) and the evaluation (evaluation.py) run every task through it.

    runner = EpisodeRunner(engine, task, EpisodeLimits(max_turns=4, max_context_tokens=4096), env_workers=4)
    rid = runner.start(item, sample_index, params)    # params: each turn's SamplingParams (max_new_tokens = per-turn cap)
    while runner.has_work():
        for rid, sample in runner.step():             # finished rollouts: Samples with their reward
            ...
    runner.close()                                    # closes the live episodes and stops the thread pool

A rollout alternates model turns and environment turns. A model turn is an engine request (keep_cache=True
while another turn may follow). When it finishes, ``episode.step(turn tokens, finish reason)`` runs on a
worker thread (it may block: a retriever call, a shell command), so the other sequences keep decoding; its
answer is applied between engine steps: tokens to append -> ``Engine.continue_request`` (which stamps the next
turn with the generator's weight version at that moment), done -> ``reward()``, ``close()`` (on the worker
thread too), and the parked request is released.

Limits: at most ``max_turns`` model turns; each turn at most params.max_new_tokens tokens, and fewer when the
context is nearly full; at most ``max_context_tokens`` tokens in all (prompt, model turns, tool output;
bounded by the engine's max_model_len). An episode that ends its last allowed turn without done, or whose tool
output leaves no room for one more model token, is truncated: reward 0, ``Sample.finish`` 'max_turns' or
'max_context' (the episode is closed, never scored).

The Sample (rl/types.py): token_ids = prompt + turn 0 + tool 0 + turn 1 + ...; loss_mask 1 exactly on model
tokens; gen_logprobs NaN and gen_version -1 on prompt and tool tokens; one Turn per model turn.

Single-turn tasks (max_turns == 1) run the episode inline on the engine thread and request no kept cache: the
engine sees exactly the requests of a plain single-turn generation.

Failures: an exception from start_episode / step / reward / close (``ToolError`` for infrastructure) is raised
by ``step()`` on the engine thread, so the run stops with its message; ``close()`` then closes every episode
still open.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import queue
import threading
import time
from dataclasses import dataclass, replace

import torch

from ..rl.types import Sample, Turn
from .engine import Engine
from .sampling import SamplingParams
from .sequence import GenerationOutput

log = logging.getLogger(__name__)

__all__ = ["EpisodeLimits", "EpisodeRunner"]


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int = 1
    max_context_tokens: int | None = None  # None: the engine's max_model_len

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.max_context_tokens is not None and self.max_context_tokens < 2:
            raise ValueError(f"max_context_tokens must be >= 2, got {self.max_context_tokens}")


@dataclass(frozen=True)
class _Next:
    """An environment turn's verdict: continue with ``append_ids`` and a turn of ``budget`` tokens, or finish."""

    append_ids: list[int] | None = None
    budget: int = 0
    finish: str = "done"
    reward: float = 0.0
    env_s: float = 0.0


class _Rollout:
    """One sample's episode in flight: the pieces of its sequence so far, and its episode (a future: the episode
    may still be starting on a worker thread)."""

    def __init__(self, rid: int, prompt_ids: list[int], params: SamplingParams, episode: cf.Future):
        self.rid, self.prompt_ids, self.params, self.episode = rid, list(prompt_ids), params, episode
        self.turns: list[Turn] = []
        self.pieces: list[tuple[list[int], torch.Tensor | None, list[int]]] = []  # (tokens, logprobs | None = tool, versions)
        self.context_len = len(prompt_ids)
        self.parked = params.keep_cache  # the engine holds its finished turn's cache: release it when done
        self._lock, self._closed = threading.Lock(), False

    def add_model_turn(self, out: GenerationOutput) -> list[int]:
        n = len(out.logprob_tensor)  # this turn's tokens (out.tokens holds every turn's)
        tokens = list(out.tokens[-n:])
        self.turns.append(Turn(tuple(tokens), out.admission_version, out.mixed_versions))
        self.pieces.append((tokens, out.logprob_tensor.float().cpu(), list(out.versions[-n:])))
        self.context_len = len(out.all_tokens)
        return tokens

    def add_tool_turn(self, append_ids: list[int]) -> None:
        self.pieces.append((list(append_ids), None, []))
        self.context_len += len(append_ids)

    def sample(self, reward: float, finish: str) -> Sample:
        ids, mask, lps, vers = list(self.prompt_ids), [0] * len(self.prompt_ids), [], [-1] * len(self.prompt_ids)
        lps.append(torch.full((len(self.prompt_ids),), float("nan")))
        for tokens, lp, versions in self.pieces:
            ids += tokens
            model = lp is not None
            mask += [int(model)] * len(tokens)
            lps.append(lp if model else torch.full((len(tokens),), float("nan")))
            vers += versions if model else [-1] * len(tokens)
        return Sample(prompt_ids=self.prompt_ids, token_ids=ids, loss_mask=mask, gen_logprobs=torch.cat(lps),
                      gen_version=vers, reward=reward, turns=self.turns, finish=finish)

    def close(self) -> None:
        """Close the episode once (from the worker thread that finished it, or from EpisodeRunner.close)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.episode.done():
            _close_started(self.episode)
        else:  # still starting past the wait: close it once it exists
            self.episode.add_done_callback(_close_started)


def _close_started(f: cf.Future) -> None:
    """Close the episode a start_episode future made (a cancelled or failed start made none)."""
    if not f.cancelled() and f.exception() is None:
        f.result().close()


def _done_future(value) -> cf.Future:
    f = cf.Future()
    f.set_result(value)
    return f


class EpisodeRunner:
    """Runs episodes over ``engine`` (module doc). Not thread-safe: one thread calls start / step / close."""

    def __init__(self, engine: Engine, task, limits: EpisodeLimits, env_workers: int = 4, poll_s: float = 0.002):
        if env_workers < 1:
            raise ValueError(f"env_workers must be >= 1, got {env_workers}")
        self.engine, self.task, self.limits, self.poll_s = engine, task, limits, poll_s
        cap = limits.max_context_tokens or engine.max_model_len
        self.max_context = min(cap, engine.max_model_len)
        self.multi_turn = limits.max_turns > 1
        self.pool = cf.ThreadPoolExecutor(env_workers, thread_name_prefix="env") if self.multi_turn else None
        self.live: dict[int, _Rollout] = {}  # request id -> rollout
        self.pending: dict[cf.Future, tuple[int, _Rollout]] = {}  # environment turns: (submission number, rollout)
        # finished environment turns, put by the pool's threads: a step takes what finished instead of asking
        # every pending future (hundreds in a window of multi-turn rollouts) whether it is done
        self._finished: queue.SimpleQueue[cf.Future] = queue.SimpleQueue()
        self._submitted = 0
        self.stats = {"episodes": 0, "model_turns": 0, "tool_tokens": 0, "truncated": 0, "env_seconds": 0.0}

    def start(self, item, sample_index: int, params: SamplingParams) -> int:
        """Start sample ``sample_index`` of ``item``'s group: its episode and its first model turn."""
        params = replace(params, keep_cache=self.multi_turn)
        first = params
        if self.multi_turn:  # the first turn fits the context cap too (single-turn: the engine checks the length)
            room = self.max_context - len(item.prompt_ids)
            if room < 1:
                raise ValueError(f"prompt {item.prompt_id!r} has {len(item.prompt_ids)} tokens: no room for a turn "
                                 f"under the context cap of {self.max_context} tokens (task max_context_tokens)")
            first = replace(params, max_new_tokens=min(params.max_new_tokens, room))
        rid = self.engine.add_request(item.prompt_ids, first)
        if self.multi_turn:  # start_episode may block too (a sandbox): on the pool; steps wait for it there
            episode = self.pool.submit(self.task.start_episode, item, sample_index)
        else:
            episode = _done_future(self.task.start_episode(item, sample_index))
        self.live[rid] = _Rollout(rid, item.prompt_ids, params, episode)
        return rid

    def has_work(self) -> bool:
        return self.engine.has_work() or bool(self.pending)

    def step(self) -> list[tuple[int, Sample]]:
        """Apply finished environment turns, then one engine step (or, with nothing to decode, wait briefly for
        an environment turn). Returns the rollouts finished, as (request id, Sample)."""
        finished: list[tuple[int, Sample]] = []
        self._apply_finished_env_turns(finished)
        if self.engine.has_work():
            for out in self.engine.step():
                self._model_turn_done(out, finished)
        elif self.pending:
            self._apply_finished_env_turns(finished, wait_s=self.poll_s)
        return finished

    def close(self, wait_s: float = 30.0) -> None:
        """Close every episode still open and stop the pool (the end of a run, or its failure). Queued
        environment turns are cancelled; running ones get ``wait_s`` seconds to finish (an episode's calls do
        not overlap), then their episodes are closed anyway (closing is what stops a hung sandbox; a step must
        bound its own time: a tool call without a timeout keeps its thread). Best effort: a failing close is
        logged, and the others are still closed."""
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            cf.wait(list(self.pending) + [r.episode for r in self.live.values()], timeout=wait_s)
        for r in list(self.live.values()):
            try:
                r.close()
            except Exception:
                log.exception("closing episode of request %d failed", r.rid)
        self.live.clear()
        self.pending.clear()

    # ------------------------------------------------------------------------------------ internals
    def _model_turn_done(self, out: GenerationOutput, finished: list) -> None:
        r = self.live[out.request_id]
        response = r.add_model_turn(out)
        self.stats["model_turns"] += 1
        if self.pool is None:
            self._apply(r, self._env_turn(r, response, out.finish_reason), finished)
        else:
            f = self.pool.submit(self._env_turn, r, response, out.finish_reason)
            self.pending[f] = (self._submitted, r)
            self._submitted += 1
            f.add_done_callback(self._finished.put)

    def _env_turn(self, r: _Rollout, response: list[int], finish_reason: str) -> _Next:
        """The environment's answer to a model turn and what it means under the limits (worker thread)."""
        t0 = time.perf_counter()
        episode = r.episode.result()
        res = episode.step(response, finish_reason)
        if res.done:
            nxt = _Next(reward=float(episode.reward()))
        elif len(r.turns) >= self.limits.max_turns:
            nxt = _Next(finish="max_turns")
        else:
            budget = min(r.params.max_new_tokens, self.max_context - r.context_len - len(res.append_ids))
            nxt = _Next(list(res.append_ids), budget) if budget >= 1 else _Next(finish="max_context")
        if nxt.append_ids is None:
            r.close()
        return replace(nxt, env_s=time.perf_counter() - t0)

    def _apply_finished_env_turns(self, finished: list, wait_s: float = 0.0) -> None:
        """Apply the environment turns finished so far (waiting up to ``wait_s`` for a first one), in the order
        they were submitted."""
        done = []
        try:
            done.append(self._finished.get(timeout=wait_s) if wait_s > 0 else self._finished.get_nowait())
            while True:
                done.append(self._finished.get_nowait())
        except queue.Empty:
            pass
        for _, r, f in sorted((*self.pending.pop(f), f) for f in done if f in self.pending):
            self._apply(r, f.result(), finished)  # re-raises the environment's failure here

    def _apply(self, r: _Rollout, nxt: _Next, finished: list) -> None:
        self.stats["env_seconds"] += nxt.env_s
        if nxt.append_ids is not None:
            last = len(r.turns) + 1 >= self.limits.max_turns  # no turn follows it: no cache to keep
            params = replace(r.params, max_new_tokens=nxt.budget, keep_cache=not last)
            self.engine.continue_request(r.rid, nxt.append_ids, params)
            r.add_tool_turn(nxt.append_ids)
            r.parked = params.keep_cache
            self.stats["tool_tokens"] += len(nxt.append_ids)
            return
        if r.parked:
            self.engine.release(r.rid)
        del self.live[r.rid]
        self.stats["episodes"] += 1
        self.stats["truncated"] += nxt.finish != "done"
        finished.append((r.rid, r.sample(nxt.reward, nxt.finish)))
