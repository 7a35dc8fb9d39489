"""The Qwen3.5 hybrid (Gated DeltaNet + gated full attention + dense or MoE MLP), written once and run by
both the trainer (packed sequences, no cache) and the generator (prefill / decode against its cache).

Parameter names and shapes follow the published checkpoints (transformers' Qwen3_5ForCausalLM /
Qwen3_5MoeForCausalLM), except two pairs of projections computed as one GEMM each, as vLLM computes them (MLP
gate_up_proj = [gate_proj; up_proj], GDN in_proj_ba = [in_proj_b; in_proj_a]): `checkpoint.py` maps files onto
this module, concatenating those on load and splitting them on save.

Numerics (which linear, activations, attention and GDN backend) come from `numerics.get_numerics`; the model
never branches on the mode or the device: each op and the GDN backend do (ops/).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from ...numerics import Numerics, get_numerics
from ...ops.conv import causal_conv, causal_conv_slots
from ...ops.gdn import GDNHeads
from ...ops import fused
from ...ops.reduce import sum_last
from ..layout import ForwardContext, SeqLayout
from .config import Qwen35Config


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm: normalize in fp32, scale by (1 + w)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused.rms_norm(x, self.weight, self.eps)  # one row-invariant kernel on CUDA


class GatedRMSNorm(nn.Module):
    """GDN output norm: the fp32 core output cast to z's dtype, normalized in fp32, cast, times weight (init
    ones), times silu(z)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor, silu) -> torch.Tensor:
        return fused.gated_rms_norm(x, z, self.weight, self.eps, silu)


