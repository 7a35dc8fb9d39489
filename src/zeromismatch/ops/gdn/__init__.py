"""Gated delta rule (GDN), laid out as flash-linear-attention lays out its ops.

- naive.py            plain torch: the recurrent and chunked forms, FLA-style varlen wrappers (the reference)
- chunk.py            backend `chunk` (stock): chunked train / prefill, recurrent decode, plain torch
- recurrent.py        backend `recurrent` (bi): recurrent forward everywhere, chunked backward
- aligned_chunk.py    backend `aligned_chunk` (bi_chunk): chunked everywhere, decode aligned to 64-token chunks
- recurrent_triton.py, chunk_triton.py   the CUDA kernels (imported lazily: CPU machines have no triton)
- autograd.py         chunk_reference: the chunked torch form every mode differentiates (ops/autograd.py
                      backward_through trains the kernels' forwards through it)
- base.py             the backend interface (GDNBackend, GDNHeads, GDNStateView)
- constants.py        CHUNK, the chunked kernels' arithmetics (CHUNK_DOTS)

Each backend answers `cache_spec` (the per-slot state the generator allocates), `train` and `cached`; numerics
picks one per mode, and the model calls it.
"""

from .aligned_chunk import AlignedChunkGDN
from .base import GDNBackend, GDNHeads, GDNStateView, StateSpec
from .chunk import ChunkGDN
from .constants import CHUNK, CHUNK_DOTS, DEFAULT_CHUNK_DOTS
from .recurrent import RecurrentGDN

# backend class by GDN form name
BACKENDS: dict[str, type[GDNBackend]] = {cls.name: cls for cls in (ChunkGDN, RecurrentGDN, AlignedChunkGDN)}

__all__ = [
    "BACKENDS",
    "CHUNK",
    "CHUNK_DOTS",
    "DEFAULT_CHUNK_DOTS",
    "AlignedChunkGDN",
    "ChunkGDN",
    "GDNBackend",
    "GDNHeads",
    "GDNStateView",
    "RecurrentGDN",
    "StateSpec",
]
