"""rl.backend=ray: the trainer (ray.trainer_ranks FSDP2 ranks) and ray.generators generators as Ray actors,
driven from this process, which holds the run-ahead buffer, the prompt stream, the router and the TrainerLoop.

    prompts ─► admit (RunAheadBuffer, stamped with the live version) ─► Router ─► GeneratorRole i (submit)
    GeneratorRole i (collect) ─► RunAheadBuffer.complete ─► assemble_batch ─► TrainerRank x W (train_step)
    TrainerRank 0 ─► WeightSync broadcast (version + weights) ─► every GeneratorRole

offpolicy-N semantics are the threaded mode's (controller.py): admission stamps the version every generator
runs (slots of step s are released once version s + 1 is live in ALL generators, so no group is admitted
under weights some generator lacks); a group whose turns carry a version the buffer has not seen released
yet waits here until it is; drops at consumption; deterministic=true is lockstep (generate until nothing is
in flight, train, sync, repeat), deterministic=false lets the generators run while the trainer steps.

The push overlaps the next trainer step (deterministic=false): after step s the driver starts the broadcast of
version s + 1 and goes on to assemble and train step s + 1 from what the run-ahead window already holds; the
generators swap when their copy is complete and report the version they run, which is what releases slots.
A push starts once the previous one is finished (one broadcast at a time on the group). Lockstep finishes each
push before the next admission, as the threaded lockstep does.

Faults: a generator actor that dies is restarted by Ray (ray.max_restarts); its groups still in flight are
taken back from the router, the weight-sync group is opened again with the new process, the current weights
are broadcast, and the groups are assigned again from their prompts and seeds (their slots were never given
up: none is lost, and a group that had come back complete is kept, so none is trained twice).
"""

from __future__ import annotations

import logging
import time

import ray
from ray.exceptions import RayActorError, RayTaskError

from omegaconf import OmegaConf

from ..model_init import initial_model, uses_sft_warm_start
from ..sft import ensure_sft_checkpoint
from ..tasks.base import ToolError
from ..tasks.registry import build_task
from .build import build_buffer, for_generation
from .checkpoint import load_rl_checkpoint, restore_rng
from .ray_actors import GeneratorRole, NotInWeightSync, TrainerRank, free_port
from .ray_cluster import actor_options, connect, shutdown
from .trainer_loop import TrainerLoop
from .router import Router
from .weight_sync import pick_transport

log = logging.getLogger(__name__)

__all__ = ["GeneratorFailed", "RayRun", "RemoteTrainer", "run_on_ray"]


def run_on_ray(cfg) -> dict:
    """The whole run on a Ray cluster (ray_cluster.connect); the TrainerLoop's result."""
    if uses_sft_warm_start(cfg):  # built once, here, before every actor loads it from the cache
        ensure_sft_checkpoint(cfg)
    started = connect(cfg.ray)
    cfg_dict = OmegaConf.to_container(cfg, resolve=True)
    run = None
    try:
        model = initial_model(cfg)  # this process evaluates; the actors train and generate
        task = build_task(cfg, vocab_size=model.config.vocab_size)
        ckpt = load_rl_checkpoint(cfg.job.get("resume"))
        trainer = RemoteTrainer(cfg_dict, cfg.ray, for_generation(model))
        start = ckpt["step"] if ckpt else 0
        if ckpt:
            restore_rng(ckpt)
        buffer = build_buffer(cfg, version=trainer.version, resume=ckpt)
        run = RayRun(cfg, cfg_dict, task, buffer, trainer, prompts_consumed=ckpt["prompts_consumed"] if ckpt else 0,
                     in_flight=ckpt.get("in_flight", []) if ckpt else [])
        loop = TrainerLoop(cfg, trainer, task, start)

        def after_step(step):
            if loop.checkpoint_due(step):
                loop.save(step, run.state())

        loop.log_initial_validation()
        try:
            run.run(start, loop.steps, loop.on_step, after_step, lockstep=bool(cfg.rl.deterministic))
        except BaseException:
            loop.abort()
            raise
        finally:
            task.close()
        out = loop.finish()
        out.update(generator_restarts=run.recovered, groups_regenerated=run.regenerated, weight_sync=run.transport)
        return out
    finally:
        if run is not None:
            run.close()
        shutdown(started)


