"""The disaggregated schedule's protocol: the generator in one process, the trainer in another, over
torch.distributed point-to-point messages (gloo between CPU processes; the same code path is what a multi-GPU
run uses for the control messages). runner.py builds each side. The offpolicy-N semantics are run_async's: the RunAheadBuffer lives with the generator
(admission stamps, drops at consumption, slot release once the weights of the step that trained on them
arrive), the trainer asks for the batch of step s, trains, and sends its weights with the next request.

    trainer -> generator (group A): ("next", s, version, weights | None) | ("state",) | ("stop",)
    generator -> trainer (group B): ("batch", s, Batch, generator stats) | ("state", RolloutWorker.state())

("state",) is sent at a step boundary, before the next request, for a checkpoint: the generator answers with
its run-ahead buffer, in-flight groups and data position (a resume regenerates the in-flight groups, as
in run_async).

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


def serve_generator(worker: RolloutWorker, trainer_rank: int, groups, poll_s: float = 0.002) -> None:
    """Generator process: step the engine continuously; apply weights as they arrive; answer batch requests."""
    to_gen, to_trainer = groups
    inbox: queue.Queue = queue.Queue()

    def receive():
        while True:
            msg = recv_obj(trainer_rank, to_gen)
            inbox.put(msg)
            if msg[0] == "stop":
                return

    threading.Thread(target=receive, name="generator-inbox", daemon=True).start()
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
        if worker.engine.has_work():
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

    def generator_state() -> dict:
        send_obj(("state",), generator_rank, to_gen)
        kind, state = recv_obj(generator_rank, to_trainer)
        assert kind == "state", kind
        return state

    send_obj(("next", start, None, None), generator_rank, to_gen)
    try:
        for step in range(start, steps):
            t0 = time.perf_counter()
            kind, s, batch, stats = recv_obj(generator_rank, to_trainer)
            assert kind == "batch" and s == step, (kind, s, step)
            on_step(step, batch, time.perf_counter() - t0, stats)
            if after_step is not None:
                after_step(step, generator_state)
            if step + 1 < steps:
                weights = {k: v.detach().cpu() for k, v in trainer.weights().items()}
                send_obj(("next", step + 1, trainer.version, weights), generator_rank, to_gen)
    finally:
        send_obj(("stop",), generator_rank, to_gen)
