"""Gumbel-max sampling with a counter-based hash: the noise of vocabulary entry j in row r is a function of
(row key, j) alone, the row key of (request seed, token position) alone, so a row's sample depends only on its
seed, its position and its logits row, never on the batch it shares a step with (batch-invariant), nor on how
often the request was preempted and recomputed (no generator state is consumed).

    key     = splitmix64(splitmix64(seed) ^ position)           (host, per row: two 32-bit words k1, k2)
    h_j     = fmix32(fmix32(j * 0x9E3779B1 + k1) ^ k2)           (murmur3's 32-bit finalizer; uint32 arithmetic)
    u_j     = ((h_j >> 9) + 0.5) / 2^23                          (exact in fp32, in (0, 1))
    token   = argmax_j over kept j of  x_j - log(-log(u_j)),   x = logits / temperature

argmax of the logits plus Gumbel noise draws j with probability softmax(x)_j restricted to the kept set
(top-k / top-p: x_j >= a per-row threshold); temperature 0 is the plain argmax. On CUDA one Triton kernel
(gumbel_triton.py) computes the noise and a per-block argmax; `gumbel_argmax_reference` is the same in torch
(the integers are equal; the float noise may differ by rounding of log).
"""

from __future__ import annotations

import functools

import torch

from .device import on_gpu

MASK32, MASK64 = 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF
GOLDEN32 = 0x9E3779B1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


@functools.lru_cache(maxsize=1 << 16)
def _seed_word(seed: int) -> int:
    """A request's seed mixed once (every token of the request reuses it: a decode step keys every row)."""
    return _splitmix64(seed & MASK64)


def row_key(seed: int, position: int) -> tuple[int, int]:
    """(k1, k2): the two 32-bit words of a row's key."""
    x = _splitmix64(_seed_word(seed) ^ (position & MASK64))
    return x & MASK32, x >> 32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """murmur3's finalizer on uint32 values held in int64 (products wrap: their low 32 bits are kept)."""
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & MASK32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & MASK32
    return h ^ (h >> 16)


def hash_bits(k1: torch.Tensor, k2: torch.Tensor, n_cols: int) -> torch.Tensor:
    """[R] keys (int64 holding uint32) -> [R, n_cols] int64 hash words (the kernel's h_j)."""
    cols = torch.arange(n_cols, device=k1.device, dtype=torch.int64)
    h = (cols[None, :] * GOLDEN32 + k1[:, None]) & MASK32
    return _fmix32(_fmix32(h) ^ k2[:, None])


def gumbel_argmax_reference(logits, temperature, threshold, k1, k2) -> torch.Tensor:
    """The torch form: logits [R, V] fp32, temperature [R] (0 = greedy), threshold [R] on the tempered logits
    (-inf = keep all), k1, k2 [R] int64. Returns tokens [R] int64."""
    greedy = temperature == 0
    x = logits.float() / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
    x = torch.where(greedy[:, None], logits.float(), x)
    u = ((hash_bits(k1, k2, logits.shape[1]) >> 9).float() + 0.5) * 2.0**-23
    score = torch.where(greedy[:, None], x, x - torch.log(-torch.log(u)))
    score = score.masked_fill(x < threshold[:, None], float("-inf"))
    return score.argmax(dim=1)


def gumbel_argmax(logits, temperature, threshold, k1, k2) -> torch.Tensor:
    """Tokens [R] int64; the Triton kernel on CUDA, the torch form elsewhere."""
    if on_gpu(logits):
        from .gumbel_triton import gumbel_argmax as gumbel_argmax_triton  # lazy: CPU machines have no triton

        return gumbel_argmax_triton(logits, temperature, threshold, k1, k2)
    return gumbel_argmax_reference(logits, temperature, threshold, k1, k2)


def nucleus_threshold(x: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """The smallest tempered logit kept by top-k then top-p for one row x [V] (a 0-d tensor; device ops only):
    top-k keeps x >= the k-th largest; top-p the smallest prefix of the sorted renormalised probabilities whose
    mass reaches top_p, the crossing token included (as sampling.filtered_probs; ties at the threshold are
    kept together). One row at a time: each call has the same shapes whatever the batch."""
    srt = torch.sort(x, descending=True).values
    k = top_k if 0 < top_k < x.shape[0] else x.shape[0]
    thr = srt[k - 1]
    if top_p < 1.0:
        p = torch.softmax(torch.where(srt >= thr, srt, float("-inf")), dim=0)
        keep = ((p.cumsum(0) - p) < top_p).sum()
        thr = torch.maximum(thr, srt.gather(0, (keep - 1).clamp(min=0).view(1))[0])
    return thr
