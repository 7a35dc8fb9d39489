"""The async RL controller: generator, trainer and reward computation behind two narrow channels.

    rollouts : RolloutWorker -> RunAheadBuffer (groups, stamped with admission versions) -> Trainer
    weights  : Trainer -> WeightChannel -> RolloutWorker (hot swap between engine steps)

offpolicy-N semantics are those of rl.offpolicy (NOTES 5): a (N+1) x P slot buffer, age at consumption,
drop if age > N, a slot freed once the step that trained on it has its weights in the generator.

Two schedules:
- `run_async`: the generator runs in its own thread and keeps sampling while the trainer steps; weights
  land whenever the generator next looks (between engine steps), so a sequence can mix versions.
- `run_lockstep` (deterministic): generate until every admitted group is done, train one step, push the
  weights, repeat. The staleness pattern (which groups each step sees, at which age) is a function of
  the seed alone, so small experiments reproduce run to run and a killed run resumes bit for bit.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..generator import Engine, SamplingParams
from ..generator.engine import GenerationOutput
from .offpolicy import Batch, RunAheadBuffer
from .types import Group, Sample, Turn


class WeightChannel:
    """Newest published weights; the generator takes them between engine steps (older ones are skipped)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._item: tuple[int, dict] | None = None

    def publish(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        with self._lock:
            self._item = (version, weights)

    def take(self) -> tuple[int, dict] | None:
        with self._lock:
            item, self._item = self._item, None
            return item


def sample_from_output(out: GenerationOutput, reward: float) -> Sample:
    """Single-turn rollout -> Sample (per-token fields aligned with prompt + response tokens)."""
    p, n = len(out.prompt_ids), len(out.tokens)
    nan = torch.full((p,), float("nan"))
    return Sample(
        prompt_ids=out.prompt_ids,
        token_ids=out.all_tokens,
        loss_mask=[0] * p + [1] * n,
        gen_logprobs=torch.cat([nan, out.logprob_tensor.float()]),
        gen_version=[-1] * p + list(out.versions),
        reward=reward,
        turns=[Turn(tuple(out.tokens), out.admission_version)],
    )


@dataclass
class _GroupInFlight:
    ticket: int
    item: object  # tasks.base.PromptItem
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

    def _next_prompt(self):
        self.prompts_consumed += 1
        return next(self.prompts)

    def admit_available(self) -> int:
        n = 0
        with self.lock:
            while self.buffer.can_admit():
                item = self._next_prompt()
                ticket = self.buffer.admit(item.prompt_id)
                grp = _GroupInFlight(ticket, item, set())
                for j in range(self.g):
                    sp = SamplingParams(**{**self.params.__dict__, "seed": hash((self.seed, self.prompts_consumed, j)) % (2**62)})
                    rid = self.engine.add_request(item.prompt_ids, sp)
                    grp.pending.add(rid)
                    self.groups[rid] = grp
                n += 1
        return n

    def step(self) -> int:
        """One engine step; completes the groups whose samples all finished. Returns groups completed."""
        done = 0
        for out in self.engine.step():
            self.tokens_generated += len(out.tokens)
            grp = self.groups.pop(out.request_id)
            grp.pending.discard(out.request_id)
            grp.outputs[out.request_id] = out
            if not grp.pending:
                samples = [sample_from_output(o, self.task.reward(o.tokens, grp.item.gold)) for _, o in sorted(grp.outputs.items())]
                with self.lock:
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


StepFn = Callable[[int, Batch, float], None]  # (step, batch, seconds waited for the batch)


def run_lockstep(worker: RolloutWorker, trainer, start: int, steps: int, on_step: StepFn, after_step=None) -> None:
    for step in range(start, steps):
        t0 = time.perf_counter()
        while True:
            worker.admit_available()
            worker.drain()
            with worker.lock:
                batch = worker.buffer.assemble_batch(step)
            if batch is not None:
                break
            if not worker.buffer.can_admit():
                raise RuntimeError("run-ahead buffer full but no batch can be assembled")
        waited = time.perf_counter() - t0
        on_step(step, batch, waited)
        worker.apply_weights(trainer.version, trainer.weights())
        if after_step is not None:  # step boundary: nothing in flight, weights live in the generator
            after_step(step)


def run_async(worker: RolloutWorker, trainer, start: int, steps: int, on_step: StepFn, after_step=None,
              poll_s: float = 0.002) -> None:
    """Generator thread samples continuously; the trainer (this thread) trains whenever a batch is ready."""
    channel, stop, errors = WeightChannel(), threading.Event(), []

    def generate():
        try:
            while not stop.is_set():
                item = channel.take()
                if item is not None:
                    worker.apply_weights(*item)
                worker.admit_available()
                if worker.engine.has_work():
                    worker.step()
                else:
                    time.sleep(poll_s)
        except BaseException as e:  # surface generator failures in the trainer thread
            errors.append(e)
            stop.set()

    thread = threading.Thread(target=generate, name="generator", daemon=True)
    thread.start()
    try:
        for step in range(start, steps):
            t0 = time.perf_counter()
            batch = None
            while batch is None:
                if errors:
                    raise RuntimeError("generator thread failed") from errors[0]
                with worker.lock:
                    batch = worker.buffer.assemble_batch(step)
                if batch is None:
                    time.sleep(poll_s)
            on_step(step, batch, time.perf_counter() - t0)
            channel.publish(trainer.version, trainer.weights())
            if after_step is not None:  # in-flight rollouts are not saved: a resume regenerates them
                after_step(step)
    finally:
        stop.set()
        thread.join()