class GeneratorFailed(RuntimeError):
    """A generator actor failed; the message is its exception's."""


def _raise_cause(e: RayTaskError):
    cause = e.cause
    if isinstance(cause, ToolError):
        raise ToolError(str(cause)) from e
    raise GeneratorFailed(f"generator failed: {type(cause).__name__}: {cause}") from e


class RemoteTrainer:
    """The trainer ranks behind the Trainer interface TrainerLoop and the checkpoints use: train_step,
    version, model (a local copy with the current weights, for evaluation), state_dict (full tensors)."""

    def __init__(self, cfg_dict: dict, rcfg, eval_model):
        # method threads: rank 0 pushes weights on one while the next step trains on another; a third keeps both
        # going while a push abandoned after a generator's death waits for its timeout
        cls = ray.remote(TrainerRank).options(**actor_options(rcfg.trainer_resources, max_concurrency=3))
        world = int(rcfg.trainer_ranks)
        self.ranks = [cls.remote(cfg_dict, r, world) for r in range(world)]
        addr, port = ray.get(self.ranks[0].address.remote())
        self.version = ray.get([r.setup.remote(addr, port) for r in self.ranks])[0]
        self.staleness_split = bool(cfg_dict["rl"].get("staleness_split", True))
        self._eval_model, self._eval_version = eval_model, None

    def train_step(self, batch) -> dict:
        ref = ray.put(batch)
        metrics = ray.get([r.train_step.remote(ref) for r in self.ranks])[0]
        self.version += 1
        return metrics

    @property
    def model(self):
        if self._eval_version != self.version:
            self._eval_version, weights = ray.get(self.ranks[0].full_weights.remote())
            self._eval_model.load_state_dict(weights)
        return self._eval_model

    def state_dict(self) -> dict:
        return ray.get([r.full_state.remote() for r in self.ranks])[0]


