"""The two roles of an rl.backend=ray run, as plain classes that ray_run.py turns into actors.

GeneratorRole: one engine and its episodes. The run's driver admits prompt groups and sends their starts
(ticket, prompt item, stream position: the sampling seeds follow from the position); an engine thread of the
actor's own keeps stepping, applies new weights between engine steps (the swap policy decides whether
in-flight caches are kept or recomputed), and hands back each group once all its samples are scored. A
group never leaves the generator it started on.

TrainerRank: one rank of the trainer. Every rank runs train_step on the same batch (FSDP2 over
torch.distributed inside the actors, trainer/distributed.py) and gathers the full weights after it; rank 0
broadcasts them to the generators (weight_sync.py), with the version, on a second method thread while the
next step trains.

Weights travel only through the weight-sync group, never inside a batch or a start message.
"""

from __future__ import annotations

import faulthandler
import os
import random
import socket
import threading
import time
import uuid

import torch
from omegaconf import OmegaConf

from ..model_init import initial_model
from ..tasks.registry import build_task
from ..trainer.distributed import apply_fsdp, init_distributed
from ..trainer.full_state import full_trainer_state, load_full_trainer_state
from .build import build_rollout_engine, build_trainer, build_worker, for_generation
from .checkpoint import load_rl_checkpoint, trained_weights
from .controller import WeightChannel
from .weight_sync import WeightSync, layout_of

__all__ = ["GeneratorRole", "NotInWeightSync", "TrainerRank", "free_port"]

# a broadcast is seconds even for large models; a member that died can leave the others waiting until this
SYNC_TIMEOUT_S = 120.0


class NotInWeightSync(RuntimeError):
    """A generator asked to receive weights before joining a weight-sync group: a restarted process."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(cfg_dict: dict):
    """The role's config, seeds and starting model (every role builds the same one from the seed)."""
    cfg = OmegaConf.create(cfg_dict)
    if str(cfg.device).startswith("cuda"):
        # Ray lists only the GPUs it gave this actor in CUDA_VISIBLE_DEVICES: the first is cuda:0 here, whatever
        # index the driver's config names
        cfg.device = "cuda:0"
    # a native crash (SIGSEGV / SIGABRT) dumps every Python thread's stack into the worker's log, not just the
    # crashing thread's (Ray enables the current thread only; a crash in a native thread then shows none)
    faulthandler.enable(all_threads=True)
    torch.set_num_threads(1)  # one intra-op thread per actor, as the threaded runner (runner.py says why)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    return cfg, initial_model(cfg)


class _Completed:
    """Where a generator's RolloutWorker puts finished groups (its buffer lives with the driver)."""

    def __init__(self):
        self.groups: list = []

    def complete(self, ticket: int, group) -> None:
        self.groups.append((ticket, group))


class GeneratorRole:
    def __init__(self, cfg_dict: dict, index: int, poll_s: float = 0.002):
        cfg, model = _start(cfg_dict)
        self.index, self.poll_s = index, poll_s
        self.boot = uuid.uuid4().hex  # a new value per process: how the driver tells a restarted actor
        ckpt = load_rl_checkpoint(cfg.job.get("resume"))
        version = 0
        if ckpt:
            version, weights = trained_weights(ckpt)
            model.load_state_dict(weights)
        self.task = build_task(cfg, vocab_size=model.config.vocab_size)
        self.engine = build_rollout_engine(cfg, for_generation(model), self.task, version=version)
        self.completed = _Completed()
        self.worker = build_worker(cfg, self.engine, self.task, self.completed)
        self.layout = layout_of(model.state_dict())
        self.swap_policy = cfg.rl.swap_policy
        self.device = str(cfg.device)
        self.channel, self.sync, self.received = WeightChannel(), None, version
        self.cond = threading.Condition()
        self.inbox: list = []
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=f"generator-{index}", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        try:
            while not self.stop.is_set():
                item = self.channel.take()
                if item is not None and item[0] != self.engine.version:  # same version: the same weights
                    self.engine.update_weights(item[1], version=item[0], policy=self.swap_policy)
                with self.cond:
                    starts, self.inbox = self.inbox, []
                for ticket, prompt, position in starts:
                    self.worker.start_group(ticket, prompt, position)
                if self.worker.has_work():
                    if self.worker.step():
                        with self.cond:
                            self.cond.notify_all()
                else:
                    time.sleep(self.poll_s)
        except BaseException as e:  # raised to the driver by the next collect()
            self.error = e
            with self.cond:
                self.cond.notify_all()

    # ------------------------------------------------------------------------------- the driver's calls
    def submit(self, starts: list) -> None:
        with self.cond:
            self.inbox.extend(starts)

    def collect(self, wait_s: float = 0.05) -> tuple[list, int, dict, str]:
        """(finished groups as (ticket, Group), the weight version live in the engine, engine throughput,
        this process's boot id); waits up to ``wait_s`` for a group to finish."""
        with self.cond:
            if not self.completed.groups and self.error is None:
                self.cond.wait(wait_s)
        if self.error is not None:
            raise self.error
        with self.worker.lock:
            done, self.completed.groups = self.completed.groups, []
        return done, self.engine.version, self.engine.throughput(), self.boot

    def open_sync(self, host: str, port: int, rank: int, world: int, transport: str) -> None:
        self.sync = WeightSync(host, port, rank, world, transport, device=self.device, timeout_s=SYNC_TIMEOUT_S)

    def receive_weights(self) -> int:
        """Take part in the next broadcast; the engine thread swaps the weights in between engine steps."""
        if self.sync is None:
            raise NotInWeightSync(f"generator {self.index} restarted and has not joined the weight sync")
        version, weights = self.sync.recv(self.layout)
        with self.cond:
            # a push abandoned after another generator's death can complete after the recovery's newer one
            stale, self.received = version <= self.received, max(version, self.received)
        if not stale:
            self.channel.publish(version, weights)
        return version

    def ping(self) -> str:
        return self.boot

    def in_flight(self) -> int:
        """Groups submitted here and not yet finished (monitoring)."""
        with self.cond:
            queued = len(self.inbox)
        with self.worker.lock:
            return queued + len({id(g) for g in self.worker.groups.values()})

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.worker.close()
        self.task.close()


