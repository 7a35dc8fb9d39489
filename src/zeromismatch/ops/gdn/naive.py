"""Gated delta rule in plain torch, fp32 state: the reference every backend and kernel is checked against, and
the CPU forms the backends run. No Triton here. The math (per value head, state S is K x V):

    S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T,      o_t = S_t^T q_t

with q, k l2-normalized and q scaled by 1/sqrt(K). Two forms compute it:

- recurrent: one token at a time (`recurrent_step`). On CPU the generator's decode step and the `bi`
  trainer forward call the very same step function, so they agree bit for bit.
- chunked (chunk C = 64): inside a chunk, with G = cumsum(g), A[t,i] = beta_t exp(G_t - G_i) k_t.k_i (i < t),
  T = (I + A)^-1, U = T (beta V) - T (beta exp(G) K) S_0 ; O = exp(G) Q S_0 + (exp(G_t - G_i) q_t.k_i)_{i<=t} U;
  S_C = exp(G_C) S_0 + (exp(G_C - G) K)^T U. Row t of a chunk only reads rows <= t (masked entries are
  exact zeros), and every matmul has the fixed per-chunk shape, so a chunk computed with rows > t missing
  (zero-padded) gives the same row t: the basis of `bi_chunk` decoding.

Internal layout: [B, HV, T, D] fp32, q/k already normalized and expanded to the value heads (`prepare_qk`).
The varlen wrappers take FLA's layout [B, T, H, D] with optional packed sequences (cu_seqlens).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..varlen import padded_index, to_padded
from ..fused.naive import qk_l2norm as prepare_qk  # noqa: F401 (the torch form, shared with ops/fused)
from .constants import CHUNK


# ----------------------------------------------------------------------------------------------- recurrent


def recurrent_step(state, q, k, v, g, beta):
    """One token for a batch of (sequence, head) rows. state [B, HV, K, V]; q, k [B, HV, K]; v [B, HV, V];
    g, beta [B, HV]. Returns (o [B, HV, V], new state). Per-row matmuls of fixed shape ([1, K] @ [K, V]) and
    elementwise ops: a row's result never depends on the other rows or the thread count (tests/ops/test_gdn.py,
    tests/parity/test_sweep.py); the matmul form is ~3x faster than multiply-and-sum on our CPU. The rank-1
    update is a separate multiply and add: torch's baddbmm computes it differently for a batch of one matrix
    (one sequence with one value head) than for several."""
    state = state * torch.exp(g)[..., None, None]
    kv_mem = (k[..., None, :] @ state).squeeze(-2)
    delta = (v - kv_mem) * beta[..., None]
    state = state + k[..., :, None] * delta[..., None, :]
    return (q[..., None, :] @ state).squeeze(-2), state


def recurrent_fwd(q, k, v, g, beta, state, lengths=None):
    """q, k [B, HV, T, K]; v [B, HV, T, V]; g, beta [B, HV, T]; state [B, HV, K, V] fp32 (required: a zero
    state at a sequence start, so every call takes the same path). lengths [B]: rows stop updating after
    their last valid token (right padding). Returns (o [B, HV, T, V], final state)."""
    t_max = q.shape[2]
    short = None if lengths is None else int(lengths.min())
    outs = []
    for t in range(t_max):
        o, new_state = recurrent_step(state, q[:, :, t], k[:, :, t], v[:, :, t], g[:, :, t], beta[:, :, t])
        if short is not None and t >= short:  # some rows already ended: keep their state
            live = (lengths > t).view(-1, 1, 1, 1)
            new_state = torch.where(live, new_state, state)
        state = new_state
        outs.append(o)
    o = torch.stack(outs, dim=2) if outs else v.new_zeros(v.shape)
    return o, state


# ------------------------------------------------------------------------------------------------- chunked


def pad_time(x: torch.Tensor, t_pad: int) -> torch.Tensor:
    """Zero-pad the time axis (dim 2) of a kernel-layout tensor [B, HV, T, ...] to t_pad: zero rows are inert."""
    pad = t_pad - x.shape[2]
    if pad == 0:
        return x
    return F.pad(x, (0, 0, 0, pad)) if x.dim() == 4 else F.pad(x, (0, pad))


def to_chunks(*xs: torch.Tensor) -> list[torch.Tensor]:
    """pad_time to the next multiple of CHUNK, for every tensor of one call."""
    t = xs[0].shape[2]
    return [pad_time(x, t + (-t) % CHUNK) for x in xs]


def chunk_prep(q, k, v, g, beta):
    """The chunk-parallel part of the chunked form (no state dependency). Inputs as `chunk_fwd`. Returns, per
    chunk c (leading dims [B, HV, n]): u0 [C, V], w [C, K], qk [C, C] (causal, decayed), qd = exp(G) q [C, K],
    kd = exp(G_C - G) k [C, K] and gl = exp(G_C) [] -- what the scan over chunks reads."""
    b, h, t, dk = q.shape
    dv = v.shape[-1]
    assert t % CHUNK == 0, f"chunk_fwd needs T % {CHUNK} == 0, got {t}"
    n = t // CHUNK
    q, k = q.view(b, h, n, CHUNK, dk), k.view(b, h, n, CHUNK, dk)
    v = v.view(b, h, n, CHUNK, dv)
    g, beta = g.view(b, h, n, CHUNK), beta.view(b, h, n, CHUNK)

    G = g.cumsum(-1)  # [b, h, n, C] log decay from the chunk start
    ones = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device)
    strict = ones.tril(-1)
    causal = ones.tril(0)
    diff = G[..., :, None] - G[..., None, :]  # G_t - G_i
    decay_causal = torch.exp(diff.masked_fill(~causal, float("-inf")))  # 0 above the diagonal

    kb = k * beta[..., None]
    A = (kb @ k.transpose(-1, -2)) * decay_causal
    A = A.masked_fill(~strict, 0.0)
    eye = torch.eye(CHUNK, dtype=q.dtype, device=q.device)
    # T = (I + A)^-1 applied by a unit-lower-triangular solve (row t only reads rows <= t)
    u0 = torch.linalg.solve_triangular(eye + A, v * beta[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(eye + A, kb * torch.exp(G)[..., None], upper=False, unitriangular=True)
    qk = (q @ k.transpose(-1, -2)) * decay_causal
    qd = q * torch.exp(G)[..., None]
    kd = k * torch.exp(G[..., -1:] - G)[..., None]
    gl = torch.exp(G[..., -1])
    return u0, w, qk, qd, kd, gl


def chunk_scan(u0, w, qk, qd, kd, gl, state):
    """The sequential part: per chunk, u = u0 - w S, o = qd S + qk u, S' = gl S + kd^T u, from state [B, HV, K, V].
    Returns (o [B, HV, n * C, V], states [B, HV, n + 1, K, V])."""
    b, h, n = gl.shape
    outs, states = [], [state]
    for c in range(n):
        u = u0[:, :, c] - w[:, :, c] @ state
        outs.append(qd[:, :, c] @ state + qk[:, :, c] @ u)
        state = state * gl[:, :, c, None, None] + kd[:, :, c].transpose(-1, -2) @ u
        states.append(state)
    o = torch.stack(outs, dim=2) if outs else u0
    return o.reshape(b, h, n * CHUNK, u0.shape[-1]), torch.stack(states, dim=2)


def chunk_fwd(q, k, v, g, beta, state, scan=chunk_scan):
    """Chunked form over whole chunks. q, k [B, HV, T, K]; v [B, HV, T, V]; g, beta [B, HV, T] with T a
    multiple of CHUNK (callers zero-pad: zero rows are inert); state [B, HV, K, V] fp32.
    Returns (o [B, HV, T, V], states [B, HV, n_chunks + 1, K, V]: the state at every chunk boundary).
    scan: the sequential part (`chunk_scan`, or the trainer's CUDA kernel with the same contract)."""
    return scan(*chunk_prep(q, k, v, g, beta), state)


def chunk_output(q, k, v, g, beta, state, scan=chunk_scan):
    """The chunked form's output for any T (zero-padded to whole chunks, cut back): o [B, HV, T, V]."""
    return chunk_fwd(*to_chunks(q, k, v, g, beta), state, scan=scan)[0][:, :, : q.shape[2]]


def chunk_final_states(q, k, v, g, beta, states, lengths):
    """State after each row's last valid token: the boundary state of its last full chunk, advanced over the
    leftover tokens with the chunked form on that chunk, its rows past the length zeroed (zero rows leave the
    state unchanged). One batched call over every row's chunk (on CPU bitwise the per-row form it replaced:
    tests/generator/test_device_sampling.py); rows that end on a boundary keep the boundary state. No device
    value is read."""
    b, t = q.shape[0], q.shape[2]
    n_chunks = t // CHUNK
    ar = torch.arange(b, device=q.device)
    full = lengths.to(q.device) // CHUNK
    boundary = states[ar, :, full]  # [B, HV, K, V]
    if n_chunks == 0:
        return boundary
    c = full.clamp(max=n_chunks - 1)  # rows ending on the last boundary read any chunk: their result is unused
    live = torch.arange(CHUNK, device=q.device)[None, :] < (lengths.to(q.device) % CHUNK)[:, None]  # [B, C]

    def chunk_of(x):
        x = x.unflatten(2, (n_chunks, CHUNK))[ar, :, c]  # [B, HV, C, ...]
        m = live[:, None, :, None] if x.dim() == 4 else live[:, None, :]
        return torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))

    _, st = chunk_fwd(*(chunk_of(x) for x in (q, k, v, g, beta)), boundary)
    ends_inside = (lengths.to(q.device) % CHUNK != 0).view(b, 1, 1, 1)
    return torch.where(ends_inside, st[:, :, 1], boundary)