class RayRun:
    """The driver's side of one run: admission, routing, collection, weight sync, recovery."""

    def __init__(self, cfg, cfg_dict: dict, task, buffer, trainer: RemoteTrainer, *, prompts_consumed: int,
                 in_flight: list, poll_s: float = 0.05):
        rcfg = cfg.ray
        self.cfg, self.buffer, self.trainer, self.poll_s = cfg, buffer, trainer, poll_s
        opts = actor_options(rcfg.generator_resources, max_restarts=int(rcfg.max_restarts), max_concurrency=4)
        cls = ray.remote(GeneratorRole)
        self.gens = [cls.options(name=f"generator-{i}", **opts).remote(cfg_dict, i) for i in range(int(rcfg.generators))]
        self.boots = ray.get([g.ping.remote() for g in self.gens])  # a restarted actor answers a new one
        self.router = Router(len(self.gens))
        self.prompts = task.train_prompts(start=prompts_consumed)
        self.prompts_consumed = prompts_consumed
        self.outbox: dict[int, list] = {i: [] for i in range(len(self.gens))}
        self.held: dict[int, tuple] = {}  # ticket -> (group, start): complete, waiting for its versions' release
        self.live = [trainer.version] * len(self.gens)
        self.gen_stats = {"generated_tokens_per_s": 0.0}
        self.recovered = self.regenerated = 0
        self.push: tuple | None = None  # the broadcast in flight: (send ref, receive refs)
        shares_gpu = float(rcfg.generator_resources.num_gpus) < 1 or float(rcfg.trainer_resources.num_gpus) < 1
        self.transport = rcfg.weight_sync if rcfg.weight_sync != "auto" else pick_transport(cfg.device, shares_gpu)
        self._open_sync()
        self.buffer.abandon_in_flight()  # a resume regenerates the checkpoint's in-flight groups
        for _, item, position in in_flight:
            self._route((self.buffer.admit(item.prompt_id), item, position))

    # --------------------------------------------------------------------------------- weight sync
    def _open_sync(self) -> None:
        port, world = free_port(), len(self.gens) + 1
        host = "127.0.0.1" if not self.cfg.ray.address else ray.get(self.trainer.ranks[0].address.remote())[0]
        calls = [self.trainer.ranks[0].open_sync.remote(host, port, world, self.transport)]
        calls += [g.open_sync.remote(host, port, i + 1, world, self.transport) for i, g in enumerate(self.gens)]
        ray.get(calls)

    def start_push(self) -> None:
        """Start broadcasting the trainer's newest weights with their version, and return: the trainer goes on
        to its next step while they travel; each generator swaps them in between engine steps once its copy
        is complete. One broadcast at a time on the group: the previous push is finished first."""
        self.finish_push()
        send = self.trainer.ranks[0].send_weights.remote(self.trainer.version)
        self.push = (send, [g.receive_weights.remote() for g in self.gens])

    def finish_push(self) -> None:
        """Wait for the push in flight. A generator that died meanwhile breaks the round for every member (gloo
        sees the closed connection): it is recovered, which opens the group again and pushes again."""
        if self.push is None:
            return
        dead, failures = self._wait_push()
        if dead:
            for i in dead:
                self._recover(i)
        elif failures:
            raise failures[0]

    def _wait_push(self) -> tuple[list, list]:
        """(generators that died during the push in flight, other failures); no push is in flight after it.
        The receives are waited for first: once one shows a death, neither the send nor the other receives
        are waited for (a gloo send to a member killed mid-transfer only fails at the weight-sync timeout);
        they end on their own and the recovery opens a new group."""
        (send, recvs), self.push = self.push, None
        dead, failures, waiting = [], [], {ref: i for i, ref in enumerate(recvs)}
        while waiting and not dead:
            ready, _ = ray.wait(list(waiting), num_returns=1)
            i = waiting.pop(ready[0])
            try:
                ray.get(ready[0])
            except RayActorError:
                dead.append(i)
            except RayTaskError as e:
                if isinstance(e.cause, NotInWeightSync):  # died and restarted before this call reached it
                    dead.append(i)
                else:
                    failures.append(e)
        if not dead:
            try:
                ray.get(send)
            except RayTaskError as e:
                failures.append(e)
        return dead, failures

    # ------------------------------------------------------------------------------ admission, routing
    def admit(self) -> None:
        while self.buffer.can_admit():
            self.prompts_consumed += 1
            item = next(self.prompts)
            self._route((self.buffer.admit(item.prompt_id), item, self.prompts_consumed))
        for i, starts in self.outbox.items():
            if starts:
                self.gens[i].submit.remote(starts)
                self.outbox[i] = []

    def _route(self, start) -> None:
        self.outbox[self.router.assign(start[0], start)].append(start)

    def collect(self, wait_s: float | None = None) -> None:
        """Take finished groups from every generator (waiting up to wait_s, default poll_s), hand over those
        whose versions are released, release slots once a new version is live everywhere."""
        wait_s = self.poll_s if wait_s is None else wait_s
        results = self._get([g.collect.remote(wait_s) for g in self.gens])
        rates = 0.0
        for i, out in enumerate(results):
            if out is None:  # restarted: its groups were routed again
                continue
            done, live, stats, boot = out
            if boot != self.boots[i]:  # died and restarted while no call was waiting on it
                self._recover(i)
                continue
            self.live[i] = live
            rates += stats["generated_tokens_per_s"]
            for ticket, group in done:
                if self.router.generator_of(ticket) != i:  # a start sent to a generator that then died, run twice
                    continue
                self.held[ticket] = (group, self.router.done(ticket))
        self.gen_stats = {"generated_tokens_per_s": rates}
        live = min(self.live)
        if live > self.buffer.generator_version:
            self.buffer.release_after_weights_reached_generator(live - 1)
        for ticket in sorted(self.held):
            group, _ = self.held[ticket]
            if max(t.admission_version for s in group.samples for t in s.turns) <= self.buffer.generator_version:
                self.buffer.complete(ticket, group)
                del self.held[ticket]

    def state(self) -> dict:
        """RolloutWorker.state()'s contents, from the driver: buffer, data position, groups in flight."""
        in_flight = self.router.in_flight() + [start for _, start in self.held.values()]
        return {"buffer": self.buffer, "prompts_consumed": self.prompts_consumed,
                "in_flight": sorted(in_flight, key=lambda s: s[0])}

    # -------------------------------------------------------------------------------------- faults
    def _get(self, refs: list) -> list:
        """ray.get each generator's call (refs[i]: generator i's); a dead generator is recovered (its result
        None); a failure inside a generator stops the run with its message (ToolError kept as such)."""
        out = []
        for g, ref in enumerate(refs):
            try:
                out.append(ray.get(ref))
            except RayActorError:
                self._recover(g)
                out.append(None)
            except RayTaskError as e:
                _raise_cause(e)
        return out

    def _recover(self, g: int) -> None:
        if self.push is not None:  # its outcome does not matter: the group is opened again and pushed to below
            self._wait_push()
        starts = self.router.lost(g)
        log.warning("generator %d died: restarting it, %d groups to regenerate", g, len(starts))
        deadline = time.time() + 300
        while True:
            try:
                self.boots[g] = ray.get(self.gens[g].ping.remote(), timeout=60)
                break
            except RayActorError:
                if time.time() > deadline:
                    raise
                time.sleep(0.5)
        self._open_sync()  # every member again: the old group had the dead process in it
        calls = [self.trainer.ranks[0].send_weights.remote()] + [x.receive_weights.remote() for x in self.gens]
        ray.get(calls)
        while ray.get(self.gens[g].collect.remote(self.poll_s))[1] != self.trainer.version:
            pass
        self.live[g] = self.trainer.version
        self.recovered += 1
        self.regenerated += len(starts)
        for start in starts:
            self._route(start)

    # ------------------------------------------------------------------------------------ schedules
    def run(self, start: int, steps: int, on_step, after_step, lockstep: bool) -> None:
        for step in range(start, steps):
            t0 = time.perf_counter()
            while True:
                self.admit()
                # async: when the window already holds this step's batch, it trains at once (the push of the
                # previous version still travelling) and the generators are only looked at, not waited for
                batch = None if lockstep else self.buffer.assemble_batch(step)
                self.collect(0.0 if batch is not None else self.poll_s)
                if batch is not None:
                    break
                if lockstep and (self.buffer.num_in_flight or self.held):
                    continue
                batch = self.buffer.assemble_batch(step)
                if batch is not None:
                    break
                if lockstep and not self.buffer.can_admit():
                    raise RuntimeError("run-ahead buffer full but no batch can be assembled")
            on_step(step, batch, time.perf_counter() - t0, self.gen_stats)
            self.start_push()
            if lockstep:  # the step boundary: the new weights live everywhere before anything is admitted
                self.finish_push()
                while min(self.live) != self.trainer.version:
                    self.collect()
            after_step(step)
        self.finish_push()

    def close(self) -> None:
        """Close every generator's episodes and task, then end the actors (a cluster that is attached to
        outlives the run)."""
        for g in self.gens:
            try:
                ray.get(g.close.remote(), timeout=60)
            except (RayActorError, RayTaskError):
                pass
        for actor in self.gens + self.trainer.ranks:
            ray.kill(actor, no_restart=True)
