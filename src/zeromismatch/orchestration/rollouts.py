"""The generator side of RL: prompts -> engine -> scored groups of rollouts -> the run-ahead buffer."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from ..generator import Engine, SamplingParams
from ..generator.engine import GenerationOutput
from ..rl.offpolicy import RunAheadBuffer
from ..rl.types import Group, Sample, Turn


def sample_from_output(out: GenerationOutput, reward: float) -> Sample:
    """Single-turn rollout -> Sample (per-token fields aligned with prompt + response tokens). The generator's
    logprobs live on its device; a Sample lives on the CPU (rl/types.py), so they are copied there (exact)."""
    p, n = len(out.prompt_ids), len(out.tokens)
    nan = torch.full((p,), float("nan"))
    return Sample(
        prompt_ids=out.prompt_ids,
        token_ids=out.all_tokens,
        loss_mask=[0] * p + [1] * n,
        gen_logprobs=torch.cat([nan, out.logprob_tensor.float().cpu()]),
        gen_version=[-1] * p + list(out.versions),
        reward=reward,
        turns=[Turn(tuple(out.tokens), out.admission_version)],
    )


@dataclass
class _GroupInFlight:
    ticket: int
    item: object  # tasks.base.PromptItem
    position: int  # 1-based position of the prompt in the train stream: keys its sampling seeds
    pending: set[int]
    outputs: dict[int, GenerationOutput] = field(default_factory=dict)


class RolloutWorker:
    """Owns the engine. Admits prompt groups while the buffer has slots, steps the engine, scores
    finished groups with the task's reward and hands them to the buffer."""

    def __init__(self, engine: Engine, task, buffer: RunAheadBuffer, samples_per_prompt: int,
                 params: SamplingParams, seed: int, swap_policy: str = "keep", prompts_consumed: int = 0):
        self.engine, self.task, self.buffer = engine, task, buffer
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
                self._start_group(self.buffer.admit(item.prompt_id), item, self.prompts_consumed)
                n += 1
        return n

    def _start_group(self, ticket: int, item, position: int) -> None:
        """Add the group's samples to the engine; their seeds depend on the run seed and the prompt's stream
        position only, so a group regenerated on resume samples with the seeds it had."""
        grp = _GroupInFlight(ticket, item, position, set())
        for j in range(self.g):
            sp = SamplingParams(**{**self.params.__dict__, "seed": hash((self.seed, position, j)) % (2**62)})
            rid = self.engine.add_request(item.prompt_ids, sp)
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
                self._start_group(self.buffer.admit(item.prompt_id), item, position)

    def step(self) -> int:
        """One engine step; completes the groups whose samples all finished. Returns groups completed."""
        done = 0
        finished = self.engine.step()
        with self.lock:  # a checkpoint sees each group either in flight (in self.groups) or complete
            for out in finished:
                self.tokens_generated += len(out.tokens)
                grp = self.groups.pop(out.request_id)
                grp.pending.discard(out.request_id)
                grp.outputs[out.request_id] = out
                if not grp.pending:
                    samples = [sample_from_output(o, self.task.reward(o.tokens, grp.item.gold)) for _, o in sorted(grp.outputs.items())]
                    self.buffer.complete(grp.ticket, Group(grp.item.prompt_id, samples))
                    done += 1
        return done

    def drain(self) -> None:
        while self.engine.has_work():
            self.step()

    def apply_weights(self, version: int, weights: dict) -> None:
        """Hot swap; then the slots of the step that produced these weights are free."""
        self.engine.update_weights(weights, version=version, policy=self.swap_policy)
        with self.lock:
            self.buffer.release_after_weights_reached_generator(version - 1)
