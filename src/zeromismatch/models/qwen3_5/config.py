"""Qwen3.5 hybrid configuration and presets. Field names follow the published config.json (text part), so a
checkpoint's config loads as is.

Loading a config.json reads every key: a key is a Qwen35Config field, a key whose value must be the one this
model implements (REQUIRED_VALUES), or a key that does not change the text model's forward (IGNORED_KEYS).
Anything else, or a required key with another value, fails with one line naming the file, the key, its value
and what is supported, rather than building a different model than the checkpoint describes.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from ...errors import ConfigError  # a config.json key this model does not implement

# key -> the values this model implements (the published Qwen3.5 configs carry exactly these)
REQUIRED_VALUES: dict[str, tuple] = {
    "hidden_act": ("silu",),
    "attention_bias": (False,),  # q/k/v/o projections have no bias
    "attention_dropout": (0, 0.0),
    "attn_output_gate": (True,),  # q_proj gives [query | gate]; the output is gated by sigmoid(gate)
    "mlp_only_layers": ([],),  # an MoE model is MoE in every layer
    "decoder_sparse_step": (1,),
    "norm_topk_prob": (True,),  # top-k router weights are renormalized
    "output_router_logits": (False,),  # no load-balancing loss in the trainer
    "mamba_ssm_dtype": ("float32",),  # the GDN state is always fp32
}
# key -> why it does not change the text model's forward
IGNORED_KEYS: dict[str, str] = {
    "architectures": "names the transformers class",
    "transformers_version": "written by transformers",
    "dtype": "storage dtype: loading keeps the stored dtype or casts on request",
    "torch_dtype": "storage dtype: loading keeps the stored dtype or casts on request",
    "bos_token_id": "a tokenizer setting",
    "max_position_embeddings": "RoPE here has no length limit",
    "initializer_range": "random initialization only",
    "use_cache": "a transformers generation setting",
    "router_aux_loss_coef": "the load-balancing loss, used only with output_router_logits",
    "full_attention_interval": "layer_types says the layout (derived from this key when absent)",
    "mtp_num_hidden_layers": "the multi-token-prediction head is not loaded",
    "mtp_use_dedicated_embeddings": "the multi-token-prediction head is not loaded",
}
# keys of the multimodal outer object (Qwen3_5ForConditionalGeneration) beside text_config: the vision tower
# is not loaded
MULTIMODAL_KEYS = frozenset({
    "text_config", "vision_config", "image_token_id", "video_token_id", "vision_start_token_id",
    "vision_end_token_id", "language_model_only", "tie_word_embeddings", "model_type", *IGNORED_KEYS,
})
MODEL_TYPES = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_5", "qwen3_5_moe")
ROPE_TYPES = ("default",)
# rope_parameters keys besides rope_type, rope_theta and partial_rotary_factor: M-RoPE rotates text tokens by
# one position on all three axes, which is plain RoPE
ROPE_IGNORED = ("mrope_section", "mrope_interleaved")


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
        sizes = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                 "linear_value_head_dim", "linear_conv_kernel_dim"]
        if self.is_moe:
            sizes += ["moe_intermediate_size", "shared_expert_intermediate_size", "num_experts_per_tok"]
        else:
            sizes += ["intermediate_size"]
        for name in sizes:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r}: supported: a positive integer")
        if self.num_experts < 0 or (self.is_moe and self.num_experts_per_tok > self.num_experts):
            raise ValueError(f"num_experts={self.num_experts}, num_experts_per_tok={self.num_experts_per_tok}: "
                             "supported: 0 experts (dense) or 1 <= num_experts_per_tok <= num_experts")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(f"linear_num_value_heads={self.linear_num_value_heads}: must be a multiple of "
                             f"linear_num_key_heads={self.linear_num_key_heads}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads}: must be a multiple of "
                             f"num_key_value_heads={self.num_key_value_heads}")
        if self.rotary_dim % 2 or not 0 <= self.rotary_dim <= self.head_dim:
            raise ValueError(f"partial_rotary_factor={self.partial_rotary_factor} of head_dim={self.head_dim} gives "
                             f"{self.rotary_dim} rotary dims: supported: an even number from 0 to head_dim "
                             "(NeoX rotates two halves)")

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
    def from_hf_dict(cls, d: dict, source: str = "config.json") -> "Qwen35Config":
        """The text model of a config.json (flat, or multimodal with the text part under text_config). Raises
        ConfigError naming `source`, every unsupported key and its value, and what is supported."""
        problems: list[str] = []
        text, where = d, ""
        if "text_config" in d:  # the published multimodal layout
            text, where = d["text_config"], "text_config."
            problems += [_unknown(k, v) for k, v in d.items() if k not in MULTIMODAL_KEYS]
            problems += _check_model_type(d)
        text = dict(text)
        if where and "tie_word_embeddings" in d:  # ...which ties the embeddings at the top level
            if text.get("tie_word_embeddings", d["tie_word_embeddings"]) != d["tie_word_embeddings"]:
                problems.append(f"tie_word_embeddings={_show(d['tie_word_embeddings'])} and "
                                f"text_config.tie_word_embeddings={_show(text['tie_word_embeddings'])} disagree")
            text["tie_word_embeddings"] = d["tie_word_embeddings"]
        problems += _check_model_type(text, where)
        for key in ("rope_parameters", "rope_scaling"):
            rope = text.pop(key, None)
            if rope is None:
                continue
            if not isinstance(rope, dict):
                problems.append(f"{where}{key}={_show(rope)} (supported: an object with rope_type 'default')")
                continue
            for k, v in rope.items():
                if k in ("rope_type", "type"):
                    if v not in ROPE_TYPES:
                        problems.append(f"{where}{key}.{k}={_show(v)} (supported: {_choices(ROPE_TYPES)})")
                elif k in ("rope_theta", "partial_rotary_factor"):
                    text.setdefault(k, v)
                elif k not in ROPE_IGNORED:
                    problems.append(_unknown(f"{where}{key}.{k}", v))
        if text.get("layer_types") is None and "full_attention_interval" in text:
            interval, n = text["full_attention_interval"], text.get("num_hidden_layers", cls.num_hidden_layers)
            if isinstance(interval, int) and interval >= 1 and isinstance(n, int):
                text["layer_types"] = [
                    "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)
                ]
            else:
                problems.append(f"{where}full_attention_interval={_show(interval)} (supported: a positive integer)")
        names = {f.name for f in dataclasses.fields(cls)}
        for k, v in text.items():
            if k in REQUIRED_VALUES and v not in REQUIRED_VALUES[k]:
                problems.append(f"{where}{k}={_show(v)} (supported: {_choices(REQUIRED_VALUES[k])})")
            elif k not in names and k not in REQUIRED_VALUES and k not in IGNORED_KEYS and k != "model_type":
                problems.append(_unknown(where + k, v))
        if problems:
            raise ConfigError(f"{source}: unsupported config: " + "; ".join(problems))
        kwargs = {k: v for k, v in text.items() if k in names}
        if isinstance(kwargs.get("eos_token_id"), list):
            kwargs["eos_token_id"] = kwargs["eos_token_id"][0]
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{source}: unsupported config: {e}") from None


def _show(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _choices(values) -> str:
    return " or ".join(_show(v) for v in values)


def _unknown(key: str, value) -> str:
    return f"{key}={_show(value)} (unknown key: not read by this loader)"


def _check_model_type(d: dict, where: str = "") -> list[str]:
    if "model_type" in d and d["model_type"] not in MODEL_TYPES:
        return [f"{where}model_type={_show(d['model_type'])} (supported: {_choices(MODEL_TYPES)})"]
    return []


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
    # published dimensions (the Qwen3.5-9B and 35B-A3B config.json files)
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
    # ~30M, for RL that learns on one GPU in minutes (conf/scale/small.yaml): 6 GDN + 2 gated-attention layers,
    # the tiny vocabulary (the offline math tokenizer), GDN 4 key / 8 value heads of 64
    "qwen3_5_small": lambda: _tiny(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, linear_num_key_heads=4,
                                   linear_num_value_heads=8, intermediate_size=1536),
    # its MoE form (conf/scale/small_moe.yaml): 8 experts, top-2, expert and shared-expert width 256
    "qwen3_5_small_moe": lambda: _tiny(hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                                       linear_num_key_heads=4, linear_num_value_heads=8, num_experts=8,
                                       num_experts_per_tok=2, moe_intermediate_size=256,
                                       shared_expert_intermediate_size=256),
    # CPU presets: 3 GDN + 1 attention layers
    "tiny": lambda: _tiny(),
    "tiny_moe": lambda: _tiny(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=192, shared_expert_intermediate_size=192),
}


def get_preset(name: str, **overrides) -> Qwen35Config:
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
    cfg = PRESETS[name]()
    if "num_hidden_layers" in overrides and "layer_types" not in overrides:
        overrides["layer_types"] = []  # the preset's pattern for the new layer count
    return dataclasses.replace(cfg, **overrides) if overrides else cfg
