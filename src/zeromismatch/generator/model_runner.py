"""Model runner: one forward of the model over a step's scheduled work.

Eager (every step on CPU; prefill and mixed steps on CUDA): the work's pieces are packed into one varlen batch;
token ids, slots, block tables, the rows that sample and the whole SeqLayout are built on the host and moved
in one transfer, so the forward reads nothing back.

CUDA graphs (decode rows on CUDA, cuda_graphs=True): the decode forward is captured once per (batch bucket,
block-table width) and replayed; in a step that also has prefill pieces, the decode rows replay and the pieces
run eagerly beside them. A step of B sequences runs in the smallest bucket >= B; the padding
rows read and write the storage's spare slot and spare block only, with token 0 at position 0. Batch invariance
(bi, bi_chunk) makes the padding change no real row's bits (tests/gpu/test_gpu_generator.py asserts it): every
op's per-row arithmetic is fixed by the row alone, the attention reads `width` blocks of keys, masks the ones
past each query and its softmax ignores whole -inf key blocks (ops/attention). The step's ids, positions, slots
and block tables are copied into the graph's static buffer in one transfer; the logits stay in the graph's
output buffer until the next replay. Models with routed experts run eagerly (ops/moe has no host sync, but
a captured MoE step is not yet verified on a GPU). On a CPU device the same bucketed path runs over the same static buffers without
capture (tests/generator check the padding there, and under Triton's interpreter the CUDA ops' forms).

Staged steps: while the GPU runs a decode step, the engine can queue the next one's inputs behind it
(`stage_decode`: positions, slots and tables from the host, token ids copied on the device from the samples not yet
read back), so that once the host has read the samples the next replay starts with nothing left to prepare.

The Engine sees `execute(work) -> logits`, `stage_decode` / `replay_staged` and `load_weights(state_dict)`.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import torch

from ..ops.varlen import SeqLayout
from .cache import BLOCK_SIZE, BatchCacheView, CacheStorage
from .scheduler import Work

# 1 .. 8192, then max_slots; a graph is captured on first use, or all of them at once by capture_all
GRAPH_BATCH_BUCKETS = tuple(2**i for i in range(14))


def bucket_of(n: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket >= n (buckets ascending; n <= the last)."""
    return next(b for b in buckets if b >= n)


