"""Gated delta rule (GDN). reference.py: plain torch, recurrent and chunked forms; autograd.py: the `bi`
training op (recurrent forward, chunked backward)."""

from .reference import (
    CHUNK,
    chunk_gated_delta_rule,
    chunk_final_states,
    chunk_fwd,
    pad_time,
    to_chunks,
    chunk_fwd_torch,
    prepare_qk,
    recurrent_fwd,
    recurrent_gated_delta_rule,
    recurrent_step,
)

__all__ = [
    "CHUNK",
    "chunk_gated_delta_rule",
    "chunk_final_states",
    "chunk_fwd",
    "pad_time",
    "to_chunks",
    "chunk_fwd_torch",
    "prepare_qk",
    "recurrent_fwd",
    "recurrent_gated_delta_rule",
    "recurrent_step",
]
