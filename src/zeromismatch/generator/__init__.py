"""The embedded generator engine (default backend): continuous batching over the one model definition.

Roles, each behind a narrow interface (vLLM v1 style):
- cache.py         CacheStorage: per-slot fp32 GDN state + paged KV blocks; BatchCacheView hands a batch's
                   slice to the model (models.layout.CacheView)
- prefix_cache.py  block-hash prefix cache: shared KV blocks + GDN state snapshots at 64-token boundaries
- scheduler.py     which sequences run this step and how many tokens each (decode first, prefill chunks
                   aligned to block boundaries)
- sampling.py      temperature / top-k / top-p with per-request seeds; raw logprobs via ops.logprob
- engine.py        the loop: schedule -> one model forward -> sample -> bookkeeping; weight hot-swap
"""

from .engine import Engine, GenerationOutput
from .sampling import SamplingParams

__all__ = ["Engine", "GenerationOutput", "SamplingParams"]