@contextmanager
def _no_collection():
    """Python's cycle collector off for the duration of a capture. An unreachable CUDA graph (an old engine's,
    in any reference cycle of the process) that the collector frees mid-capture destroys its graph there, which
    the capturing stream does not permit: the capture fails at its next launch ("operation failed due to a
    previous error during capture"). Collection resumes afterwards; nothing is lost."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass
class _DecodeGraph:
    meta: torch.Tensor  # int64 [3B + B*W]: ids | start positions | slots | block tables (row-major)
    forward: Callable[[], torch.Tensor]  # the decode forward over `meta`
    graph: torch.cuda.CUDAGraph | None  # None off CUDA: `replay` runs `forward` eagerly
    logits: torch.Tensor | None  # [B, V] fp32, written by every replay

    def replay(self) -> None:
        if self.graph is None:
            with torch.no_grad():
                self.logits = self.forward()
        else:
            self.graph.replay()


@dataclass
class StagedDecode:
    """A decode step whose inputs are already on the device (ModelRunner.stage_decode)."""

    seqs: list  # the sequences of its rows, in order
    graph: _DecodeGraph


class ModelRunner:
    def __init__(self, model, storage: CacheStorage, device, cuda_graphs: bool = False, max_blocks_per_seq: int = 64):
        self.model, self.storage, self.device = model, storage, device
        self.cuda_graphs = cuda_graphs
        if cuda_graphs:
            assert storage.spare, "CUDA graphs need the storage's spare slot and block (CacheStorage(spare=True))"
        slots = storage.max_slots
        self.batch_buckets = tuple(b for b in GRAPH_BATCH_BUCKETS if b < slots) + (slots,)
        width, self.width_buckets = 1, []
        while width < max_blocks_per_seq:
            self.width_buckets.append(width)
            width *= 2
        self.width_buckets = tuple(self.width_buckets) + (max_blocks_per_seq,)
        self.graphs: dict[tuple[int, int], _DecodeGraph] = {}
        self.pool = None
        # mixed: graph and eager rows in one step; staged: graph steps whose inputs were queued a step ahead
        self.stats = {"graph_steps": 0, "eager_steps": 0, "mixed_steps": 0, "captures": 0, "staged_steps": 0}

    def execute(self, work: list[Work], tap=None) -> torch.Tensor:
        """fp32 logits [R, V], one row per piece that samples (Work.samples), in work order.
        tap(name, activation [N, ...], layout, request_ids): the audit hook, called by every tapped op."""
        if not self.cuda_graphs or tap is not None:
            return self._eager(work, tap)
        # decode rows: one token that samples. A one-token piece can also be a prefill piece cut at a block
        # boundary (a tool turn appended to a context that ended one token short of it), which samples
        # nothing: a graph returns a logit row for every row, so such a piece runs eagerly.
        decode = [w for w in work if w.n_tokens == 1 and w.samples]
        if len(decode) == len(work):
            return self._replay(work)
        if not decode:
            return self._eager(work, tap)
        # a mixed step: the decode rows replay their graph and the prefill pieces run eagerly over their own
        # rows, instead of every row eagerly (multi-turn tasks append tool output all the time, so nearly every
        # step has a piece). A row's bits do not depend on the rows beside it in bi / bi_chunk. The engine
        # samples in work order, and the scheduler puts the decode rows first: the pieces are the rest.
        if [id(w) for w in work[: len(decode)]] != [id(w) for w in decode]:
            raise RuntimeError("a step's decode rows must come before its prefill pieces (scheduler.schedule)")
        self.stats["mixed_steps"] += 1
        return torch.cat([self._replay(decode), self._eager(work[len(decode):], tap)])

    # ------------------------------------------------------------------------------------------ eager
    def _eager(self, work: list[Work], tap) -> torch.Tensor:
        self.stats["eager_steps"] += 1
        ids, cu, start, rows = [], [0], [], []
        for w in work:
            s = w.seq
            ids.extend(s.tokens[s.num_computed : s.num_computed + w.n_tokens])
            cu.append(cu[-1] + w.n_tokens)
            start.append(s.num_computed)
            if w.samples:
                rows.append(cu[-1] - 1)
        b, width = len(work), max(1, max(len(w.seq.block_table) for w in work))
        tables = [t + [0] * (width - len(t)) for t in (w.seq.block_table for w in work)]
        payload = torch.tensor(ids + [w.seq.slot for w in work] + rows + [x for t in tables for x in t])
        layout = SeqLayout.build(cu, start, self.device, payload=payload)
        d_ids, d_slots, d_rows, d_tables = torch.split(layout.payload, [len(ids), b, len(rows), b * width])
        view = BatchCacheView(self.storage, d_slots, d_tables.view(b, width))
        model_tap = None
        if tap is not None:
            rids = [w.seq.request_id for w in work]
            model_tap = lambda name, x, lay: tap(name, x, lay, rids)
        with torch.no_grad():
            return self.model(d_ids, cache=view, logits_rows=d_rows, tap=model_tap, layout=layout)

    # ----------------------------------------------------------------------------------- CUDA graphs
    def _replay(self, work: list[Work]) -> torch.Tensor:
        seqs = [w.seq for w in work]
        g = self._load_decode_inputs(seqs, [s.num_computed for s in seqs], [s.tokens[s.num_computed] for s in seqs])
        return self._run_graph(g, len(seqs))

    def stage_decode(self, seqs: list, ids: torch.Tensor) -> StagedDecode:
        """Queue the inputs of the next step on the device behind the current one, before the host has read this
        step's samples: each of `seqs` decodes one token further, its id taken from `ids` (this step's sampled
        tokens, on the device). The caller allocated the blocks those tokens write. The graph reads its inputs
        only when replayed, in stream order, so a staged step that is not run changes nothing."""
        g = self._load_decode_inputs(seqs, [s.num_computed + 1 for s in seqs], None)
        g.meta[: len(seqs)].copy_(ids, non_blocking=True)
        return StagedDecode(list(seqs), g)

    def replay_staged(self, staged: StagedDecode) -> torch.Tensor:
        """fp32 logits [B, V] of a staged step (its sequences' decode rows, in their order)."""
        self.stats["staged_steps"] += 1
        return self._run_graph(staged.graph, len(staged.seqs))

    def _load_decode_inputs(self, seqs: list, positions: list[int], ids: list[int] | None) -> _DecodeGraph:
        """The graph of the step's bucket (captured on first use) with the rows' ids (None: zeros, for the caller
        to fill on the device), positions, slots and block tables copied into its static buffer in one transfer."""
        b = len(seqs)
        bb = bucket_of(b, self.batch_buckets)
        need = max((p + 1 + BLOCK_SIZE - 1) // BLOCK_SIZE for p in positions)
        width = bucket_of(need, self.width_buckets)
        g = self.graphs.get((bb, width)) or self._capture(bb, width)
        spare_slot, spare_block = self.storage.max_slots, self.storage.num_blocks
        pad = bb - b
        tables = []
        for s in seqs:
            t = s.block_table[:width]
            tables.extend(t + [spare_block] * (width - len(t)))
        host = torch.tensor(
            (ids if ids is not None else [0] * b) + [0] * pad
            + positions + [0] * pad
            + [s.slot for s in seqs] + [spare_slot] * pad
            + tables + [spare_block] * (pad * width))
        g.meta.copy_(host, non_blocking=True)
        return g

    def _run_graph(self, g: _DecodeGraph, b: int) -> torch.Tensor:
        with torch.no_grad():
            self.model.refresh_lm_head_copy()  # in place: the fp32 cast a graph may read, if the weights moved
        g.replay()
        self.stats["graph_steps"] += 1
        return g.logits[:b]

    def capture_all(self) -> int:
        """Capture every (batch bucket, width) graph now; returns how many were new. An RL run calls it before its
        threads start: a capture while another thread of the process runs CUDA work (the trainer, an evaluation)
        failed on the H200 ("Cannot register the state during capturing stage", illegal memory accesses)."""
        todo = [(bb, w) for bb in self.batch_buckets for w in self.width_buckets if (bb, w) not in self.graphs]
        for bb, w in todo:
            self._capture(bb, w)
        return len(todo)

    def _capture(self, bb: int, width: int) -> _DecodeGraph:
        """Capture the decode forward of `bb` rows over `width` blocks of keys. The warm-up and the capture see
        only padding rows (spare slot and block), so no real sequence's cache is touched."""
        meta = torch.zeros(3 * bb + bb * width, dtype=torch.long, device=self.device)
        meta[2 * bb : 3 * bb] = self.storage.max_slots
        meta[3 * bb :] = self.storage.num_blocks
        ids, start, slots, tables = torch.split(meta, [bb, bb, bb, bb * width])
        layout = SeqLayout.decode(start, max_ctx=width * BLOCK_SIZE)
        view = BatchCacheView(self.storage, slots, tables.view(bb, width))
        model = self.model  # not `self`: a graph that referred back to its runner would be freed only by the
        # cycle collector, at whatever moment it runs (see _no_collection)

        def forward():
            return model(ids, cache=view, layout=layout)

        if self.device.type != "cuda":  # the same static buffers and padding, run without capture (CPU checks)
            self.graphs[(bb, width)] = g = _DecodeGraph(meta, forward, None, None)
            return g
        with torch.no_grad():
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):  # compiles every kernel and fills lazily built tables first
                forward()
                forward()
            torch.cuda.current_stream(self.device).wait_stream(side)
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            # thread_local: a trainer thread of the same process may use the GPU meanwhile (threaded RL)
            with _no_collection(), torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                logits = forward()
        self.graphs[(bb, width)] = g = _DecodeGraph(meta, forward, graph, logits)
        self.stats["captures"] += 1
        return g

    @torch.no_grad()
    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Copy every parameter from state_dict; checks names and shapes before copying anything, so a failed
        load never leaves half-new weights. In place: the captured graphs read the same tensors."""
        params = dict(self.model.named_parameters())
        missing = set(params) - set(state_dict)
        if missing:
            raise KeyError(f"update_weights: missing tensors {sorted(missing)[:5]}")
        bad = sorted(n for n, p in params.items() if tuple(state_dict[n].shape) != tuple(p.shape))
        if bad:
            raise ValueError(f"update_weights: shape mismatch for {bad[:5]}")
        for name, p in params.items():
            p.copy_(state_dict[name].to(p.dtype))
