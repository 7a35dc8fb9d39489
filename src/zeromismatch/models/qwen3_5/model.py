"""The Qwen3.5 hybrid (Gated DeltaNet + gated full attention + dense or MoE MLP), written once and run by
both the trainer (packed sequences, no cache) and the generator (prefill / decode against its cache).

Parameter names and shapes follow the published checkpoints (transformers' Qwen3_5ForCausalLM /
Qwen3_5MoeForCausalLM), so `checkpoint.py` maps files onto this module one to one.

Numerics (which linear, activations, attention and GDN form) come from `numerics.get_numerics`; the model
never branches on trainer vs generator except where a mode prescribes it (stock decodes GDN recurrently).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from ...kernels import mean_sq_last, on_gpu, sum_last
from ...numerics import Numerics, get_numerics
from ...ops.conv import causal_conv
from ...ops.gdn import CHUNK, chunk_final_states, chunk_fwd, chunk_fwd_torch, prepare_qk, recurrent_fwd, to_chunks
from ...ops.gdn.autograd import gdn_recurrent_train
from ..layout import ForwardContext, SeqLayout
from .config import Qwen35Config


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm: normalize in fp32, scale by (1 + w)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        # mean_sq_last: xf.pow(2).mean(-1, keepdim=True) on CPU, a row-count-invariant reduction on CUDA
        y = xf * torch.rsqrt(mean_sq_last(xf) + self.eps)
        return (y * (1.0 + self.weight.float())).to(x.dtype)


class GatedRMSNorm(nn.Module):
    """GDN output norm: normalize in fp32, cast, times weight (init ones), times silu(z)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor, silu) -> torch.Tensor:
        xf = x.float()
        y = (xf * torch.rsqrt(mean_sq_last(xf) + self.eps)).to(x.dtype)
        return (self.weight * y * silu(z.float())).to(x.dtype)


