"""The in-process RL schedules: generator, trainer and reward computation behind two narrow channels.

    rollouts : RolloutWorker -> RunAheadBuffer (groups, stamped with admission versions) -> Trainer
    weights  : Trainer -> WeightChannel -> RolloutWorker (hot swap between engine steps)

offpolicy-N semantics are those of rl/offpolicy.py: a (N+1) x P slot buffer, age at consumption, drop if
age > N, a slot freed once the step that trained on it has its weights in the generator.

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
from typing import Callable

import torch

from ..rl.offpolicy import Batch
from .rollouts import RolloutWorker


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
                if worker.has_work():
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
                    raise RuntimeError(f"generator thread failed: {type(errors[0]).__name__}: {errors[0]}") from errors[0]
                with worker.lock:
                    batch = worker.buffer.assemble_batch(step)
                if batch is None:
                    time.sleep(poll_s)
            on_step(step, batch, time.perf_counter() - t0)
            channel.publish(trainer.version, trainer.weights())
            if after_step is not None:  # in-flight groups are saved as prompts + seeds: a resume regenerates them
                after_step(step)
    finally:
        stop.set()
        thread.join()