# ------------------------------------------------------------------------------------ FLA-style varlen wrappers


def _prep(q, k, v, g, beta, cu_seqlens, multiple):
    """FLA layout [B, T, ...] (B == 1 when packed) -> the internal layout, right-padded to `multiple` tokens."""
    num_v_heads = v.shape[2]
    if cu_seqlens is None:
        pad = (-q.shape[1]) % multiple
        xs = [F.pad(x, (0, 0) * (x.dim() - 2) + (0, pad)) if pad else x for x in (q, k, v, g, beta)]
        lengths = valid = None
    else:
        cu = [int(c) for c in cu_seqlens.tolist()]
        index, valid = padded_index(cu, q.device, multiple)
        xs = [to_padded(x[0], index) for x in (q, k, v, g, beta)]
        lengths = torch.tensor([cu[i + 1] - cu[i] for i in range(len(cu) - 1)], device=q.device)
    q, k = prepare_qk(xs[0], xs[1], num_v_heads)
    v, g, beta = (x.float().transpose(1, 2).contiguous() for x in xs[2:])
    return q, k, v, g, beta, lengths, valid


def _repack(o: torch.Tensor, valid: torch.Tensor | None, t: int) -> torch.Tensor:
    """Internal-layout output [B, HV, T_pad, V] -> FLA layout [B, T, HV, V] (packed: [1, N, HV, V])."""
    o = o.transpose(1, 2)
    return o[:, :t] if valid is None else o[valid].unsqueeze(0)


