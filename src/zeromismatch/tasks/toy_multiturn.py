"""A built-in multi-turn toy task for rollout tests and quick runs: the toy task's random-token prompts, 2 or 3
model turns per episode (by the prompt id's parity), each followed by a deterministic "tool" output (a
function of the turn's tokens and its index, 2-6 tokens); reward = the fraction of model turns that start
with a token from the lower half of the vocabulary (learnable, with variance from the start).

``tool_error_turn=k`` makes every episode's step after model turn k raise ToolError: the failure path of a run
(the run must stop with the message, and close its episodes). ``live_episodes`` counts the episodes started and
not yet closed, so tests can check that none is left behind."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from .base import Episode, PromptItem, ToolError, TurnResult
from .toy import ToyTask


def tool_output(response: Sequence[int], turn: int, vocab: int) -> list[int]:
    """The toy tool's answer to model turn ``turn``: 2-6 tokens fixed by the response and the turn."""
    h = sum(int(t) for t in response) * 31 + 7 * turn
    return [(h + 13 * i) % vocab for i in range(2 + h % 5)]


class ToyMultiTurnTask(ToyTask):
    name = "toy_multiturn"

    max_turns = 3

    def __init__(self, vocab_size: int, seed: int = 0, tool_error_turn: int | None = None, min_len: int = 4,
                 max_len: int = 40):
        super().__init__(vocab_size, seed=seed, min_len=min_len, max_len=max_len)
        self.tool_error_turn = tool_error_turn
        self._lock = threading.Lock()
        self.live_episodes = 0

    def turns_wanted(self, prompt_id: int) -> int:
        return 2 + prompt_id % 2

    def start_episode(self, item: PromptItem, sample_index: int) -> Episode:
        with self._lock:
            self.live_episodes += 1
        return ToyEpisode(self, item)

    def episode_closed(self) -> None:
        with self._lock:
            self.live_episodes -= 1


class ToyEpisode(Episode):
    task: ToyMultiTurnTask

    def __init__(self, task: ToyMultiTurnTask, item: PromptItem):
        super().__init__(task, item)
        self._closed = False

    def step(self, response_ids: Sequence[int], finish_reason: str | None) -> TurnResult:
        turn = len(self.responses)
        self.responses.append(list(response_ids))
        if self.task.tool_error_turn == turn:
            raise ToolError(f"toy tool failed after model turn {turn} (task.tool_error_turn={turn})")
        if len(self.responses) >= self.task.turns_wanted(self.item.prompt_id):
            return TurnResult(done=True)
        return TurnResult(tool_output(response_ids, turn, self.task.vocab))

    def reward(self) -> float:
        low = [bool(r) and r[0] < self.task.vocab // 2 for r in self.responses]
        return sum(low) / len(low) if low else 0.0

    def close(self) -> None:
        if self._closed:
            raise RuntimeError("episode closed twice")
        self._closed = True
        self.task.episode_closed()
