"""Our one model definition (models/qwen3_5/model.py) as a vLLM model, registered out of tree.

vLLM owns the memory and the schedule, our model owns the arithmetic:
- every GDN layer has a `GDNStateLayer` (a vLLM MambaBase layer): vLLM allocates its per-request state (conv +
  exactly the tensors the numerics mode's GDN backend declares, the ssm state fp32) and hands each step the
  request -> state-slot indices (GDN attention metadata);
- every attention layer has a vLLM `Attention` layer that is only a paged KV allocation: vLLM sizes the blocks,
  owns the block tables and slot mappings; our attention writes and reads the K/V rows there (`VLLMCacheView`)
  and computes with the mode's attention op, so the generator's arithmetic is the embedded engine's;
- `forward` returns the final-norm hidden states, `compute_logits` our fp32 lm_head; vLLM samples and returns
  the raw fp32 logprob of the sampled token (logprobs_mode=raw_logprobs: log_softmax of those logits, the op
  ops/logprob.token_logprobs applies on the trainer side).
The checkpoint directory (vllm_engine/engine.py writes it) holds our config.json (architectures set to this
class) and `zeromismatch_numerics.json` (the numerics mode).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn as nn
from vllm.config import VllmConfig, get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

from ...models.qwen3_5.checkpoint import merged_half
from ...models.qwen3_5.config import Qwen35Config
from ...models.qwen3_5.model import Qwen35ForCausalLM
from ...numerics import get_numerics
from ...ops.gdn import GDNHeads
from ...ops.varlen import SeqLayout
from ..cache import _Gather

ARCHITECTURE = "ZeroMismatchForCausalLM"
NUMERICS_FILE = "zeromismatch_numerics.json"
_KV_BLOCK = 64  # our attention reads keys in 64-position blocks (the embedded engine's BLOCK_SIZE)


def _read_model_dir(vllm_config: VllmConfig):
    """(Qwen35Config, numerics spec) from the model directory vLLM was started on."""
    path = Path(vllm_config.model_config.model)
    hf = json.loads((path / "config.json").read_text())
    hf.pop("architectures", None)
    cfg = Qwen35Config.from_hf_dict(hf, source=str(path / "config.json"))
    return cfg, json.loads((path / NUMERICS_FILE).read_text())


def _state_spec(cfg: Qwen35Config, numerics, dtype: torch.dtype) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Per-request GDN state of one layer, in a fixed order: conv (last W-1 inputs), then the backend's tensors."""
    heads = GDNHeads.from_config(cfg)
    spec = {"conv": ((cfg.linear_conv_kernel_dim - 1, heads.conv_dim), dtype)}
    spec.update(get_numerics(numerics).gdn.cache_spec(heads, "cpu", dtype))
    return spec


class GDNStateLayer(nn.Module, MambaBase):
    """A vLLM linear-state layer that only declares and receives a GDN layer's per-request state."""

    def __init__(self, spec: dict, prefix: str):
        super().__init__()
        self.names = list(spec)
        self.shapes = tuple(shape for shape, _ in spec.values())
        self.dtypes = tuple(dt for _, dt in spec.values())
        self.prefix = prefix
        ctx = get_current_vllm_config().compilation_config.static_forward_context
        if prefix in ctx:
            raise ValueError(f"duplicate layer name {prefix}")
        ctx[prefix] = self

    def get_state_shape(self):
        return self.shapes

    def get_state_dtype(self):
        return self.dtypes

    @property
    def mamba_type(self) -> MambaAttentionBackendEnum:
        return MambaAttentionBackendEnum.GDN_ATTN

    def states(self) -> dict[str, torch.Tensor]:
        """name -> [num_state_slots, *shape] views of vLLM's pages (bound by vLLM before the first step)."""
        return dict(zip(self.names, self.kv_cache))


