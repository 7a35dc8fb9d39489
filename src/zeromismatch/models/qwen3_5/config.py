"""Qwen3.5 hybrid configuration and presets. Field names follow the published config.json (text part), so a
checkpoint's config loads as is."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass
class Qwen35Config:
    vocab_size: int = 248320
    hidden_size: int = 4096
    num_hidden_layers: int = 32
    layer_types: list[str] = field(default_factory=list)  # empty -> [linear x3, full] repeating
    # gated full attention
    num_attention_heads: int = 16
    num_key_value_heads: int = 4
    head_dim: int = 256
    partial_rotary_factor: float = 0.25
    rope_theta: float = 1e7
    # Gated DeltaNet
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4
    # MLP: dense if num_experts == 0
    intermediate_size: int = 12288
    num_experts: int = 0
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 512
    shared_expert_intermediate_size: int = 512
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    def __post_init__(self):
        if not self.layer_types:
            self.layer_types = [
                "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(self.num_hidden_layers)
            ]
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries, num_hidden_layers={self.num_hidden_layers}")
        bad = set(self.layer_types) - {"linear_attention", "full_attention"}
        if bad:
            raise ValueError(f"unknown layer types {sorted(bad)}: use linear_attention / full_attention")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError("linear_num_value_heads must be a multiple of linear_num_key_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    # ---- config.json (HF text config) round trip
    def to_hf_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["model_type"] = "qwen3_5_moe_text" if self.is_moe else "qwen3_5_text"
        d["architectures"] = ["Qwen3_5MoeForCausalLM" if self.is_moe else "Qwen3_5ForCausalLM"]
        d["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": d.pop("rope_theta"),
            "partial_rotary_factor": d.pop("partial_rotary_factor"),
        }
        d["hidden_act"] = "silu"
        if not self.is_moe:
            for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size"):
                d.pop(k)
        return d

    @classmethod
    def from_hf_dict(cls, d: dict) -> "Qwen35Config":
        top, d = d, dict(d.get("text_config", d))  # multimodal checkpoints nest the text config
        if "text_config" in top and "tie_word_embeddings" in top:  # ...and tie the embeddings at the top level
            d["tie_word_embeddings"] = top["tie_word_embeddings"]
        rope = d.pop("rope_parameters", None) or d.pop("rope_scaling", None) or {}
        if "rope_theta" in rope:
            d.setdefault("rope_theta", rope["rope_theta"])
        if "partial_rotary_factor" in rope:
            d.setdefault("partial_rotary_factor", rope["partial_rotary_factor"])
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in names}
        if isinstance(kwargs.get("eos_token_id"), list):
            kwargs["eos_token_id"] = kwargs["eos_token_id"][0]
        return cls(**kwargs)


def _tiny(**kw) -> Qwen35Config:
    base = dict(
        vocab_size=2048,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        intermediate_size=768,
        rope_theta=1e4,
    )
    base.update(kw)
    return Qwen35Config(**base)


PRESETS = {
    # published dimensions (NOTES 2)
    "qwen3_5_9b": lambda: Qwen35Config(),
    "qwen3_5_35b_a3b": lambda: Qwen35Config(
        hidden_size=2048,
        num_hidden_layers=40,
        num_attention_heads=16,
        num_key_value_heads=2,
        intermediate_size=512,
        num_experts=256,
        num_experts_per_tok=8,
        moe_intermediate_size=512,
        shared_expert_intermediate_size=512,
    ),
    # a ~0.5B model with the real head counts and dims (GDN 16/32 heads of 128, attention 16/4 of 256)
    "qwen3_5_mid": lambda: Qwen35Config(vocab_size=32768, hidden_size=1024, num_hidden_layers=16, intermediate_size=4096),
    # CPU presets: 3 GDN + 1 attention layers
    "tiny": lambda: _tiny(),
    "tiny_moe": lambda: _tiny(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=192, shared_expert_intermediate_size=192),
}


def get_preset(name: str, **overrides) -> Qwen35Config:
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
    cfg = PRESETS[name]()
    return dataclasses.replace(cfg, **overrides) if overrides else cfg