def _initial(initial_state, b, h, dk, dv, like):
    if initial_state is None:
        return like.new_zeros(b, h, dk, dv, dtype=torch.float32)
    return initial_state.float()


def recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=None, cu_seqlens=None):
    """FLA-style API. q, k [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV]; with cu_seqlens, B == 1 and the
    sequences are packed. initial_state [n_seq, HV, K, V]. Returns (o like v in fp32, final_state fp32)."""
    t = q.shape[1]
    q, k, v, g, beta, lengths, valid = _prep(q, k, v, g, beta, cu_seqlens, 1)
    state = _initial(initial_state, q.shape[0], q.shape[1], q.shape[-1], v.shape[-1], v)
    o, state = recurrent_fwd(q, k, v, g, beta, state, lengths)
    return _repack(o, valid, t), state


def chunk_gated_delta_rule(q, k, v, g, beta, initial_state=None, cu_seqlens=None):
    """Same API as `recurrent_gated_delta_rule`, chunked form (chunks aligned to each sequence start)."""
    t = q.shape[1]
    q, k, v, g, beta, lengths, valid = _prep(q, k, v, g, beta, cu_seqlens, CHUNK)
    state = _initial(initial_state, q.shape[0], q.shape[1], q.shape[-1], v.shape[-1], v)
    o, states = chunk_fwd(q, k, v, g, beta, state)
    if lengths is None:
        lengths = torch.full((q.shape[0],), t, device=q.device)
    final = chunk_final_states(q, k, v, g, beta, states, lengths)
    return _repack(o, valid, t), final
