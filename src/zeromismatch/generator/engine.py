"""The generator engine: continuous batching over the shared model definition.

    engine = Engine(model, max_slots=64)
    ids = [engine.add_request(prompt_ids, SamplingParams(seed=i)) for i, prompt_ids in enumerate(prompts)]
    while engine.has_work():
        for out in engine.step():        # one forward over decode tokens + prefill pieces
            ...                          # out.tokens, out.logprobs (raw, fp32), out.versions

Each step: admit waiting requests into free slots (prefix-cache lookup), schedule, run ONE forward with a
BatchCacheView, sample the sequences whose known tokens are now all computed, retire finished ones.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from .cache import BLOCK_SIZE, BatchCacheView, BlockAllocator, CacheStorage
from .prefix_cache import PrefixCache, block_hashes
from .sampling import SamplingParams, sample
from .scheduler import schedule


@dataclass
class GenerationOutput:
    request_id: int
    prompt_ids: list[int]
    tokens: list[int]  # generated tokens of all turns (appended tool tokens are not included)
    logprobs: list[float]  # raw generator logprob of each generated token (fp32 values)
    versions: list[int]  # weight version that sampled each generated token
    admission_version: int  # weight version when the current turn was admitted
    finish_reason: str  # "stop" | "length"
    all_tokens: list[int] = field(default_factory=list)  # prompt + every turn, as the trainer will see it
    logprob_tensor: torch.Tensor | None = None  # fp32 logprobs of this turn's generated tokens, bit-exact


@dataclass(eq=False)
class Sequence:
    request_id: int
    prompt_ids: list[int]
    params: SamplingParams
    gen: torch.Generator
    admission_version: int
    tokens: list[int] = field(default_factory=list)
    num_computed: int = 0
    slot: int = -1
    block_table: list[int] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    logprobs: list[torch.Tensor] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turn_start: int = 0  # index into `generated` where the current turn starts
    looked_up: bool = False
    finish_reason: str | None = None
    stale_cache: bool = False  # cache kept across a 'keep' swap: mixes weight versions, never shared

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def num_uncomputed(self) -> int:
        return len(self.tokens) - self.num_computed


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
    ):
        if swap_policy not in ("keep", "recompute"):
            raise ValueError(f"swap_policy must be 'keep' or 'recompute', got {swap_policy!r}")
        self.model = model
        self.device = device or next(model.parameters()).device
        dtype = next(model.parameters()).dtype
        self.max_slots, self.max_model_len = max_slots, max_model_len
        self.max_batched_tokens = max_batched_tokens
        blocks_per_seq = (max_model_len + BLOCK_SIZE - 1) // BLOCK_SIZE
        self.num_blocks = num_blocks or max_slots * blocks_per_seq + 64
        self.storage = CacheStorage(model.config, model.numerics.gdn, max_slots, self.num_blocks, self.device, dtype)
        self.alloc = BlockAllocator(self.num_blocks)
        self.prefix = PrefixCache(self.alloc, max_entries=self.num_blocks // 2) if prefix_caching else None
        self.swap_policy = swap_policy
        self.version = 0
        self.free_slots = list(range(max_slots - 1, -1, -1))
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.parked: dict[int, Sequence] = {}  # finished with keep_cache: slot kept for a next turn
        self._ids = itertools.count()
        self._live: set[int] = set()  # ids of waiting, running and parked requests
        # audit hook: tap(name, activation [N, ...], layout, request_ids) for every forward (jobs/parity.py)
        self.tap = None
        self.stats = {"steps": 0, "forward_s": 0.0, "tokens_computed": 0, "tokens_generated": 0, "prefix_hit_tokens": 0}

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
        if request_id is None:
            rid = next(self._ids)
            while rid in self._live:  # skip ids the caller passed explicitly
                rid = next(self._ids)
        elif request_id in self._live:
            raise ValueError(f"request id {request_id} is already in use (waiting, running or parked)")
        else:
            rid = request_id
        self._live.add(rid)
        gen = torch.Generator().manual_seed(params.seed if params.seed is not None else rid)
        seq = Sequence(rid, list(prompt_ids), params, gen, self.version, tokens=list(prompt_ids))
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
        del self.parked[request_id]
        seq.params = params
        seq.tokens.extend(new_tokens)
        seq.finish_reason, seq.turn_start = None, len(seq.generated)
        seq.admission_version = self.version
        self.running.append(seq)

    def release(self, request_id: int) -> None:
        """Free a parked sequence's slot and blocks."""
        if request_id not in self.parked:
            raise KeyError(f"request {request_id} is not parked (finished without keep_cache, or unknown)")
        self._free(self.parked.pop(request_id))
        self._live.discard(request_id)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---------------------------------------------------------------------------------------- step
    def step(self) -> list[GenerationOutput]:
        self._admit()
        work = schedule(self._schedulable(), self.max_batched_tokens, self.max_slots)
        if not work:
            if self.running:
                raise RuntimeError("no sequence can make progress: raise num_blocks or max_batched_tokens")
            return []
        for w in work:
            self._ensure_blocks(w.seq, w.seq.num_computed + w.n_tokens)
        ids, cu, start, rows, to_sample = [], [0], [], [], []
        for w in work:
            s = w.seq
            ids.extend(s.tokens[s.num_computed : s.num_computed + w.n_tokens])
            cu.append(cu[-1] + w.n_tokens)
            start.append(s.num_computed)
            if s.num_computed + w.n_tokens == s.num_tokens:
                rows.append(cu[-1] - 1)
                to_sample.append(s)
        view = BatchCacheView(self.storage, [w.seq.slot for w in work], [w.seq.block_table for w in work], self.device)
        tap = None
        if self.tap is not None:
            rids = [w.seq.request_id for w in work]
            tap = lambda name, x, lay: self.tap(name, x, lay, rids)
        t0 = time.perf_counter()
        with torch.no_grad():
            logits = self.model(
                torch.tensor(ids, device=self.device),
                cu,
                start_pos=torch.tensor(start, device=self.device),
                cache=view,
                logits_rows=torch.tensor(rows, device=self.device, dtype=torch.long),
                tap=tap,
            )
            tokens, logprobs = sample(logits, [s.params for s in to_sample], [s.gen for s in to_sample])
        self.stats["forward_s"] += time.perf_counter() - t0
        self.stats["steps"] += 1
        self.stats["tokens_computed"] += len(ids)
        for w in work:
            w.seq.num_computed += w.n_tokens
            self._maybe_cache_prefix(w.seq)
        return self._append_samples(to_sample, tokens.tolist(), logprobs)

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
    @torch.no_grad()
    def update_weights(self, state_dict: dict[str, torch.Tensor], version: int | None = None, policy: str | None = None) -> None:
        """Hot-swap weights between steps. policy 'keep': in-flight sequences continue on their caches (a
        sequence can mix versions, as the published runs); 'recompute': their caches are rebuilt under the
        new weights before they continue. Prefix-cache entries of old weights are dropped either way, and a
        sequence that keeps an old-weight cache never publishes its blocks to the prefix cache again."""
        policy = policy or self.swap_policy
        if policy not in ("keep", "recompute"):
            raise ValueError(f"policy must be 'keep' or 'recompute', got {policy!r}")
        params = dict(self.model.named_parameters())
        missing = set(params) - set(state_dict)
        if missing:
            raise KeyError(f"update_weights: missing tensors {sorted(missing)[:5]}")
        # check everything before copying anything: a failed swap must not leave half-new weights
        bad = sorted(n for n, p in params.items() if tuple(state_dict[n].shape) != tuple(p.shape))
        if bad:
            raise ValueError(f"update_weights: shape mismatch for {bad[:5]}")
        for name, p in params.items():
            p.copy_(state_dict[name].to(p.dtype))
        self.version = self.version + 1 if version is None else version
        if self.prefix is not None:
            self.prefix.clear()
        if policy == "recompute":
            for s in self.running + list(self.parked.values()):
                self.storage.reset_slot(s.slot)
                s.num_computed = 0
                s.stale_cache = False
        else:  # kept caches hold old-weight tokens: they must not re-enter the (just cleared) prefix cache
            for s in self.running + list(self.parked.values()):
                if s.num_computed > 0:
                    s.stale_cache = True

    # --------------------------------------------------------------------------------- internals
    def _admit(self) -> None:
        while self.waiting and self.free_slots:
            seq = self.waiting.popleft()
            seq.slot = self.free_slots.pop()
            self.storage.reset_slot(seq.slot)
            self.running.append(seq)

    def _schedulable(self) -> list[Sequence]:
        """Fresh sequences look up the prefix cache; one of several fresh sequences sharing a first block
        computes it while the others wait a step, then hit the cache."""
        out, inflight = [], set()
        for s in self.running:
            if s.num_computed == 0 and not s.looked_up and self.prefix is not None and s.num_tokens > BLOCK_SIZE:
                blocks, snap = self.prefix.lookup(s.tokens)
                if blocks:
                    for b in blocks:
                        self.alloc.incref(b)
                    for b in s.block_table:  # a parked sequence reset by a 'recompute' swap still holds its blocks
                        self.alloc.decref(b)
                    s.block_table = list(blocks)
                    self.storage.restore(s.slot, snap)
                    s.num_computed = len(blocks) * BLOCK_SIZE
                    self.stats["prefix_hit_tokens"] += s.num_computed
                    s.looked_up = True
                else:
                    h = block_hashes(s.tokens, 1)[0]
                    if h in inflight:
                        continue
                    inflight.add(h)
            out.append(s)
        return out

    def _ensure_blocks(self, s: Sequence, n_tokens: int) -> None:
        need = (n_tokens + BLOCK_SIZE - 1) // BLOCK_SIZE - len(s.block_table)
        if need > 0 and self.prefix is not None:
            self.prefix.evict_for_space(need)
        for _ in range(need):
            s.block_table.append(self.alloc.allocate())

    def _maybe_cache_prefix(self, s: Sequence) -> None:
        if self.prefix is None or s.num_computed % BLOCK_SIZE or s.num_computed == 0:
            return
        s.looked_up = True
        if s.stale_cache:
            return
        self.prefix.insert(s.tokens, s.block_table, s.num_computed // BLOCK_SIZE, lambda: self.storage.snapshot(s.slot))

    def _append_samples(self, seqs: list[Sequence], tokens: list[int], logprobs: torch.Tensor) -> list[GenerationOutput]:
        finished = []
        for i, (s, tok) in enumerate(zip(seqs, tokens)):
            s.tokens.append(tok)
            s.generated.append(tok)
            s.logprobs.append(logprobs[i : i + 1].clone())
            s.versions.append(self.version)
            self.stats["tokens_generated"] += 1
            turn_len = len(s.generated) - s.turn_start
            if tok in s.params.stop_token_ids:
                s.finish_reason = "stop"
            elif turn_len >= s.params.max_new_tokens:
                s.finish_reason = "length"
            if s.finish_reason:
                self.running.remove(s)
                if s.params.keep_cache:
                    self.parked[s.request_id] = s
                else:
                    self._free(s)
                    self._live.discard(s.request_id)
                finished.append(self._output(s))
        return finished

    def _output(self, s: Sequence) -> GenerationOutput:
        lp = torch.cat(s.logprobs[s.turn_start :])
        return GenerationOutput(
            s.request_id,
            s.prompt_ids,
            list(s.generated),
            [float(x) for x in torch.cat(s.logprobs)],
            list(s.versions),
            s.admission_version,
            s.finish_reason,
            list(s.tokens),
            lp,
        )

    def _check_token_ids(self, ids: list[int], what: str) -> None:
        # an out-of-range id would fail inside step() and wedge every request of the batch
        vocab = self.model.config.vocab_size
        if ids and (min(ids) < 0 or max(ids) >= vocab):
            raise ValueError(f"{what} has token ids outside [0, {vocab}): min {min(ids)}, max {max(ids)}")

    def _free(self, s: Sequence) -> None:
        for b in s.block_table:
            self.alloc.decref(b)
        s.block_table = []
        self.free_slots.append(s.slot)
        s.slot = -1

    def throughput(self) -> dict[str, float]:
        f = max(self.stats["forward_s"], 1e-9)
        return {
            "generated_tokens_per_s": self.stats["tokens_generated"] / f,
            "computed_tokens_per_s": self.stats["tokens_computed"] / f,
            **self.stats,
        }
