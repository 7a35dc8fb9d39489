"""The generator engine: continuous batching over the shared model definition.

    engine = Engine(model, max_slots=64)
    ids = [engine.add_request(prompt_ids, SamplingParams(seed=i)) for i, prompt_ids in enumerate(prompts)]
    while engine.has_work():
        for out in engine.step():        # one forward over decode tokens + prefill pieces
            ...                          # out.tokens, out.logprobs (raw, fp32), out.versions

The Engine keeps the requests (waiting, running, parked between turns) and the weight version; each step it
admits waiting requests into free slots, schedules (scheduler.py), allocates the KV blocks the scheduled pieces
write, executes one forward (model_runner.py), samples the sequences whose known tokens are now all computed,
and retires finished ones. Slots, KV blocks and the prefix cache belong to kv_cache_manager.py. In steady decode
(graph runner), the next step is staged on the device before this step's samples are read back (stage_ahead), so
the host's bookkeeping runs while the GPU computes.

Preemption (as vLLM v1): when the pieces need more blocks than are free after evicting prefix-cache entries,
parked sequences (idle) and then running ones, most recently admitted first, drop their blocks and slot and
wait at the front of the queue. Re-admitted, a sequence recomputes its prompt and generated tokens (prefix-cache
hits allowed). Only a piece that reaches the last known token samples, so the recompute draws nothing from the
sequence's generator until the sample it would have drawn next: under bi / bi_chunk its tokens and logprobs
are bit-identical to an un-preempted run. The recompute runs under the current weights: after a 'keep' swap a
preempted sequence continues on a cache of the new weights only, as under the 'recompute' policy; its earlier
tokens keep the versions that sampled them, and admission_version stays its turn's. A preempted parked
sequence stays parked (releasable); continue_request queues it to recompute its whole context. Parked
sequences also give up a slot when they hold every slot and nothing runs, so waiting requests always progress.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque

import torch

from .cache import BLOCK_SIZE, CacheStorage
from .kv_cache_manager import BlockAllocator, KVCacheManager
from .model_runner import ModelRunner
from .prefix_cache import PrefixCache
from .sampling import SamplingParams, sample, sample_on_device
from .scheduler import Work, schedule
from .sequence import GenerationOutput, Sequence

log = logging.getLogger(__name__)


def _to_host(tokens: torch.Tensor, logprobs: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """The step's one device-to-host transfer: tokens and the fp32 logprob bits in one int32 buffer."""
    both = torch.stack([tokens.to(torch.int32), logprobs.float().contiguous().view(torch.int32)]).cpu()
    return both[0].tolist(), both[1].view(torch.float32)


