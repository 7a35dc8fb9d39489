"""(token, slot) pairs grouped by expert, on the device and without host syncs (CUDA-graph friendly).

Each token's k slots are first put in ascending expert order (a per-row sort), so pair p = t * k + j is the
token's j-th smallest expert: the combine then adds a token's outputs in pair order, which is ascending expert
id. A stable sort of the pairs by expert gives the grouped order (within an expert, ascending token), and
`offsets` (searchsorted on the sorted ids: no bincount, whose CUDA form reads the max back to the host) the
per-expert row ranges. `tiles` cuts every group into BM-row blocks for the grouped kernels; the tile count is
bounded by shapes only (cdiv(N k, BM) + E), so the launch grid never depends on the routing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Routing:
    n: int  # tokens
    k: int  # slots per token
    top_w: torch.Tensor  # [N, k] routing weights, slots in ascending expert order (differentiable)
    pair: torch.Tensor  # [R] int64: grouped row r -> pair index t * k + j
    token: torch.Tensor  # [R] int64: grouped row r -> token t
    expert: torch.Tensor  # [R] int64: grouped row r -> its expert (ascending)
    offsets: torch.Tensor  # [E + 1] int64: expert e's grouped rows are offsets[e] : offsets[e + 1]

    @property
    def rows(self) -> int:
        return self.n * self.k


def route(top_w: torch.Tensor, top_i: torch.Tensor, num_experts: int) -> Routing:
    n, k = top_i.shape
    ids, slot_order = torch.sort(top_i, dim=1, stable=True)
    w = top_w.gather(1, slot_order)
    expert, pair = torch.sort(ids.reshape(-1), stable=True)
    bounds = torch.arange(num_experts + 1, device=top_i.device, dtype=expert.dtype)
    offsets = torch.searchsorted(expert, bounds)
    return Routing(n, k, w, pair, pair // k, expert, offsets)


def max_tiles(rows: int, num_experts: int, bm: int) -> int:
    """An upper bound on sum_e cdiv(count_e, bm) from shapes only."""
    return -(-rows // bm) + min(num_experts, rows)


def tiles(r: Routing, bm: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(tile_expert [T], tile_start [T]) int32 for T = max_tiles: tile j covers grouped rows
    tile_start[j] : min(tile_start[j] + bm, offsets[e + 1]) of expert tile_expert[j]; unused tiles have expert -1."""
    counts = r.offsets[1:] - r.offsets[:-1]
    blocks = (counts + bm - 1) // bm
    ends = torch.cumsum(blocks, 0)  # inclusive
    e_count = counts.shape[0]
    j = torch.arange(max_tiles(r.rows, e_count, bm), device=counts.device)
    e = torch.searchsorted(ends, j, right=True)
    valid = e < e_count
    ec = e.clamp(max=e_count - 1)
    start = r.offsets[ec] + (j - (ends[ec] - blocks[ec])) * bm
    return torch.where(valid, ec, -1).to(torch.int32), torch.where(valid, start, 0).to(torch.int32)


def combine(y_pairs: torch.Tensor, n: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    """y_pairs [N k, H] in pair order -> [N, H]: each token's k rows added in fp32 from 0, in slot (= ascending
    expert) order, rounded once. Elementwise adds: a token's bits depend on its own rows only."""
    yv = y_pairs.view(n, k, -1)
    acc = torch.zeros(n, yv.shape[-1], dtype=torch.float32, device=y_pairs.device)
    for j in range(k):
        acc = acc + yv[:, j].float()
    return acc.to(dtype)
