"""The causal conv as two CUDA kernels (naive.py holds the torch form).

Why: in torch the conv is a concat, W products, W-1 sums, the activation, and the state's gather, slice and
scatter: ~12 kernels per GDN layer, most of a decode step's GDN launches beside its GEMMs. Here one kernel
computes the outputs, reading the carried inputs straight from the cache's slots, and one writes the new state.

Invariance: output (b, t, c) is the same chain of operations on the same values in every call (products and
partial sums rounded to the activation dtype in tap order, as naive.py rounds them; then z / (1 + exp(-z))):
nothing depends on the call's row count, T, the tile or where the previous inputs come from (state or x), so
a decode step gives the bits of the full sequence's row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..triton_math import EXACT, silu

BLOCK_T, BLOCK_C = 16, 128


@triton.jit(do_not_specialize=["T", "C", "sx_b", "sx_t", "ss_n", "ss_w"])
def _conv_kernel(x_ptr, w_ptr, st_ptr, slot_ptr, y_ptr, T, C, sx_b, sx_t, ss_n, ss_w,
                 W: tl.constexpr, HAS_STATE: tl.constexpr, HAS_SLOTS: tl.constexpr, SILU: tl.constexpr,
                 BT: tl.constexpr, BC: tl.constexpr):
    b = tl.program_id(1).to(tl.int64)
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    c = tl.program_id(2) * BC + tl.arange(0, BC)
    tm, cm = t < T, c < C
    ty = y_ptr.dtype.element_ty
    slot = b
    if HAS_SLOTS:
        slot = tl.load(slot_ptr + b).to(tl.int64)
    acc = tl.zeros((BT, BC), dtype=tl.float32)
    for i in tl.static_range(W):
        s = t - (W - 1) + i  # the input this tap reads: x[s], or the carried state's row W-1+s when s < 0
        m = tm[:, None] & cm[None, :]
        xin = tl.load(x_ptr + b * sx_b + s[:, None].to(tl.int64) * sx_t + c[None, :], mask=m & (s >= 0)[:, None],
                      other=0.0).to(tl.float32)
        if HAS_STATE:
            old = tl.load(st_ptr + slot * ss_n + (s + W - 1)[:, None] * ss_w + c[None, :],
                          mask=m & (s < 0)[:, None], other=0.0).to(tl.float32)
            xin = tl.where((s >= 0)[:, None], xin, old)
        w = tl.load(w_ptr + c * W + i, mask=cm, other=0.0).to(tl.float32)
        p = (xin * w[None, :]).to(ty).to(tl.float32)
        if i == 0:
            acc = p
        else:
            acc = (acc + p).to(ty).to(tl.float32)
    if SILU:
        acc = silu(acc)
    tl.store(y_ptr + (b * T + t[:, None]) * C + c[None, :], acc.to(ty), mask=tm[:, None] & cm[None, :])


@triton.jit(do_not_specialize=["T", "C", "sx_b", "sx_t", "ss_n", "ss_w", "so_n", "so_w"])
def _state_kernel(x_ptr, st_ptr, slot_ptr, len_ptr, o_ptr, T, C, sx_b, sx_t, ss_n, ss_w, so_n, so_w,
                  W: tl.constexpr, WP: tl.constexpr, HAS_STATE: tl.constexpr, HAS_SLOTS: tl.constexpr,
                  HAS_LEN: tl.constexpr, OUT_AT_SLOTS: tl.constexpr, BC: tl.constexpr):
    # new state row j = xs[L + j], xs = (old state rows 0..W-2, then x rows 0..T-1), L = the row's length: all
    # W-1 rows are loaded before any is stored, so the old state may be updated in place
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    j = tl.arange(0, WP)
    slot = b
    if HAS_SLOTS:
        slot = tl.load(slot_ptr + b).to(tl.int64)
    n = T
    if HAS_LEN:
        n = tl.load(len_ptr + b).to(tl.int32)
    k = n + j  # index into xs
    m = (j < W - 1)[:, None] & (c < C)[None, :]
    from_x = (k >= W - 1)[:, None]
    v = tl.load(x_ptr + b * sx_b + (k - (W - 1))[:, None].to(tl.int64) * sx_t + c[None, :], mask=m & from_x,
                other=0.0)
    if HAS_STATE:
        old = tl.load(st_ptr + slot * ss_n + k[:, None] * ss_w + c[None, :], mask=m & ~from_x, other=0.0)
        v = tl.where(from_x, v, old.to(v.dtype))
    dst = b
    if OUT_AT_SLOTS:
        dst = slot
    tl.store(o_ptr + dst * so_n + j[:, None] * so_w + c[None, :], v.to(o_ptr.dtype.element_ty), mask=m)


def _dense_c(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def conv(x: torch.Tensor, weight: torch.Tensor, states: torch.Tensor | None, slots: torch.Tensor | None,
         silu: bool) -> torch.Tensor:
    """y [B, T, C] from x [B, T, C] (any row strides) and weight [C, W]; the previous inputs of row b are
    states[slots[b]] (or states[b] without slots; zeros without states)."""
    x = _dense_c(x)
    if states is not None and states.stride(-1) != 1:
        raise ValueError("conv: the states tensor must be dense in its last dim (it may be updated in place)")
    b, t, c = x.shape
    width = weight.shape[-1]
    y = torch.empty(b, t, c, device=x.device, dtype=torch.result_type(x, weight))
    if y.numel():
        st = states if states is not None else x
        grid = (triton.cdiv(t, BLOCK_T), b, triton.cdiv(c, BLOCK_C))
        _conv_kernel[grid](x, weight.contiguous(), st, slots if slots is not None else x, y, t, c,
                           x.stride(0), x.stride(1), st.stride(0), st.stride(1) if states is not None else 0,
                           W=width, HAS_STATE=states is not None, HAS_SLOTS=slots is not None, SILU=silu,
                           BT=BLOCK_T, BC=BLOCK_C, num_warps=4, **EXACT)
    return y


def next_state(x: torch.Tensor, width: int, states: torch.Tensor | None, slots: torch.Tensor | None,
               lengths: torch.Tensor | None, out: torch.Tensor | None) -> torch.Tensor:
    """The last W-1 inputs of each row after its `lengths[b]` (or T) new inputs x [B, T, C] (the previous ones:
    states[slots[b]], states[b] or zeros, as in `conv`): into a new [B, W-1, C] tensor (out None), or into
    out[slots[b]] (out: the states tensor itself, updated in place)."""
    x = _dense_c(x)
    b, t, c = x.shape
    if out is None:
        out = torch.empty(b, width - 1, c, device=x.device, dtype=x.dtype)
    if b and c:
        st = states if states is not None else x
        _state_kernel[(b, triton.cdiv(c, BLOCK_C))](
            x, st, slots if slots is not None else x, lengths if lengths is not None else x, out, t, c,
            x.stride(0), x.stride(1), st.stride(0), st.stride(1) if states is not None else 0,
            out.stride(0), out.stride(1), W=width, WP=triton.next_power_of_2(width - 1),
            HAS_STATE=states is not None, HAS_SLOTS=slots is not None, HAS_LEN=lengths is not None,
            OUT_AT_SLOTS=out is states, BC=BLOCK_C, num_warps=4, **EXACT)
    return out