class Linear(nn.Linear):
    """nn.Linear without bias whose matmul is chosen by the numerics mode."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__(d_in, d_out, bias=False)

    def forward(self, x: torch.Tensor, nx: Numerics) -> torch.Tensor:  # type: ignore[override]
        return nx.linear(x, self.weight)


# ------------------------------------------------------------------------------------------- GDN


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: Qwen35Config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.h, self.hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.key_dim, self.value_dim = self.h * self.dk, self.hv * self.dv
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.in_proj_qkv = Linear(cfg.hidden_size, self.conv_dim)
        self.in_proj_z = Linear(cfg.hidden_size, self.value_dim)
        self.in_proj_b = Linear(cfg.hidden_size, self.hv)
        self.in_proj_a = Linear(cfg.hidden_size, self.hv)
        # stored as nn.Conv1d's weight [C, 1, W] (checkpoint layout); used by ops.conv
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, cfg.linear_conv_kernel_dim, groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.A_log = nn.Parameter(torch.log(torch.empty(self.hv).uniform_(0.01, 16)))
        self.norm = GatedRMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = Linear(self.value_dim, cfg.hidden_size)

    def forward(self, x: torch.Tensor, ctx: ForwardContext, nx: Numerics) -> torch.Tensor:
        lay, name = ctx.layout, f"layers.{self.layer_idx}.gdn"
        qkv = self.in_proj_qkv(x, nx)
        z = self.in_proj_z(x, nx)
        beta = nx.sigmoid(self.in_proj_b(x, nx).float())
        g = -torch.exp(self.A_log.float()) * nx.softplus(self.in_proj_a(x, nx).float() + self.dt_bias.float())
        ctx.record(f"{name}.in_proj", qkv)

        cache = ctx.cache.gdn_state(self.layer_idx) if ctx.cache is not None else None
        conv_w = self.conv1d.weight.squeeze(1)
        y, conv_state = causal_conv(
            lay.to_padded(qkv), conv_w, None if cache is None else cache["conv"], nx.silu, lay.lengths
        )
        mixed = lay.to_packed(y)
        ctx.record(f"{name}.conv", mixed)

        o, new_state = self._core(mixed, g, beta, lay, nx, cache, ctx.cache)
        if cache is not None:
            ctx.cache.set_gdn_state(self.layer_idx, {"conv": conv_state, **new_state})
        ctx.record(f"{name}.core", o)

        n = x.shape[0]
        o = self.norm(o.reshape(n * self.hv, self.dv).to(x.dtype), z.reshape(n * self.hv, self.dv), nx.silu)
        return self.out_proj(o.reshape(n, self.value_dim), nx)

    def _split(self, mixed: torch.Tensor):
        """[..., C] -> q, k [..., H, K], v [..., HV, V]."""
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        lead = mixed.shape[:-1]
        return q.reshape(*lead, self.h, self.dk), k.reshape(*lead, self.h, self.dk), v.reshape(*lead, self.hv, self.dv)

    def _prep(self, mixed_p, g_p, beta_p):
        """Padded [B, L, C], [B, L, HV] -> kernel layout [B, HV, L, D] fp32."""
        q, k, v = self._split(mixed_p)
        q, k = prepare_qk(q, k, self.hv)
        v, g, beta = (t.float().transpose(1, 2).contiguous() for t in (v, g_p, beta_p))
        return q, k, v, g, beta

    def _core(self, mixed, g, beta, lay: SeqLayout, nx: Numerics, cache, cache_view=None):
        """GDN over the new tokens. Returns (o [N, HV, V] fp32, cache entries to store)."""
        b = lay.num_seqs
        if cache is None and nx.gdn_form == "recurrent" and on_gpu(mixed):
            # bi on the GPU: the Triton recurrent kernel on packed raw q/k/v (chunked backward)
            from ...kernels.gdn_recurrent import gdn_recurrent

            return gdn_recurrent(*self._split(mixed), g, beta, lay.cu_seqlens), {}
        if cache is None:  # trainer / cache-free scoring: every sequence starts at position 0
            q, k, v, gg, bb = self._prep(lay.to_padded(mixed), lay.to_padded(g), lay.to_padded(beta))
            state = q.new_zeros(b, self.hv, self.dk, self.dv)
            if nx.gdn_form == "recurrent":
                o = gdn_recurrent_train(q, k, v, gg, bb, state) if torch.is_grad_enabled() else recurrent_fwd(q, k, v, gg, bb, state)[0]
            else:
                # stock: plain torch (cuBLAS on the GPU); bi_chunk: the batch-invariant chunked kernels
                chunked = chunk_fwd if nx.invariant else chunk_fwd_torch
                o = chunked(*to_chunks(q, k, v, gg, bb), state)[0][:, :, : q.shape[2]]
            return lay.to_packed(o.transpose(1, 2)), {}
        if nx.gdn_form == "aligned_chunk":
            if on_gpu(mixed) and cache_view is not None and hasattr(cache_view, "gdn_inplace"):
                return self._aligned_chunk_gpu(mixed, g, beta, lay, cache_view)
            return self._aligned_chunk(mixed, g, beta, lay, cache)
        if nx.gdn_form == "recurrent":
            return self._recurrent_cached(mixed, g, beta, lay, cache["ssm"], cache_view)
        # stock: recurrent step for decode rows, chunked prefill (from the carried state) for the others
        decode = lay.lengths == 1
        if bool(decode.all()):
            return self._recurrent_cached(mixed, g, beta, lay, cache["ssm"], cache_view)
        q, k, v, gg, bb = self._prep(lay.to_padded(mixed), lay.to_padded(g), lay.to_padded(beta))
        t = q.shape[2]
        padded = to_chunks(q, k, v, gg, bb)
        o, states = chunk_fwd_torch(*padded, cache["ssm"].float())
        o, ssm = o[:, :, :t], chunk_final_states(*padded, states, lay.lengths, fwd=chunk_fwd_torch)
        if bool(decode.any()):
            o_r, s_r = recurrent_fwd(*(x[decode] for x in (q, k, v, gg, bb)), cache["ssm"][decode].float())
            o[decode], ssm[decode] = o_r, s_r
        return lay.to_packed(o.transpose(1, 2)), {"ssm": ssm}

    def _recurrent_cached(self, mixed, g, beta, lay, ssm, cache_view=None):
        if on_gpu(mixed):
            # the same Triton kernel as the trainer; the state is read and written in place in the cache's
            # [slots, HV, K, V] tensor when the view exposes it
            from ...kernels.gdn_recurrent import gdn_recurrent_fwd

            cu = torch.tensor(lay.cu_seqlens, device=mixed.device, dtype=torch.int32)
            inplace = getattr(cache_view, "gdn_inplace", None)
            if inplace is not None:
                storage, slots = inplace(self.layer_idx)
                return gdn_recurrent_fwd(*self._split(mixed), g, beta, cu, storage["ssm"], slots), {}
            state = ssm.float().contiguous().clone()
            return gdn_recurrent_fwd(*self._split(mixed), g, beta, cu, state), {"ssm": state}
        q, k, v, gg, bb = self._prep(lay.to_padded(mixed), lay.to_padded(g), lay.to_padded(beta))
        o, state = recurrent_fwd(q, k, v, gg, bb, ssm.float(), lay.lengths)
        return lay.to_packed(o.transpose(1, 2)), {"ssm": state}

    def _aligned_chunk(self, mixed, g, beta, lay: SeqLayout, cache):
        """bi_chunk: chunks aligned to 64-token boundaries from the sequence start. The cache holds the fp32
        state at the last boundary and the open chunk's inputs; the new tokens are appended to the open chunk
        and the chunked form runs from the boundary state, exactly as the trainer's pass over that chunk."""
        b = lay.num_seqs
        r = lay.start_pos % CHUNK  # tokens already in the open chunk
        n = lay.lengths
        width = int((r + n).max())
        width += (-width) % CHUNK
        new = torch.cat([mixed, g, beta], dim=-1)  # one gather for all per-token inputs
        buf = torch.cat([cache["buf_qkv"], cache["buf_g"], cache["buf_beta"]], dim=-1).to(new.dtype)
        src = torch.cat([buf, lay.to_padded(new), new.new_zeros(b, 1, new.shape[-1])], dim=1)
        idx = _open_chunk_index(r, n, width, zero_row=src.shape[1] - 1)
        seq = src.gather(1, idx.unsqueeze(-1).expand(b, width, src.shape[-1]))  # [B, width, C+2HV]
        c = self.conv_dim
        q, k, v, gg, bb = self._prep(seq[..., :c], seq[..., c : c + self.hv], seq[..., c + self.hv :])
        o, states = chunk_fwd(q, k, v, gg, bb, cache["ssm"].float())
        out_idx = _new_rows_index(r, lay.valid.shape[1], width)
        o = o.transpose(1, 2).gather(1, out_idx[..., None, None].expand(-1, -1, self.hv, self.dv))
        # new boundary state and open chunk
        full = (r + n) // CHUNK
        ssm = states[torch.arange(b, device=full.device), :, full]
        left = (r + n) % CHUNK
        jb = torch.arange(CHUNK, device=new.device)[None, :]
        bidx = torch.where(jb < left[:, None], full[:, None] * CHUNK + jb, width)
        seq_ext = torch.cat([seq, seq.new_zeros(b, 1, seq.shape[-1])], dim=1)
        open_chunk = seq_ext.gather(1, bidx.unsqueeze(-1).expand(b, CHUNK, seq.shape[-1]))
        return lay.to_packed(o), {
            "ssm": ssm,
            "buf_qkv": open_chunk[..., :c],
            "buf_g": open_chunk[..., c : c + self.hv],
            "buf_beta": open_chunk[..., c + self.hv :],
        }

    def _aligned_chunk_gpu(self, mixed, g, beta, lay: SeqLayout, view):
        """bi_chunk on the GPU. The cache holds the boundary state and the open chunk's rows as the chunked
        kernels compute them (k, v, g, beta, rows of (I + A)^-1, u). Decode steps append one row each with the
        fused kernel (kernels.gdn_chunk.chunk_decode: equal to the chunked forward's row bit for bit); other
        calls run the chunked forward over [cached rows, new tokens] from the boundary state and store the new
        open chunk's rows."""
        from ...kernels.gdn_chunk import chunk_decode
        from ...kernels.gdn_chunk import chunk_fwd as chunk_fwd_rows

        store, slots = view.gdn_inplace(self.layer_idx, open_chunk=True)
        q, k, v, gg, bb = self._prep(lay.to_padded(mixed), lay.to_padded(g), lay.to_padded(beta))
        r = lay.start_pos % CHUNK  # rows already in the open chunk
        if bool((lay.lengths == 1).all()):
            o = chunk_decode(q[:, :, 0], k[:, :, 0], v[:, :, 0], gg[:, :, 0], bb[:, :, 0], slots, r, store)
            return o, {}
        b, hv, width_new = q.shape[0], q.shape[1], q.shape[2]
        n = lay.lengths
        width = (int((r + n).max()) // CHUNK + 1) * CHUNK  # one chunk past the last token: the new open chunk
        idx = _open_chunk_index(r, n, width, zero_row=CHUNK + width_new)

        def place(cached, new):  # [B, HV, C, ...] rows of the open chunk + [B, HV, L, ...] new -> [B, HV, width, ...]
            zero = new.new_zeros(new.shape[:2] + (1,) + new.shape[3:])
            src = torch.cat([cached, new, zero], dim=2)
            ix = idx[:, None, :].expand(b, hv, width)
            if src.dim() == 4:
                ix = ix[..., None].expand(b, hv, width, src.shape[-1])
            return src.gather(2, ix)

        cached = {name: store[name][slots] for name in ("ck", "cv", "cg", "cb")}
        ks, vs = place(cached["ck"], k), place(cached["cv"], v)
        gs, bs = place(cached["cg"], gg), place(cached["cb"], bb)
        qs = place(torch.zeros_like(cached["ck"]), q)  # earlier rows' outputs are not recomputed: q = 0 there
        o, states, tm, u = chunk_fwd_rows(qs, ks, vs, gs, bs, store["ssm"][slots], return_rows=True)
        out_idx = _new_rows_index(r, width_new, width)
        o = o.gather(2, out_idx[:, None, :, None].expand(b, hv, width_new, o.shape[-1]))
        full = (r + n) // CHUNK  # index of the new open chunk
        ar = torch.arange(b, device=q.device)

        def chunk_rows(x):  # [B, HV, width, ...] -> rows of chunk `full` [B, HV, C, ...]
            return x.unflatten(2, (width // CHUNK, CHUNK))[ar, :, full]

        return lay.to_packed(o.transpose(1, 2)), {
            "ssm": states[ar, :, full],
            "ck": chunk_rows(ks), "cv": chunk_rows(vs), "cg": chunk_rows(gs), "cb": chunk_rows(bs),
            "ct": tm[ar, :, full], "cu": chunk_rows(u),
        }


def _open_chunk_index(r: torch.Tensor, n: torch.Tensor, width: int, zero_row: int) -> torch.Tensor:
    """[B, width] index into [open chunk's rows (CHUNK), the call's new tokens, ..., a zero row] that lays each
    sequence out from its last chunk boundary: its r cached rows, its n new tokens, then zero_row."""
    j = torch.arange(width, device=r.device)[None, :]
    idx = torch.where(j < r[:, None], j, CHUNK + j - r[:, None])
    return torch.where(j < (r + n)[:, None], idx, zero_row)


def _new_rows_index(r: torch.Tensor, num_new: int, width: int) -> torch.Tensor:
    """[B, num_new] rows r .. r + num_new - 1 of that layout (the new tokens' outputs; clamped past the end)."""
    return (r[:, None] + torch.arange(num_new, device=r.device)[None, :]).clamp(max=width - 1)


# ------------------------------------------------------------------------------------- attention


class RotaryTable(nn.Module):
    """cos/sin of NeoX RoPE by absolute position. Computed in fixed 4096-position pieces and looked up, so a
    position's values never depend on the call that needed them."""

    PIECE = 4096

    def __init__(self, rotary_dim: int, theta: float):
        super().__init__()
        # a plain attribute, not a buffer: always on cpu (also when the model is built under torch.device("meta"))
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32, device="cpu") / rotary_dim))
        self.pieces: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}

    def _piece(self, i: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        key = (i, str(device))
        if key not in self.pieces:
            pos = torch.arange(i * self.PIECE, (i + 1) * self.PIECE, dtype=torch.float32, device=device)
            freqs = pos[:, None] * self.inv_freq.to(device)[None, :]
            self.pieces[key] = (freqs.cos(), freqs.sin())
        return self.pieces[key]

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n_pieces = int(positions.max()) // self.PIECE + 1 if positions.numel() else 1
        parts = [self._piece(i, positions.device) for i in range(n_pieces)]
        cos = torch.cat([p[0] for p in parts])[positions]
        sin = torch.cat([p[1] for p in parts])[positions]
        return cos, sin


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, H, D]; rotate the first 2 * cos.shape[-1] dims (NeoX halves), pass the rest."""
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    c, s = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, rest], dim=-1)


class GatedAttention(nn.Module):
    def __init__(self, cfg: Qwen35Config, layer_idx: int, rope: RotaryTable):
        super().__init__()
        self.layer_idx = layer_idx
        self.hq, self.hkv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = Linear(cfg.hidden_size, self.hq * self.d * 2)  # [query | gate] per head
        self.k_proj = Linear(cfg.hidden_size, self.hkv * self.d)
        self.v_proj = Linear(cfg.hidden_size, self.hkv * self.d)
        self.o_proj = Linear(self.hq * self.d, cfg.hidden_size)
        self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps)
        self._rope = [rope]  # shared table, kept out of the module tree

    def forward(self, x: torch.Tensor, ctx: ForwardContext, nx: Numerics) -> torch.Tensor:
        lay, n = ctx.layout, x.shape[0]
        q, gate = self.q_proj(x, nx).view(n, self.hq, 2 * self.d).chunk(2, dim=-1)
        gate = gate.reshape(n, self.hq * self.d)
        q = self.q_norm(q)
        k = self.k_norm(self.k_proj(x, nx).view(n, self.hkv, self.d))
        v = self.v_proj(x, nx).view(n, self.hkv, self.d)
        cos, sin = self._rope[0](lay.positions)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        ctx.record(f"layers.{self.layer_idx}.attn.qkv", torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], -1))

        if ctx.cache is None:
            kk, vv = lay.to_padded(k), lay.to_padded(v)
        else:
            ctx.cache.write_kv(self.layer_idx, k, v, lay)
            kk, vv = ctx.cache.read_kv(self.layer_idx, lay)
        qq = lay.to_padded(q).transpose(1, 2)
        o = nx.attention(qq, kk.transpose(1, 2), vv.transpose(1, 2), lay.padded_positions, 1.0 / math.sqrt(self.d))
        o = lay.to_packed(o.transpose(1, 2)).reshape(n, self.hq * self.d)
        ctx.record(f"layers.{self.layer_idx}.attn.core", o)
        return self.o_proj(o * nx.sigmoid(gate), nx)


# -------------------------------------------------------------------------------------------- MLP


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = Linear(hidden, inter)
        self.up_proj = Linear(hidden, inter)
        self.down_proj = Linear(inter, hidden)

    def forward(self, x: torch.Tensor, nx: Numerics) -> torch.Tensor:
        return self.down_proj(nx.silu(self.gate_proj(x, nx)) * self.up_proj(x, nx), nx)


class Router(nn.Module):
    def __init__(self, cfg: Qwen35Config):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(cfg.num_experts, cfg.hidden_size))
        self.top_k = cfg.num_experts_per_tok

    def forward(self, x: torch.Tensor, nx: Numerics):
        """Softmax in fp32, top-k, renormalize. x is always 2-D here: the router is one GEMM on both sides
        (upstream, a 3-D input lowered to bmm in the generator and flipped top-k choices)."""
        probs = torch.softmax(nx.linear(x, self.weight).float(), dim=-1)
        top_w, top_i = torch.topk(probs, self.top_k, dim=-1)
        return (top_w / sum_last(top_w)).to(x.dtype), top_i


class Experts(nn.Module):
    """Routed experts as stacked weights (checkpoint layout: gate_up_proj [E, 2I, H], down_proj [E, H, I])."""

    def __init__(self, cfg: Qwen35Config):
        super().__init__()
        e, h, i = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * i, h))
        self.down_proj = nn.Parameter(torch.empty(e, h, i))

    def forward(self, x, top_w, top_i, nx: Numerics):
        out = torch.zeros_like(x)
        # experts added in ascending expert order for every token: a token's sum never depends on batch makeup
        for e in range(self.gate_up_proj.shape[0]):
            rows, slot = torch.where(top_i == e)
            if rows.numel() == 0:
                continue
            gate, up = nx.linear(x[rows], self.gate_up_proj[e]).chunk(2, dim=-1)
            y = nx.linear(nx.silu(gate) * up, self.down_proj[e]) * top_w[rows, slot, None]
            out = out.index_add(0, rows, y)
        return out


class SparseMoE(nn.Module):
    def __init__(self, cfg: Qwen35Config):
        super().__init__()
        self.gate = Router(cfg)
        self.experts = Experts(cfg)
        self.shared_expert = MLP(cfg.hidden_size, cfg.shared_expert_intermediate_size)
        self.shared_expert_gate = Linear(cfg.hidden_size, 1)

    def forward(self, x: torch.Tensor, nx: Numerics) -> torch.Tensor:
        top_w, top_i = self.gate(x, nx)
        routed = self.experts(x, top_w, top_i, nx)
        shared = self.shared_expert(x, nx) * nx.sigmoid(self.shared_expert_gate(x, nx))
        return routed + shared


# ------------------------------------------------------------------------------------------ model


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Qwen35Config, layer_idx: int, rope: RotaryTable):
        super().__init__()
        self.layer_type = cfg.layer_types[layer_idx]
        if self.layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg, layer_idx)
        else:
            self.self_attn = GatedAttention(cfg, layer_idx, rope)
        self.mlp = SparseMoE(cfg) if cfg.is_moe else MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layer_idx = layer_idx

    def forward(self, x: torch.Tensor, ctx: ForwardContext, nx: Numerics) -> torch.Tensor:
        mixer = self.linear_attn if self.layer_type == "linear_attention" else self.self_attn
        h = x + mixer(self.input_layernorm(x), ctx, nx)
        ctx.record(f"layers.{self.layer_idx}.mixer_out", h)
        h = h + self.mlp(self.post_attention_layernorm(h), nx)
        ctx.record(f"layers.{self.layer_idx}.mlp_out", h)
        return h


class TextModel(nn.Module):
    def __init__(self, cfg: Qwen35Config):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        rope = RotaryTable(cfg.rotary_dim, cfg.rope_theta)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, rope) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Qwen35ForCausalLM(nn.Module):
    """forward(input_ids [N] packed, cu_seqlens [B+1], start_pos [B], cache, logits_rows) -> fp32 logits."""

    def __init__(self, cfg: Qwen35Config, numerics: str | Numerics = "stock"):
        super().__init__()
        self.config = cfg
        self.numerics = get_numerics(numerics)
        self.model = TextModel(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def set_numerics(self, numerics: str | Numerics) -> None:
        self.numerics = get_numerics(numerics)

    @torch.no_grad()
    def init_weights(self, seed: int = 0, std: float = 0.02) -> "Qwen35ForCausalLM":
        """Random init (normal std for matrices; norms, dt_bias, A_log as published)."""
        gen = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if "norm" in name:
                p.copy_(torch.ones_like(p) if ".linear_attn.norm." in name else torch.zeros_like(p))
            elif leaf == "dt_bias":
                p.fill_(1.0)
            elif leaf == "A_log":
                p.copy_(torch.log(torch.empty(p.shape).uniform_(0.01, 16, generator=gen)))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
        return self

    def forward(
        self,
        input_ids: torch.Tensor,
        cu_seqlens: torch.Tensor | list[int] | None = None,
        *,
        start_pos: torch.Tensor | None = None,
        cache=None,
        logits_rows: torch.Tensor | None = None,
        tap=None,
    ) -> torch.Tensor:
        if input_ids.dim() == 2:  # [B, T] equal-length sequences
            b, t = input_ids.shape
            cu_seqlens = list(range(0, b * t + 1, t))
            input_ids = input_ids.reshape(-1)
        if cu_seqlens is None:
            cu_seqlens = [0, input_ids.shape[0]]
        ctx = ForwardContext(SeqLayout.build(cu_seqlens, start_pos, input_ids.device), cache, tap)
        nx = self.numerics
        h = self.model.embed_tokens(input_ids)
        ctx.record("embed", h)
        for layer in self.model.layers:
            h = layer(h, ctx, nx)
        h = self.model.norm(h)
        ctx.record("final_norm", h)
        if logits_rows is not None:
            h = h[logits_rows]
        # lm_head in fp32 whatever the activation dtype
        return nx.linear(h.float(), self.lm_head.weight.float())

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