class Engine:
    def __init__(
        self,
        model,
        max_slots: int = 64,
        num_blocks: int | None = None,
        max_batched_tokens: int = 2048,
        max_model_len: int = 4096,
        prefix_caching: bool = True,
        swap_policy: str = "keep",
        device=None,
        cuda_graphs: bool | None = None,
        device_sampling: bool | None = None,
        piece_interval: int = 1,
        stage_ahead: bool = True,
    ):
        """cuda_graphs: capture and replay decode steps per batch bucket (default: on CUDA, for models without
        routed experts; on a CPU device True runs the same bucketed, padded path without capture);
        device_sampling: the batched Gumbel-max sampler on the logits' device (default: on CUDA); off, every row
        draws on the CPU from its request's generator (sampling.py says how the two schemes differ);
        piece_interval: while decode rows run, prefill pieces (prompts, tool output) join every piece_interval-th
        step and wait in between (1: every step). A step with pieces runs them eagerly (only decode rows replay a
        graph), and a multi-turn task brings a tool turn's output nearly every step: holding pieces back a few
        steps runs them together in one eager forward. Which step computes a row changes none of its bits in
        bi and bi_chunk (batch invariance).
        stage_ahead (graph runner only): when every running sequence decoded this step and the next step can only
        be all of them decoding again (no request to admit, none finishing by length), queue that step's inputs on
        the device before reading this step's samples back, and allocate its blocks; the next step then replays at
        once unless a sample ended a sequence or the caller changed the engine in between, in which case it is
        scheduled as usual. The host's scheduling then overlaps the GPU's work instead of leaving the GPU idle
        between steps. Same rows, same graphs: no bit changes."""
        if swap_policy not in ("keep", "recompute"):
            raise ValueError(f"swap_policy must be 'keep' or 'recompute', got {swap_policy!r}")
        if int(piece_interval) < 1:
            raise ValueError(f"piece_interval must be >= 1, got {piece_interval!r}")
        self.piece_interval, self._pieces_held = int(piece_interval), 0
        self.stage_ahead, self._staged = bool(stage_ahead), None
        self.model = model
        self.device = torch.device(device or next(model.parameters()).device)
        on_cuda = self.device.type == "cuda"
        self.cuda_graphs = (on_cuda and not model.config.is_moe) if cuda_graphs is None else cuda_graphs
        if self.cuda_graphs and on_cuda and model.config.is_moe:
            # ops/moe's CUDA forms have no host sync (tests/gpu/test_gpu_moe.py replays one under a graph), but the
            # whole MoE decode step has not been run captured on a GPU yet: eager until it has
            raise ValueError("cuda_graphs=True: routed experts are not yet verified under CUDA-graph capture; "
                             "use cuda_graphs=False")
        self.device_sampling = on_cuda if device_sampling is None else device_sampling
        dtype = next(model.parameters()).dtype
        self.max_slots, self.max_model_len = max_slots, max_model_len
        self.max_batched_tokens = max_batched_tokens
        blocks_per_seq = (max_model_len + BLOCK_SIZE - 1) // BLOCK_SIZE
        self.num_blocks = num_blocks or max_slots * blocks_per_seq + 64
        # the one CacheStorage, shared by the cache manager (slots, blocks, snapshots) and the model runner
        self.storage = CacheStorage(model.config, model.numerics.gdn, max_slots, self.num_blocks, self.device, dtype,
                                    spare=self.cuda_graphs)
        self.kv = KVCacheManager(self.storage, max_slots, self.num_blocks, prefix_caching)
        self.runner = ModelRunner(model, self.storage, self.device, self.cuda_graphs, blocks_per_seq)
        self.memory = self.memory_report()
        log.info("engine memory (bytes, sized from the config): %s", self.memory)
        self.swap_policy = swap_policy
        self.version = 0
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.parked: dict[int, Sequence] = {}  # finished with keep_cache: slot kept for a next turn
        self._ids = itertools.count()
        self._live: set[int] = set()  # ids of waiting, running and parked requests
        # audit hook: tap(name, activation [N, ...], layout, request_ids) for every forward (parity/audit.py)
        self.tap = None
        self.stats = {"steps": 0, "forward_s": 0.0, "tokens_computed": 0, "tokens_generated": 0, "prefix_hit_tokens": 0,
                      "preemptions": 0, "parked_preemptions": 0}

    # the cache manager's state, for inspection (tests check slots, blocks and prefix entries)
    @property
    def free_slots(self) -> list[int]:
        return self.kv.free_slots

    @property
    def alloc(self) -> BlockAllocator:
        return self.kv.alloc

    @property
    def prefix(self) -> PrefixCache | None:
        return self.kv.prefix

    # ------------------------------------------------------------------------------------- requests
    def add_request(self, prompt_ids: list[int], params: SamplingParams | None = None, request_id: int | None = None) -> int:
        params = params or SamplingParams()
        if not prompt_ids:
            raise ValueError("prompt_ids is empty: a request needs at least one prompt token")
        if len(prompt_ids) + params.max_new_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({len(prompt_ids)}) + max_new_tokens ({params.max_new_tokens}) exceeds max_model_len={self.max_model_len}"
            )
        self._check_token_ids(prompt_ids, "prompt_ids")
        self._check_fits(len(prompt_ids) + params.max_new_tokens, "request")
        if request_id is None:
            rid = next(self._ids)
            while rid in self._live:  # skip ids the caller passed explicitly
                rid = next(self._ids)
        elif request_id in self._live:
            raise ValueError(f"request id {request_id} is already in use (waiting, running or parked)")
        else:
            rid = request_id
        self._live.add(rid)
        seed = params.seed if params.seed is not None else rid
        seq = Sequence(rid, list(prompt_ids), params, torch.Generator().manual_seed(seed), self.version,
                       tokens=list(prompt_ids), seed=seed)
        self.waiting.append(seq)
        return rid

    def continue_request(self, request_id: int, new_tokens: list[int], params: SamplingParams | None = None) -> None:
        """Multi-turn: append tokens (a tool's output) to a finished sequence kept with keep_cache and resume
        generation from its cached state."""
        if request_id not in self.parked:
            raise KeyError(f"request {request_id} is not parked: finish it with SamplingParams(keep_cache=True) first")
        seq = self.parked[request_id]
        params = params or seq.params
        # validate before touching the sequence: on error it stays parked (and releasable)
        if len(seq.tokens) + len(new_tokens) + params.max_new_tokens > self.max_model_len:
            raise ValueError(f"request {request_id} would exceed max_model_len={self.max_model_len}")
        self._check_token_ids(new_tokens, "new_tokens")
        self._check_fits(len(seq.tokens) + len(new_tokens) + params.max_new_tokens, f"request {request_id}")
        del self.parked[request_id]
        seq.params = params
        seq.tokens.extend(new_tokens)
        seq.finish_reason, seq.turn_start = None, len(seq.generated)
        seq.admission_version = self.version
        if seq.slot < 0:  # preempted while parked: recomputes its context once admitted
            self.waiting.append(seq)
        else:
            self.running.append(seq)

    def release(self, request_id: int) -> None:
        """Free a parked sequence's slot and blocks."""
        if request_id not in self.parked:
            raise KeyError(f"request {request_id} is not parked (finished without keep_cache, or unknown)")
        self.kv.release(self.parked.pop(request_id))
        self._live.discard(request_id)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---------------------------------------------------------------------------------------- step
    def step(self) -> list[GenerationOutput]:
        """admit -> schedule -> allocate (preempting) -> execute -> sample -> retire; returns the requests this
        step finished."""
        staged, self._staged = self._staged, None
        if staged is not None and self._still_next(staged):
            work = [Work(s, 1) for s in staged.seqs]  # what schedule() would return: every running row decodes
            self._pieces_held = 0
        else:
            staged = None
            admitted = self._admit()
            ready, hits = self.kv.lookup_prefixes(self.running)
            work = schedule(ready, self.max_batched_tokens, self.max_slots, prefill=self._pieces_due(ready))
            if not work:
                if self.running:
                    raise RuntimeError("no sequence can make progress: raise max_batched_tokens")
                return []
            work = self._allocate(work, admitted)
            # a hit given back by a preemption skipped nothing
            self.stats["prefix_hit_tokens"] += sum(n for s, n in hits.items() if s.slot >= 0)
            if not work:
                return []
        t0 = time.perf_counter()
        logits = self.runner.replay_staged(staged) if staged else self.runner.execute(work, self.tap)
        to_sample = [w.seq for w in work if w.samples]
        if logits.shape[0] != len(to_sample):  # a host fact: a row of another sequence would be sampled
            raise RuntimeError(f"the model runner returned {logits.shape[0]} logit rows for {len(to_sample)} "
                               "sampling pieces")
        params = [s.params for s in to_sample]
        if self.device_sampling:
            tokens, logprobs = sample_on_device(logits, params, [s.seed for s in to_sample],
                                                [s.num_tokens for s in to_sample])
        else:
            tokens, logprobs = sample(logits, params, [s.gen for s in to_sample])
        self._staged = self._stage_next(work, tokens)  # before the samples come back: the GPU keeps working
        tokens, logprobs = _to_host(tokens, logprobs)
        self.stats["forward_s"] += time.perf_counter() - t0
        self.stats["steps"] += 1
        self.stats["tokens_computed"] += sum(w.n_tokens for w in work)
        for w in work:
            w.seq.num_computed += w.n_tokens
            self.kv.cache_prefix(w.seq)
        finished = self._append_samples(to_sample, tokens, logprobs)
        return [self._retire(s) for s in finished]

    def _stage_next(self, work: list[Work], tokens: torch.Tensor):
        """The next step's inputs queued on the device (stage_ahead), or None when that step may differ from
        every running sequence decoding one token: this step had other pieces or left a sequence out, a waiting
        request would be admitted, a sequence ends by length now, or a block it needs is not free (allocating
        it would evict or preempt: left to the scheduled path)."""
        if not (self.stage_ahead and self.runner.cuda_graphs and self.tap is None):
            return None
        seqs = [w.seq for w in work]
        if seqs != self.running or not all(w.n_tokens == 1 and w.samples for w in work):
            return None
        if self.waiting and self.kv.has_free_slot():
            return None
        if any(len(s.generated) - s.turn_start + 1 >= s.params.max_new_tokens for s in seqs):
            return None
        # the next step writes position num_computed + 1 of each sequence
        need = sum(max(0, self.kv.blocks_needed(s, s.num_computed + 2)) for s in seqs)
        if need > self.kv.alloc.num_free():
            return None
        for s in seqs:
            self.kv.allocate_blocks(s, s.num_computed + 2)
        return self.runner.stage_decode(seqs, tokens)

    def _still_next(self, staged) -> bool:
        """Whether the staged step is still what the scheduler would run now: the same sequences running, in the
        same order (none finished, none continued), nothing to admit, no audit tap, the graph runner on."""
        return (staged.seqs == self.running and self.tap is None and self.runner.cuda_graphs
                and not (self.waiting and self.kv.has_free_slot()))

    def _pieces_due(self, ready: list[Sequence]) -> bool:
        """Whether prefill pieces join this step (piece_interval): always when no decode row would run without
        them, else on every piece_interval-th step that has pieces waiting."""
        if self.piece_interval == 1:
            return True
        waiting = any(s.num_uncomputed > 1 for s in ready)
        if not waiting or not any(s.num_uncomputed == 1 for s in ready):
            self._pieces_held = 0
            return True
        self._pieces_held += 1
        if self._pieces_held >= self.piece_interval:
            self._pieces_held = 0
            return True
        return False

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams] | None = None) -> list[GenerationOutput]:
        """Run requests to completion; outputs in request order."""
        plist = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(plist)} SamplingParams: pass one, or one per prompt")
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
        done: dict[int, GenerationOutput] = {}
        while self.has_work():
            for out in self.step():
                done[out.request_id] = out
        return [done[i] for i in ids]

    # ---------------------------------------------------------------------------------- weights
    def update_weights(self, state_dict: dict[str, torch.Tensor], version: int | None = None, policy: str | None = None) -> None:
        """Hot-swap weights between steps. policy 'keep': in-flight sequences continue on their caches (a
        sequence can mix versions, as the published runs); 'recompute': their caches are rebuilt under the
        new weights before they continue. Prefix-cache entries of old weights are dropped either way, and a
        sequence that keeps an old-weight cache never publishes its blocks to the prefix cache again."""
        policy = policy or self.swap_policy
        if policy not in ("keep", "recompute"):
            raise ValueError(f"policy must be 'keep' or 'recompute', got {policy!r}")
        self._staged = None  # a 'recompute' swap moves every sequence back; a staged step is simply scheduled again
        self.runner.load_weights(state_dict)
        self.version = self.version + 1 if version is None else version
        self.kv.clear_prefix_cache()
        if policy == "recompute":
            for s in self.running + list(self.parked.values()):
                self.kv.reset_computed(s)
        else:  # kept caches hold old-weight tokens: they must not re-enter the (just cleared) prefix cache
            for s in self.running + list(self.parked.values()):
                if s.num_computed > 0:
                    s.stale_cache = True

    # --------------------------------------------------------------------------------- internals
    def _admit(self) -> list[Sequence]:
        """Waiting requests take free slots in queue order; returns the sequences admitted."""
        if self.waiting and not self.running and not self.kv.has_free_slot():
            self._preempt_parked()  # parked sequences hold every slot: nothing could ever run
        admitted = []
        while self.waiting and self.kv.has_free_slot():
            seq = self.waiting.popleft()
            self.kv.admit(seq)
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    def _allocate(self, work: list[Work], admitted: list[Sequence]) -> list[Work]:
        """Give each piece the blocks it writes, in admission order, preempting when the pool runs dry until
        the piece fits or its own sequence was preempted; returns the pieces still scheduled. Victims come
        from the end of the admission order, so a piece never takes blocks from an older sequence: the
        oldest always progresses (and fits alone, as add_request checked)."""
        rank = {s: i for i, s in enumerate(self.running)}
        for w in sorted(work, key=lambda w: rank[w.seq]):
            while w.seq.slot >= 0 and not self.kv.allocate_blocks(w.seq, w.seq.num_computed + w.n_tokens):
                if not self._preempt_parked():
                    self._preempt_newest(admitted)
        return [w for w in work if w.seq.slot >= 0]

    def _preempt_parked(self) -> bool:
        """Preempt the longest-parked sequence that still holds a cache; False when none does."""
        s = next((s for s in self.parked.values() if s.slot >= 0), None)
        if s is None:
            return False
        self.kv.preempt(s)
        self.stats["parked_preemptions"] += 1
        return True

    def _preempt_newest(self, admitted: list[Sequence]) -> None:
        """Send the most recently admitted running sequence back to the front of the queue. One admitted this
        step computed nothing yet: it just waits again and is not counted."""
        s = self.running.pop()
        self.kv.preempt(s)
        self.waiting.appendleft(s)
        if s not in admitted:
            self.stats["preemptions"] += 1

    def _append_samples(self, seqs: list[Sequence], tokens: list[int], logprobs: torch.Tensor) -> list[Sequence]:
        """Append each sampled token; returns the sequences this token finished."""
        finished = []
        # fp32 values as Python floats (exact both ways): one conversion a step, not a tensor view per row
        for s, tok, lp in zip(seqs, tokens, logprobs.tolist()):
            s.tokens.append(tok)
            s.generated.append(tok)
            s.logprobs.append(lp)
            s.versions.append(self.version)
            s.mixed_versions |= s.stale_cache
            turn_len = len(s.generated) - s.turn_start
            if tok in s.params.stop_token_ids:
                s.finish_reason = "stop"
            elif turn_len >= s.params.max_new_tokens:
                s.finish_reason = "length"
            if s.finish_reason:
                finished.append(s)
        self.stats["tokens_generated"] += len(seqs)
        return finished

    def _retire(self, s: Sequence) -> GenerationOutput:
        """A finished sequence leaves the running set: parked for a next turn (keep_cache) or released."""
        self.running.remove(s)
        if s.params.keep_cache:
            self.parked[s.request_id] = s
        else:
            self.kv.release(s)
            self._live.discard(s.request_id)
        return self._output(s)

    def _output(self, s: Sequence) -> GenerationOutput:
        lp = torch.tensor(s.logprobs[s.turn_start :], dtype=torch.float32).to(self.device)
        return GenerationOutput(
            s.request_id,
            s.prompt_ids,
            list(s.generated),
            list(s.logprobs),
            list(s.versions),
            s.admission_version,
            s.finish_reason,
            list(s.tokens),
            lp,
            s.mixed_versions,
        )

    def _check_fits(self, n_tokens: int, what: str) -> None:
        # the last sampled token is never fed back: n_tokens - 1 positions get KV; preemption can free every
        # other block, so a request fails only when it alone exceeds the pool
        need = (n_tokens - 1 + BLOCK_SIZE - 1) // BLOCK_SIZE
        if need > self.num_blocks:
            raise ValueError(
                f"{what} needs {need} KV blocks of {BLOCK_SIZE} tokens ({n_tokens} tokens) but the engine has "
                f"num_blocks={self.num_blocks}: raise num_blocks or shorten the request"
            )

    def _check_token_ids(self, ids: list[int], what: str) -> None:
        # an out-of-range id would fail inside step() and wedge every request of the batch
        vocab = self.model.config.vocab_size
        if ids and (min(ids) < 0 or max(ids) >= vocab):
            raise ValueError(f"{what} has token ids outside [0, {vocab}): min {min(ids)}, max {max(ids)}")

    def capture_graphs(self) -> None:
        """Capture every decode graph up front (ModelRunner.capture_all says why); a no-op without CUDA graphs."""
        if self.cuda_graphs and self.device.type == "cuda":
            t0 = time.perf_counter()
            n = self.runner.capture_all()
            log.info("captured %d decode graphs in %.1f s", n, time.perf_counter() - t0)

    def memory_report(self) -> dict[str, int]:
        """What the engine holds on its device, sized from the config: weights, the cache storage (GDN state of
        max_slots slots, num_blocks KV blocks; the spare slot and block of the graph runner included)."""
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
        return {"weights": weights, "cache_storage": self.storage.memory_bytes(), "max_slots": self.max_slots,
                "num_blocks": self.num_blocks, "cuda_graphs": int(self.cuda_graphs)}

    def throughput(self) -> dict[str, float]:
        f = max(self.stats["forward_s"], 1e-9)
        return {
            "generated_tokens_per_s": self.stats["tokens_generated"] / f,
            "computed_tokens_per_s": self.stats["tokens_computed"] / f,
            **self.stats,
        }
