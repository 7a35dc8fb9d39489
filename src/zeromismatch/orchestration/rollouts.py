"""The generator side of RL: prompts -> episodes on the engine (generator/episodes.py) -> scored groups of rollouts -> the
run-ahead buffer."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..generator import Engine, SamplingParams
from ..rl.offpolicy import RunAheadBuffer
from ..rl.types import Group, Sample
from ..generator.episodes import EpisodeLimits, EpisodeRunner


@dataclass
class _GroupInFlight:
    ticket: int
    item: object  # tasks.base.PromptItem
    position: int  # 1-based position of the prompt in the train stream: keys its sampling seeds
    pending: set[int]
    samples: dict[int, Sample] = field(default_factory=dict)  # request id (in sample order) -> finished rollout


class RolloutWorker:
    """Owns the engine. Admits prompt groups while the buffer has slots, runs each sample's episode (model
    turns on the engine, environment turns on ``env_workers`` threads), and hands each group to the buffer once
    all its samples are scored. ``params`` are every model turn's SamplingParams (max_new_tokens: the per-turn
    cap); ``limits``: turns and context (default: the task's max_turns, the engine's max_model_len). Call
    ``close()`` when the run ends or fails: it closes the episodes still open."""

    def __init__(self, engine: Engine, task, buffer: RunAheadBuffer, samples_per_prompt: int,
                 params: SamplingParams, seed: int, swap_policy: str = "keep", prompts_consumed: int = 0,
                 limits: EpisodeLimits | None = None, env_workers: int = 4):
        self.engine, self.task, self.buffer = engine, task, buffer
        self.episodes = EpisodeRunner(engine, task, limits or EpisodeLimits(max_turns=task.max_turns), env_workers)
        self.g, self.params, self.seed = samples_per_prompt, params, seed
        self.swap_policy = swap_policy
        self.prompts = task.train_prompts(start=prompts_consumed)  # deterministic from the seed: resumable
        self.prompts_consumed = prompts_consumed
        self.groups: dict[int, _GroupInFlight] = {}  # request id -> group
        self.lock = threading.Lock()  # guards buffer (shared with the trainer thread in async mode)
        self.tokens_generated = 0

    def admit_available(self) -> int:
        n = 0
        with self.lock:
            while self.buffer.can_admit():
                self.prompts_consumed += 1
                item = next(self.prompts)
                self.start_group(self.buffer.admit(item.prompt_id), item, self.prompts_consumed)
                n += 1
        return n

    def start_group(self, ticket: int, item, position: int) -> None:
        """Add the group's samples to the engine; their seeds depend on the run seed and the prompt's stream
        position only, so a group regenerated on resume samples with the seeds it had."""
        grp = _GroupInFlight(ticket, item, position, set())
        for j in range(self.g):
            sp = SamplingParams(**{**self.params.__dict__, "seed": hash((self.seed, position, j)) % (2**62)})
            rid = self.episodes.start(item, j, sp)
            grp.pending.add(rid)
            self.groups[rid] = grp

    def state(self) -> dict:
        """What a checkpoint keeps of the generator side (call under ``lock``, at a step boundary): the buffer,
        the data position, and each group still generating as (ticket, prompt item, stream position)."""
        in_flight = {g.ticket: (g.ticket, g.item, g.position) for g in self.groups.values()}
        return {"buffer": self.buffer, "prompts_consumed": self.prompts_consumed,
                "in_flight": [in_flight[t] for t in sorted(in_flight)]}

    def restore_in_flight(self, in_flight: list) -> None:
        """Regenerate the checkpoint's in-flight groups from their prompts and seeds under the weights the
        generator runs now. Their partial rollouts were not saved; readmitting them under the current version
        makes their admission stamps true of the regenerated tokens, and keeps their slots (no prompt of the
        stream is skipped or admitted twice)."""
        with self.lock:
            self.buffer.abandon_in_flight()
            for _, item, position in in_flight:
                self.start_group(self.buffer.admit(item.prompt_id), item, position)

    def step(self) -> int:
        """One engine step (finished environment turns applied first); completes the groups whose samples all
        finished. Returns groups completed."""
        done = 0
        finished = self.episodes.step()
        with self.lock:  # a checkpoint sees each group either in flight (in self.groups) or complete
            for rid, sample in finished:
                self.tokens_generated += sum(len(t.tokens) for t in sample.turns)
                grp = self.groups.pop(rid)
                grp.pending.discard(rid)
                grp.samples[rid] = sample
                if not grp.pending:
                    self.buffer.complete(grp.ticket, Group(grp.item.prompt_id, [s for _, s in sorted(grp.samples.items())]))
                    done += 1
        return done

    def has_work(self) -> bool:
        """Sequences to decode or environment turns running."""
        return self.episodes.has_work()

    def drain(self) -> None:
        while self.has_work():
            self.step()

    def close(self) -> None:
        """Close every episode still open (no sandbox outlives the run) and stop the environment threads."""
        self.episodes.close()

    def apply_weights(self, version: int, weights: dict) -> None:
        """Hot swap; then the slots of the step that produced these weights are free."""
        self.engine.update_weights(weights, version=version, policy=self.swap_policy)
        with self.lock:
            self.buffer.release_after_weights_reached_generator(version - 1)
