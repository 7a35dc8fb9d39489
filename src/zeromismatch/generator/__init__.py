"""The embedded generator engine (default backend): continuous batching over the one model definition.

Roles, each behind a narrow interface (vLLM v1 style):
- engine.py            Engine: requests (add, continue a parked turn, release), weight hot-swap, and
                       step(): admit -> schedule -> allocate blocks (preempting when they run out) -> execute
                       -> sample -> retire
- scheduler.py         which sequences run this step and how many tokens each (decode first, prefill chunks
                       aligned to block boundaries)
- kv_cache_manager.py  slots, ref-counted KV blocks and the prefix cache: admit / release / preempt, block
                       allocation, prefix lookup (restores GDN snapshots into the slot) and insertion
- model_runner.py      builds one varlen batch from the scheduled work (host metadata, one transfer) and runs
                       the model forward, decode-only steps on CUDA by CUDA-graph replay per batch bucket:
                       execute(work) -> logits of the rows that sample; load_weights(state_dict)
- cache.py             CacheStorage: per-slot fp32 GDN state + paged KV blocks; BatchCacheView hands a batch's
                       slice to the model (models.layout.CacheView)
- prefix_cache.py      block-hash prefix cache: shared KV blocks + GDN state snapshots at 64-token boundaries
- sampling.py          temperature / top-k / top-p with per-request seeds; raw logprobs via ops.logprob; on
                       CUDA batched Gumbel-max keyed by (seed, position) (ops/gumbel.py), on CPU per-row draws
- sequence.py          Sequence (a request inside the engine) and GenerationOutput
- episodes.py          EpisodeRunner: a task's episodes over the engine (model turns; environment turns on a
                       thread pool; turn and context limits) -> rl.types.Sample
"""

from .engine import Engine
from .sampling import SamplingParams
from .sequence import GenerationOutput

__all__ = ["Engine", "GenerationOutput", "SamplingParams"]