class TrainerRank:
    """One trainer rank; rank 0 also pushes the weights. Its methods run on several threads (ray_run.py): a
    push (send_weights) on one while the next train_step runs on another, so it sends a kept copy of its
    version's weights, never the live parameters."""

    def __init__(self, cfg_dict: dict, rank: int, world: int):
        self.cfg_dict, self.rank, self.world = cfg_dict, rank, world
        self.trainer, self.sync = None, None
        self.lock = threading.Lock()
        self.kept: dict[int, dict] = {}  # rank 0: version -> full weights, the newest two (a push may lag one step)
        self.pushes: list[list[float]] = []  # rank 0: [start, end] of recent pushes, monotonic seconds (end 0: running)
        self.last_push_s = 0.0

    def address(self) -> tuple[str, int]:
        """This node's address and a free port: rank 0's is the trainer group's rendezvous."""
        import ray  # optional dependency: this module is imported by Ray workers only

        return ray.util.get_node_ip_address(), free_port()

    def setup(self, master_addr: str, master_port: int) -> int:
        """Join the trainer's process group, build the (FSDP-wrapped) model and the Trainer, restore the
        checkpoint job.resume names; returns the version."""
        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), RANK=str(self.rank),
                          WORLD_SIZE=str(self.world), LOCAL_RANK="0")
        cfg, model = _start(self.cfg_dict)
        if self.world > 1:
            init_distributed("nccl" if str(cfg.device).startswith("cuda") else "gloo")
            model = apply_fsdp(model)
        self.trainer = build_trainer(cfg, model)
        ckpt = load_rl_checkpoint(cfg.job.get("resume"))
        if ckpt:
            load_full_trainer_state(self.trainer, ckpt["trainer"])
        self._keep(self.trainer.weights())  # collective under FSDP
        self.device = str(cfg.device)
        return self.trainer.version

    def _keep(self, full: dict) -> None:
        if self.rank != 0:  # only rank 0 pushes and serves the evaluation copy
            return
        with self.lock:
            self.kept[self.trainer.version] = full
            for v in [v for v in self.kept if v < self.trainer.version - 1]:
                del self.kept[v]

    def train_step(self, batch) -> dict | None:
        t0 = time.monotonic()
        metrics = self.trainer.train_step(batch)
        self._keep(self.trainer.weights())  # collective: every rank gathers, rank 0 keeps them to push
        if self.rank != 0:
            return None
        metrics.update(self._push_stats(t0, time.monotonic()))
        return metrics

    def _push_stats(self, t0: float, t1: float) -> dict:
        """How long pushes ran during this step (the overlap), and how long the last finished one took."""
        with self.lock:
            spans = [(a, b or t1) for a, b in self.pushes]
            self.pushes = [p for p in self.pushes if not p[1]]  # a finished push cannot overlap a later step
        overlap = float(sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in spans))
        return {"perf/weight_sync/overlap_seconds": overlap, "perf/weight_sync/push_seconds": self.last_push_s}

    def open_sync(self, host: str, port: int, world: int, transport: str) -> None:
        self.sync = WeightSync(host, port, 0, world, transport, device=self.device, timeout_s=SYNC_TIMEOUT_S)

    def send_weights(self, version: int | None = None) -> int:
        """Broadcast the kept weights of ``version`` (default: the newest) with that version."""
        with self.lock:
            version = max(self.kept) if version is None else version
            weights, span = self.kept[version], [time.monotonic(), 0.0]
            self.pushes.append(span)
        sync = self.sync  # the driver may open a new group while this push waits on a dead member
        try:
            sync.send(version, weights)
        except BaseException:
            # a member died: close this end, so that the generators still waiting on the broadcast fail now
            # instead of at the timeout; the driver opens a new group
            sync.close()
            raise
        finally:
            with self.lock:
                span[1] = time.monotonic()
                self.last_push_s = span[1] - span[0]
        return version

    def full_weights(self) -> tuple[int, dict]:
        with self.lock:
            version = max(self.kept)
            full = self.kept[version]
        return version, {k: v.detach().cpu() for k, v in full.items()}

    def full_state(self) -> dict | None:
        """Collective: the trainer's full state (trainer/full_state.py) on rank 0, for a checkpoint."""
        sd = full_trainer_state(self.trainer)
        return sd if self.rank == 0 else None
