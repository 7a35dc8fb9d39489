"""The disaggregated schedule's protocol: the generator in one process, the trainer in another, over
torch.distributed point-to-point messages (gloo between CPU processes; the same code path is what a multi-GPU
run uses for the control messages). runner.py builds each side. The offpolicy-N semantics are run_async's: the RunAheadBuffer lives with the generator
(admission stamps, drops at consumption, slot release once the weights of the step that trained on them
arrive), the trainer asks for the batch of step s, trains, and sends its weights with the next request.

    trainer -> generator (group A): ("next", s, version, weights | None) | ("state",) | ("stop",)
    generator -> trainer (group B): ("batch", s, Batch, generator stats) | ("state", RolloutWorker.state())
                                    | ("error", exception type name, message)

("state",) is sent at a step boundary, before the next request, for a checkpoint: the generator answers with
its run-ahead buffer, in-flight groups and data position (a resume regenerates the in-flight groups, as
in run_async).

A generator failure (a ToolError from an episode, any exception) is sent to the trainer, which raises it
with the generator's message (GeneratorFailed, or the ToolError itself); the generator then waits for the
trainer's ("stop",) and returns, so the trainer's error is the run's.

One group per direction: the generator receives on a thread of its own (blocking recvs; gloo's irecv cannot
be polled) while its main loop steps the engine and sends batches.
"""

from __future__ import annotations

import io
import queue
import threading
import time

import torch
import torch.distributed as dist

from ..tasks.base import ToolError
from .rollouts import RolloutWorker


def send_obj(obj, dst: int, group) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)
    payload = torch.frombuffer(bytearray(buf.getbuffer()), dtype=torch.uint8)
    dist.send(torch.tensor([payload.numel()], dtype=torch.int64), dst=dst, group=group)
    dist.send(payload, dst=dst, group=group)


def recv_obj(src: int, group):
    size = torch.zeros(1, dtype=torch.int64)
    dist.recv(size, src=src, group=group)
    payload = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.recv(payload, src=src, group=group)
    return torch.load(io.BytesIO(payload.numpy().tobytes()), weights_only=False)


def make_groups():
    """(trainer->generator group, generator->trainer group); call on every rank, same order."""
    return dist.new_group([0, 1]), dist.new_group([0, 1])


class GeneratorFailed(RuntimeError):
    """The generator process failed; the message is its exception's."""


def serve_generator(worker: RolloutWorker, trainer_rank: int, groups, poll_s: float = 0.002) -> None:
    """Generator process: step the engine continuously; apply weights as they arrive; answer batch requests.
    A failure is reported to the trainer (module doc)."""
    to_gen, to_trainer = groups
    inbox: queue.Queue = queue.Queue()

    def receive():
        while True:
            msg = recv_obj(trainer_rank, to_gen)
            inbox.put(msg)
            if msg[0] == "stop":
                return

    threading.Thread(target=receive, name="generator-inbox", daemon=True).start()
    try:
        _serve(worker, trainer_rank, to_trainer, inbox, poll_s)
    except Exception as e:
        msgs = []
        while not inbox.empty():
            msgs.append(inbox.get())
        if any(m[0] == "stop" for m in msgs):  # the trainer is done and gone: nobody to tell
            return
        send_obj(("error", type(e).__name__, str(e)), trainer_rank, to_trainer)
        while inbox.get()[0] != "stop":  # the trainer raises, then stops us
            pass


def _serve(worker: RolloutWorker, trainer_rank: int, to_trainer, inbox: queue.Queue, poll_s: float) -> None:
    want = None
    while True:
        try:
            msg = inbox.get_nowait()
        except queue.Empty:
            msg = None
        if msg is not None and msg[0] == "stop":
            return
        if msg is not None and msg[0] == "state":  # buffer and position are only touched by this thread
            send_obj(("state", worker.state()), trainer_rank, to_trainer)
        elif msg is not None:
            _, step, version, weights = msg
            if weights is not None:
                worker.apply_weights(version, weights)
            want = step
        worker.admit_available()
        if worker.has_work():
            worker.step()
        else:
            time.sleep(poll_s)
        if want is not None:
            with worker.lock:
                batch = worker.buffer.assemble_batch(want)
            if batch is not None:
                stats = {"generated_tokens_per_s": worker.engine.throughput()["generated_tokens_per_s"]}
                send_obj(("batch", want, batch, stats), trainer_rank, to_trainer)
                want = None


def run_trainer(trainer, start: int, steps: int, on_step, generator_rank: int, groups, after_step=None) -> None:
    """Trainer process: request the batch of each step, train (on_step(step, batch, waited, stats)), send the
    new weights with the next request; stop the generator at the end. after_step(step, generator_state) runs
    at each step boundary; generator_state() fetches RolloutWorker.state() from the generator."""
    to_gen, to_trainer = groups

    def receive(kind: str):
        msg = recv_obj(generator_rank, to_trainer)
        if msg[0] == "error":
            _, name, text = msg
            raise ToolError(text) if name == "ToolError" else GeneratorFailed(f"generator failed: {name}: {text}")
        assert msg[0] == kind, (msg[0], kind)
        return msg[1:]

    def generator_state() -> dict:
        send_obj(("state",), generator_rank, to_gen)
        return receive("state")[0]

    send_obj(("next", start, None, None), generator_rank, to_gen)
    try:
        for step in range(start, steps):
            t0 = time.perf_counter()
            s, batch, stats = receive("batch")
            assert s == step, (s, step)
            on_step(step, batch, time.perf_counter() - t0, stats)
            if after_step is not None:
                after_step(step, generator_state)
            if step + 1 < steps:
                weights = {k: v.detach().cpu() for k, v in trainer.weights().items()}
                send_obj(("next", step + 1, trainer.version, weights), generator_rank, to_gen)
    finally:
        send_obj(("stop",), generator_rank, to_gen)
