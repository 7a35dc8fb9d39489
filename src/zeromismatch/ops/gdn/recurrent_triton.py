"""Recurrent gated-delta-rule forward in Triton: the `bi` GDN on CUDA for the trainer forward, the generator's
prefill and its decode steps (one kernel, one compiled variant, so all of them agree bit for bit), and `stock`'s
decode steps.

One program per (sequence, value head, value block of BV columns). The fp32 state block [K, BV] lives in
registers for the whole sequence; per token: q, k l2-normalized (rsqrt(sum x^2 + 1e-6)) in fp32, q scaled by
1/sqrt(K), decay exp(g), delta rule, output column block; the next token's inputs are prefetched, and both
state reductions read the decayed state. H200 (results/gpu/README.md): 4.9 ms for 8 x 4096 tokens x 32 heads
(K = V = 128), 0.079 ms for a 64-sequence decode step (1.14x the fp32 state read+write). Packed sequences via
cu_seqlens; the state is read from state[state_indices[b]] and the final state written back to the same place
(in place: the generator passes its [slots, HV, K, V] cache and the batch's slots; the trainer a zero buffer).
Any K and V: the key index runs over K rounded up to a power of two and the value blocks over V rounded up to
BV, masked (loads give 0, stores skipped); a power-of-two K and V have all-true masks, so the same values.

Invariance: a program's arithmetic depends only on its own sequence; every call passes a state (never a
"no initial state" variant), the config (BV, num_warps, num_stages) is a module constant, and no integer that
varies between calls (token counts, strides) is specialized. Splitting a sequence across calls with the fp32
state carried is therefore exact.

Training (recurrent.py) wraps it in ops.autograd.backward_through: the backward differentiates the chunked torch form.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# measured on the H200 (results/gpu/README.md): BV=32 and one warp is the fastest for both the 8 x 4096-token
# prefill and the 64-sequence decode step; one config for every call (bits depend on it)
BV = 32
NUM_WARPS = 1
NUM_STAGES = 2


# The next token's inputs are prefetched during the current one, and o = (S_dec^T q) + (q.k) delta so that
# both state reductions read the decayed state side by side (the reference computes o from the updated state:
# same math, different rounding; 1.45x faster than that order on the H200: results/gpu/README.md).
@triton.jit(do_not_specialize=["stride_q", "stride_k", "stride_v", "stride_g", "stride_b", "stride_o"])
def _gdn_recurrent_kernel(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, o_ptr, state_ptr, idx_ptr, cu_ptr,
                          stride_q, stride_k, stride_v, stride_g, stride_b, stride_o, scale,
                          H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                          KP: tl.constexpr, BLOCK_V: tl.constexpr):
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1)
    i_n = i_nh // HV
    i_hv = i_nh % HV
    i_h = i_hv // (HV // H)
    bos = tl.load(cu_ptr + i_n).to(tl.int64)
    eos = tl.load(cu_ptr + i_n + 1).to(tl.int64)
    slot = tl.load(idx_ptr + i_n).to(tl.int64)
    o_k = tl.arange(0, KP)  # KP = K rounded up to a power of two; the padding holds exact zeros
    o_v = i_v * BLOCK_V + tl.arange(0, BLOCK_V)
    p_s = state_ptr + (slot * HV + i_hv) * (K * V) + o_k[:, None] * V + o_v[None, :]
    m_s = (o_k < K)[:, None] & (o_v < V)[None, :]
    h = tl.load(p_s, mask=m_s, other=0.0)
    live = bos < eos
    q_n = tl.load(q_ptr + bos * stride_q + i_h * K + o_k, mask=live & (o_k < K), other=0.0)
    k_n = tl.load(k_ptr + bos * stride_k + i_h * K + o_k, mask=live & (o_k < K), other=0.0)
    v_n = tl.load(v_ptr + bos * stride_v + i_hv * V + o_v, mask=live & (o_v < V), other=0.0)
    g_n = tl.load(g_ptr + bos * stride_g + i_hv, mask=live, other=0.0)
    b_n = tl.load(b_ptr + bos * stride_b + i_hv, mask=live, other=0.0)
    for t in range(bos, eos):
        q = q_n.to(tl.float32)
        k = k_n.to(tl.float32)
        v = v_n.to(tl.float32)
        g = g_n.to(tl.float32)
        beta = b_n.to(tl.float32)
        nxt = t + 1
        more = nxt < eos
        q_n = tl.load(q_ptr + nxt * stride_q + i_h * K + o_k, mask=more & (o_k < K), other=0.0)
        k_n = tl.load(k_ptr + nxt * stride_k + i_h * K + o_k, mask=more & (o_k < K), other=0.0)
        v_n = tl.load(v_ptr + nxt * stride_v + i_hv * V + o_v, mask=more & (o_v < V), other=0.0)
        g_n = tl.load(g_ptr + nxt * stride_g + i_hv, mask=more, other=0.0)
        b_n = tl.load(b_ptr + nxt * stride_b + i_hv, mask=more, other=0.0)
        q = q * tl.rsqrt(tl.sum(q * q) + 1e-6) * scale
        k = k * tl.rsqrt(tl.sum(k * k) + 1e-6)
        qk = tl.sum(q * k)
        h = h * tl.exp(g)
        kv = tl.sum(h * k[:, None], axis=0)
        hq = tl.sum(h * q[:, None], axis=0)
        delta = (v - kv) * beta
        o = hq + qk * delta
        h = h + k[:, None] * delta[None, :]
        tl.store(o_ptr + t * stride_o + i_hv * V + o_v, o.to(o_ptr.dtype.element_ty), mask=o_v < V)
    tl.store(p_s, h, mask=m_s)


def _check_tok(x: torch.Tensor, inner: int, name: str) -> torch.Tensor:
    """[N, heads, D] with the head/feature dims dense (any token stride)."""
    if x.stride(-1) != 1 or (x.dim() == 3 and x.stride(1) != inner):
        x = x.contiguous()
    return x


def recurrent_fwd_triton(q, k, v, g, beta, cu_seqlens, state, state_indices=None, out=None, out_dtype=torch.float32,
                         block_v: int | None = None, num_warps: int | None = None, num_stages: int | None = None):
    """q, k [N, H, K] raw (not normalized); v [N, HV, V]; g, beta [N, HV] (fp32: log decay, beta);
    cu_seqlens [B+1] int32 on the device; state fp32 [S, HV, K, V] contiguous, updated IN PLACE at rows
    state_indices[b] (default b). Returns o [N, HV, V] (out_dtype). block_v / num_warps / num_stages override
    the module config (timing experiments only: a different config gives different bits)."""
    n_tok, h, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    b = cu_seqlens.numel() - 1
    assert state.dtype == torch.float32 and state.is_contiguous() and state.shape[1:] == (hv, dk, dv), state.shape
    assert hv % h == 0, (h, hv)
    q, k, v = _check_tok(q, dk, "q"), _check_tok(k, dk, "k"), _check_tok(v, dv, "v")
    g, beta = g.float(), beta.float()
    g = g if g.stride(-1) == 1 else g.contiguous()
    beta = beta if beta.stride(-1) == 1 else beta.contiguous()
    if state_indices is None:
        state_indices = torch.arange(b, device=q.device, dtype=torch.int32)
    state_indices = state_indices.to(torch.int32)
    cu_seqlens = cu_seqlens.to(torch.int32)
    if out is None:
        out = torch.empty(n_tok, hv, dv, device=q.device, dtype=out_dtype)
    bv = block_v or min(BV, triton.next_power_of_2(dv))
    if b:
        grid = (triton.cdiv(dv, bv), b * hv)
        _gdn_recurrent_kernel[grid](q, k, v, g, beta, out, state, state_indices, cu_seqlens,
                     q.stride(0), k.stride(0), v.stride(0), g.stride(0), beta.stride(0), out.stride(0),
                     dk ** -0.5, H=h, HV=hv, K=dk, V=dv, KP=triton.next_power_of_2(dk), BLOCK_V=bv,
                     num_warps=num_warps or NUM_WARPS, num_stages=num_stages or NUM_STAGES)
    return out