class Linear(nn.Linear):
    """nn.Linear without bias whose matmul is chosen by the numerics mode."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__(d_in, d_out, bias=False)

    def forward(self, x: torch.Tensor, nx: Numerics) -> torch.Tensor:  # type: ignore[override]
        return nx.linear(x, self.weight)


# ------------------------------------------------------------------------------------------- GDN


class GatedDeltaNet(nn.Module):
    """Projections, the causal conv and the output norm; the core (the delta rule over the new tokens, from and
    into the generator's cache when there is one) is the numerics mode's GDN backend (ops/gdn)."""

    def __init__(self, cfg: Qwen35Config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.heads = GDNHeads.from_config(cfg)
        self.hv, self.dv = self.heads.num_v_heads, self.heads.v_dim
        self.value_dim, self.conv_dim = self.heads.value_dim, self.heads.conv_dim
        self.in_proj_qkv = Linear(cfg.hidden_size, self.conv_dim)
        self.in_proj_z = Linear(cfg.hidden_size, self.value_dim)
        self.in_proj_ba = Linear(cfg.hidden_size, 2 * self.hv)  # [b; a]: one GEMM (checkpoints: in_proj_b, in_proj_a)
        # stored as nn.Conv1d's weight [C, 1, W] (checkpoint layout); used by ops.conv
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, cfg.linear_conv_kernel_dim, groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.A_log = nn.Parameter(torch.log(torch.empty(self.hv).uniform_(0.01, 16)))
        self.norm = GatedRMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = Linear(self.value_dim, cfg.hidden_size)

    def forward(self, x: torch.Tensor, ctx: ForwardContext, nx: Numerics) -> torch.Tensor:
        lay, name, cache = ctx.layout, f"layers.{self.layer_idx}.gdn", ctx.cache
        qkv = self.in_proj_qkv(x, nx)
        z = self.in_proj_z(x, nx)
        b, a = self.in_proj_ba(x, nx).split(self.hv, dim=-1)  # views, read in place by the gates kernel
        g, beta = fused.gdn_gates(a, b, self.A_log, self.dt_bias, nx.softplus, nx.sigmoid)
        ctx.record(f"{name}.in_proj", qkv)

        conv_w = self.conv1d.weight.squeeze(1)
        lengths = None if lay.unpadded else lay.lengths  # every row full: its last W-1 inputs, no gather
        if cache is None:
            y, _ = causal_conv(lay.to_padded(qkv), conv_w, None, nx.silu, lengths)
        else:  # from the cache's conv states, updated in place
            states, slots = cache.gdn_slots(self.layer_idx)
            y = causal_conv_slots(lay.to_padded(qkv), conv_w, states["conv"], slots, nx.silu, lengths)
        mixed = lay.to_packed(y)
        ctx.record(f"{name}.conv", mixed)

        o = nx.gdn(mixed, g, beta, self.heads, lay, cache, self.layer_idx)  # [N, HV, V] fp32
        ctx.record(f"{name}.core", o)

        n = x.shape[0]
        o = self.norm(o.reshape(n * self.hv, self.dv), z.reshape(n * self.hv, self.dv), nx.silu)
        return self.out_proj(o.reshape(n, self.value_dim), nx)


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

    def _table(self, n_pieces: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        key = (-n_pieces, str(device))  # the first n_pieces pieces, concatenated once
        if key not in self.pieces:
            parts = [self._piece(i, device) for i in range(n_pieces)]
            self.pieces[key] = (torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
        return self.pieces[key]

    def forward(self, max_ctx: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """The cos, sin tables [P, rotary_dim / 2] for positions < max_ctx (a host bound: the table is sized
        without reading positions back); ops.fused.rope looks positions up in them."""
        return self._table(max(max_ctx - 1, 0) // self.PIECE + 1, device)


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
        q, gate = self.q_proj(x, nx).view(n, self.hq, 2 * self.d).chunk(2, dim=-1)  # views [N, Hq, D]
        q = self.q_norm(q)
        k = self.k_norm(self.k_proj(x, nx).view(n, self.hkv, self.d))
        v = self.v_proj(x, nx).view(n, self.hkv, self.d)
        cos, sin = self._rope[0](lay.max_ctx, x.device)
        q, k = fused.rope(q, lay.positions, cos, sin), fused.rope(k, lay.positions, cos, sin)
        if ctx.tap is not None:  # (the concatenation is a copy: only for the audit)
            ctx.record(f"layers.{self.layer_idx}.attn.qkv", torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], -1))

        if ctx.cache is None:
            kk, vv = lay.to_padded(k), lay.to_padded(v)
        else:
            ctx.cache.write_kv(self.layer_idx, k, v, lay)
            kk, vv = ctx.cache.read_kv(self.layer_idx, lay)
        qq = lay.to_padded(q).transpose(1, 2)
        # causal: query i sees keys 0..i (the trainer's pass, every sequence from position 0, no cache)
        o = nx.attention(qq, kk.transpose(1, 2), vv.transpose(1, 2), lay.padded_positions, 1.0 / math.sqrt(self.d),
                         causal=ctx.cache is None and lay.from_start)
        o = lay.to_packed(o.transpose(1, 2)).reshape(n, self.hq * self.d)
        ctx.record(f"layers.{self.layer_idx}.attn.core", o)
        return self.o_proj(fused.gated(o, gate, nx.sigmoid, "sigmoid"), nx)  # o * sigmoid(gate)


# -------------------------------------------------------------------------------------------- MLP


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.inter = inter
        self.gate_up_proj = Linear(hidden, 2 * inter)  # [gate; up]: one GEMM (checkpoints: gate_proj, up_proj)
        self.down_proj = Linear(inter, hidden)

    def forward(self, x: torch.Tensor, nx: Numerics) -> torch.Tensor:
        gate, up = self.gate_up_proj(x, nx).split(self.inter, dim=-1)  # views, read in place by the gated kernel
        return self.down_proj(fused.gated(up, gate, nx.silu, "silu"), nx)


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
        # grouped by expert in one op (ops/moe); a token's experts are added in ascending expert order, in fp32
        return nx.experts(x, top_w, top_i, self.gate_up_proj, self.down_proj)


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

    def __init__(self, cfg: Qwen35Config, numerics: str | Numerics | Mapping[str, Any] = "stock"):
        super().__init__()
        self.config = cfg
        self.numerics = get_numerics(numerics)
        # trainer.activation_checkpointing: under autograd keep each layer's input only and run the layer again in
        # backward (same kernels on the same input, so the same bits); off for the generator's no-grad forwards
        self.activation_checkpointing = False
        self.model = TextModel(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def set_numerics(self, numerics: str | Numerics | Mapping[str, Any]) -> None:
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
        layout: SeqLayout | None = None,
    ) -> torch.Tensor:
        """layout: the call's SeqLayout when the caller built it (the generator: host metadata moved in one
        transfer, or the CUDA-graph runner's static buffers); cu_seqlens and start_pos are then ignored."""
        h = self.final_hidden(input_ids, cu_seqlens, start_pos=start_pos, cache=cache, tap=tap, layout=layout)
        if logits_rows is not None:
            h = h[logits_rows]
        return self.logits(h)

    def final_hidden(self, input_ids, cu_seqlens=None, *, start_pos=None, cache=None, tap=None, layout=None):
        """The final-norm hidden states [N, H] of `forward` (a host engine that picks its logit rows itself, as
        vLLM does, calls this and then `logits`)."""
        if input_ids.dim() == 2:  # [B, T] equal-length sequences
            b, t = input_ids.shape
            cu_seqlens = list(range(0, b * t + 1, t))
            input_ids = input_ids.reshape(-1)
        if cu_seqlens is None:
            cu_seqlens = [0, input_ids.shape[0]]
        if layout is None:
            layout = SeqLayout.build(cu_seqlens, start_pos, input_ids.device)
        layout.memo.clear()  # what the layers share is computed in this call (a graph's layout is refilled per step)
        ctx = ForwardContext(layout, cache, tap)
        nx = self.numerics
        h = self.model.embed_tokens(input_ids)
        ctx.record("embed", h)
        recompute = self.activation_checkpointing and torch.is_grad_enabled() and cache is None and tap is None
        for layer in self.model.layers:
            h = checkpoint(layer, h, ctx, nx, use_reentrant=False) if recompute else layer(h, ctx, nx)
        h = self.model.norm(h)
        ctx.record("final_norm", h)
        return h

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """fp32 logits of final-norm hidden rows: the lm_head in fp32 whatever the activation dtype (bf16 operands
        on CUDA: exact products, fp32 sums, ops/linear/head.py)."""
        return self.numerics.logits(h, self.lm_head.weight, self.lm_head_fp32)

    def refresh_lm_head_copy(self) -> None:
        """Before a CUDA-graph replay: bring the kept fp32 cast of the lm_head up to date if a forward made one (the
        fp32 path of `logits`; the bf16 tensor-core head makes none)."""
        if getattr(self, "_lm_head_cache", None) is not None:
            self.lm_head_fp32()

    def lm_head_fp32(self) -> torch.Tensor:
        """The lm_head weight in fp32, for the fp32 path of `logits` (CPU, fp32 weights). Without autograd the cast
        is kept until the weight changes (its version counter moves on every in-place update: update_weights, an
        optimizer step), then refreshed in place, so a captured CUDA graph reads the new values too: a decode step
        would otherwise write and read the whole copy each time. Same values as .float() either way."""
        w = self.lm_head.weight
        if torch.is_grad_enabled() or w.dtype == torch.float32:
            return w.float()
        key = (w.data_ptr(), w._version)
        cached = getattr(self, "_lm_head_cache", None)
        if cached is None or cached[1].shape != w.shape or cached[1].device != w.device:
            cached = self._lm_head_cache = [key, w.float()]
        elif cached[0] != key:
            with torch.no_grad():
                cached[1].copy_(w)
            cached[0] = key
        return cached[1]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
