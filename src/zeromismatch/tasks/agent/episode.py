"""One terminal-agent rollout: a sandbox with one persistent bash, driven turn by turn.

    ep = task.start_episode(item, sample_index)     # its sandbox starts at the first command (task.pool)
    res = ep.step(response_ids, "stop")             # runs the turn's command; TurnResult(append_ids=<output>...)
    res = ep.step(submit_ids, "stop")               # <submit/>: the verifier runs; TurnResult(done=True)
    ep.reward(); ep.close()

Scored 0 without running the verifier: a truncated turn (finish_reason 'length'), no submit within
``task.max_turns`` turns, the episode's wall-clock limit (``task.episode_timeout_s * task.time_scale``: a
slower generator gets proportionally more time, so a slow numerics arm is not punished in reward), or a sandbox
the agent broke (killed its supervisor). ``outcome`` says which.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from ..base import Episode, PromptItem, TurnResult
from .sandbox import SandboxGone
from .spec import AgentTaskSpec

log = logging.getLogger(__name__)


class AgentEpisode(Episode):
    def __init__(self, task, item: PromptItem, spec: AgentTaskSpec):
        super().__init__(task, item)
        self.spec = spec
        self.started = time.monotonic()
        self.box = None  # started at the first command: an episode waiting for its first turn holds nothing
        self.outcome = "running"  # -> submitted | truncated | max_turns | timeout | sandbox_gone
        self._reward = 0.0
        self.commands = 0

    def _end(self, outcome: str, reward: float = 0.0) -> TurnResult:
        self.outcome, self._reward = outcome, reward
        return TurnResult(done=True)

    def step(self, response_ids: Sequence[int], finish_reason: str | None) -> TurnResult:
        self.responses.append(list(response_ids))
        task = self.task
        if finish_reason == "length":
            return self._end("truncated")
        if time.monotonic() - self.started > task.episode_timeout_s * task.time_scale:
            return self._end("timeout")
        action = task.action_format.parse(task.decode_response(response_ids))
        try:
            if action.kind == "submit":
                return self._end("submitted", self._sandbox().verify(self.spec.test_sh, self.spec.test_files))
            if len(self.responses) >= task.max_turns:
                return self._end("max_turns")
            if action.kind == "bash":
                self.commands += 1
                obs = task.action_format.observation(self._sandbox().run(action.command))
            else:
                obs = task.action_format.no_action()
        except SandboxGone as e:
            log.warning("episode %s: %s; scored 0", self.spec.instance_id, e)
            return self._end("sandbox_gone")
        return TurnResult(append_ids=task.observation_ids(obs))

    def _sandbox(self):
        """The rollout's sandbox, started on first use (a ToolError when it cannot start)."""
        if self.box is None:
            self.box = self.task.pool.acquire(self.spec.sandbox_spec())
        return self.box

    def reward(self) -> float:
        return self._reward

    def close(self) -> None:
        if self.box is not None:
            self.task.pool.release(self.box)