class VLLMCacheView:
    """models.layout.CacheView over the tensors vLLM allocated: GDN state by vLLM's state indices, K/V rows in
    vLLM's paged blocks ([blocks, kv_heads, block_size, 2 * head_dim]: K then V) by its block tables."""

    def __init__(self, gdn: dict[int, tuple[dict[str, torch.Tensor], torch.Tensor]],
                 kv: dict[int, tuple[torch.Tensor, torch.Tensor]], head_dim: int):
        self.gdn, self.kv, self.d = gdn, kv, head_dim

    def gdn_state(self, layer_idx: int) -> dict[str, torch.Tensor]:
        tensors, slots = self.gdn[layer_idx]
        return _Gather(tensors, slots)

    def gdn_slots(self, layer_idx: int):
        return self.gdn[layer_idx]

    def set_gdn_state(self, layer_idx: int, state: dict[str, torch.Tensor]) -> None:
        tensors, slots = self.gdn[layer_idx]
        for n, t in state.items():
            tensors[n][slots] = t.detach().to(tensors[n].dtype)

    def write_kv(self, layer_idx, k, v, layout: SeqLayout) -> None:
        cache, table = self.kv[layer_idx]
        bs, pos = cache.shape[2], layout.positions
        blocks = table[layout.seq_index, pos // bs].long()
        cache[blocks, :, pos % bs] = torch.cat([k, v], dim=-1).detach().to(cache.dtype)

    def read_kv(self, layer_idx, layout: SeqLayout):
        """[B, P, Hkv, D] keys and values, P = max_ctx rounded up to 64 (what our attention reads)."""
        cache, table = self.kv[layer_idx]
        bs = cache.shape[2]
        width = -(-layout.max_ctx // _KV_BLOCK) * _KV_BLOCK
        n_blocks = -(-width // bs)
        tab = table[:, :n_blocks].long()
        if tab.shape[1] < n_blocks:  # past the table: masked keys, any finite values
            tab = torch.cat([tab, tab.new_zeros(tab.shape[0], n_blocks - tab.shape[1])], dim=1)
        rows = cache[tab].permute(0, 1, 3, 2, 4).flatten(1, 2)[:, :width]  # [B, P, Hkv, 2D]
        return rows[..., : self.d], rows[..., self.d :]


class ZeroMismatchForCausalLM(nn.Module):
    """vLLM's view of Qwen35ForCausalLM: hybrid (GDN state + paged KV), raw fp32 logits."""

    is_hybrid = True
    has_inner_state = True

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        cfg, numerics = _read_model_dir(vllm_config)
        self.config = cfg
        dtype = vllm_config.model_config.dtype
        with torch.device("cpu"):
            self.net = Qwen35ForCausalLM(cfg, numerics).to(dtype)
        spec = _state_spec(cfg, numerics, dtype)
        self.gdn_layers, self.kv_layers = nn.ModuleDict(), nn.ModuleDict()
        for i, kind in enumerate(cfg.layer_types):
            if kind == "linear_attention":
                self.gdn_layers[str(i)] = GDNStateLayer(spec, f"layers.{i}.gdn_state")
            else:
                self.kv_layers[str(i)] = Attention(
                    cfg.num_attention_heads, cfg.head_dim, 1.0 / math.sqrt(cfg.head_dim), cfg.num_key_value_heads,
                    cache_config=vllm_config.cache_config, prefix=f"layers.{i}.kv")
        self.tap = None  # audit hook, set by the engine adapter: tap(name, x, layout, seq_keys)

    # -------------------------------------------------------------------- the hybrid-model contract
    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config: VllmConfig):
        cfg, numerics = _read_model_dir(vllm_config)
        return tuple(shape for shape, _ in _state_spec(cfg, numerics, vllm_config.model_config.dtype).values())

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config: VllmConfig):
        cfg, numerics = _read_model_dir(vllm_config)
        return tuple(dt for _, dt in _state_spec(cfg, numerics, vllm_config.model_config.dtype).values())

    @classmethod
    def get_mamba_state_copy_func(cls):
        raise NotImplementedError("prefix caching of GDN state is off for this model (enable_prefix_caching=False)")

    # ------------------------------------------------------------------------------------ forward
    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.net.model.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, intermediate_tensors=None,
                inputs_embeds=None, **kwargs) -> torch.Tensor:
        metadata = get_forward_context().attn_metadata
        n = input_ids.shape[0]
        if not metadata:  # vLLM's profiling / warm-up run: nothing is read back
            return torch.zeros(n, self.config.hidden_size, dtype=self.net.lm_head.weight.dtype)
        layout, view = self._layout_and_cache(metadata, positions)
        m = layout.cu_seqlens[-1]
        h = self.net.final_hidden(input_ids[:m], cache=view, tap=self.tap, layout=layout)
        if m < n:
            h = torch.cat([h, h.new_zeros(n - m, h.shape[1])])
        return h

    def _layout_and_cache(self, metadata: dict, positions: torch.Tensor) -> tuple[SeqLayout, VLLMCacheView]:
        any_kv = next(iter(self.kv_layers.values()), None)
        any_gdn = next(iter(self.gdn_layers.values()), None)
        if any_kv is not None:
            qsl = metadata[any_kv.layer_name].query_start_loc
        else:
            qsl = metadata[any_gdn.prefix].non_spec_query_start_loc
        cu = qsl.tolist()
        start = positions[torch.tensor(cu[:-1], dtype=torch.long)]
        layout = SeqLayout.build(cu, start, positions.device)
        fresh = start == 0  # a new request's state slot holds a previous request's values
        gdn = {}
        for i, layer in self.gdn_layers.items():
            slots = metadata[layer.prefix].non_spec_state_indices_tensor[: layout.num_seqs].long()
            tensors = layer.states()
            if bool(fresh.any()):
                for t in tensors.values():
                    t[slots[fresh]] = 0
            gdn[int(i)] = (tensors, slots)
        kv = {}
        for i, layer in self.kv_layers.items():
            md = metadata[layer.layer_name]
            kv[int(i)] = (layer.kv_cache[0] if isinstance(layer.kv_cache, list) else layer.kv_cache, md.block_table)
        return layout, VLLMCacheView(gdn, kv, self.config.head_dim)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.net.logits(hidden_states)

    # ------------------------------------------------------------------------------------ weights
    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Checkpoint names (ours: the published layout) copied in place into the model's parameters."""
        params = dict(self.net.named_parameters(remove_duplicate=False))
        loaded = set()
        for name, t in weights:
            half = merged_half(name) if name not in params else None  # gate_proj -> gate_up_proj's first half
            if half is not None and half[0] in params:
                name, dst = half[0], params[half[0]].chunk(2)[half[1]]
            elif name in params:
                dst = params[name]
            else:
                raise KeyError(f"vLLM weight load: unknown tensor {name!r}")
            dst.copy_(t.to(dst.dtype))
            loaded.add(f"net.{name}")
        if self.config.tie_word_embeddings:
            loaded.add("net.lm_head.weight")
        return loaded
