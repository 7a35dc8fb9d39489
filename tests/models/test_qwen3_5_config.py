"""config.json loading reads every key: the published Qwen3.5 configs load, and anything the model does not
implement fails at load with one line naming the file, the key, its value and what is supported."""

import copy
import dataclasses
import json
import re

import pytest

from zeromismatch.models.qwen3_5 import (
    ConfigError,
    Qwen35Config,
    build_model,
    get_preset,
    load_checkpoint,
    save_checkpoint,
)

# the key set of the published Qwen/Qwen3.5-9B config.json (multimodal: text model under text_config)
PUBLISHED_9B = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "image_token_id": 248056,
    "language_model_only": False,
    "model_type": "qwen3_5",
    "text_config": {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "bos_token_id": 248044,
        "dtype": "bfloat16",
        "eos_token_id": 248044,
        "full_attention_interval": 4,
        "head_dim": 256,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 12288,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 8,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_value_head_dim": 128,
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": 262144,
        "mlp_only_layers": [],
        "model_type": "qwen3_5_text",
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": 16,
        "num_hidden_layers": 32,
        "num_key_value_heads": 4,
        "pad_token_id": None,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": [11, 11, 10],
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
        },
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": 248320,
    },
    "tie_word_embeddings": False,
    "transformers_version": "4.57.0.dev0",
    "video_token_id": 248057,
    "vision_config": {"depth": 27, "hidden_size": 1152, "model_type": "qwen3_5", "out_hidden_size": 4096},
    "vision_end_token_id": 248054,
    "vision_start_token_id": 248053,
}
MOE_KEYS = {  # the published Qwen/Qwen3.5-35B-A3B text_config differs by these
    "hidden_size": 2048,
    "num_hidden_layers": 40,
    "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 10,
    "num_key_value_heads": 2,
    "moe_intermediate_size": 512,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "shared_expert_intermediate_size": 512,
    "router_aux_loss_coef": 0.001,
    "output_router_logits": False,
}


def published(moe=False, **text_edits):
    d = copy.deepcopy(PUBLISHED_9B)
    if moe:
        d["model_type"], d["architectures"] = "qwen3_5_moe", ["Qwen3_5MoeForConditionalGeneration"]
        d["text_config"].pop("intermediate_size")
        d["text_config"].update(MOE_KEYS, model_type="qwen3_5_moe_text")
    d["text_config"].update(text_edits)
    return d


@pytest.mark.parametrize("moe,preset", [(False, "qwen3_5_9b"), (True, "qwen3_5_35b_a3b")])
def test_published_configs_load_as_the_presets(moe, preset):
    cfg = dataclasses.asdict(Qwen35Config.from_hf_dict(published(moe)))
    expect = dataclasses.asdict(get_preset(preset, eos_token_id=248044))
    if moe:  # the dense MLP width is unused in an MoE model (the published MoE config has none)
        del cfg["intermediate_size"], expect["intermediate_size"]
    assert cfg == expect


@pytest.mark.parametrize("preset", ["tiny", "tiny_moe", "qwen3_5_9b", "qwen3_5_35b_a3b"])
def test_our_config_json_round_trips(preset):
    cfg = get_preset(preset)
    assert Qwen35Config.from_hf_dict(json.loads(json.dumps(cfg.to_hf_dict()))) == cfg


@pytest.mark.parametrize(
    "edit, expect",
    [
        (dict(hidden_act="gelu"), 'text_config.hidden_act="gelu" (supported: "silu")'),
        (dict(attention_bias=True), "text_config.attention_bias=true (supported: false)"),
        (dict(attn_output_gate=False), "text_config.attn_output_gate=false (supported: true)"),
        (dict(mlp_only_layers=[0, 1]), "text_config.mlp_only_layers=[0, 1] (supported: [])"),
        (dict(mamba_ssm_dtype="bfloat16"), 'text_config.mamba_ssm_dtype="bfloat16" (supported: "float32")'),
        (dict(attention_dropout=0.1), "text_config.attention_dropout=0.1 (supported: 0 or 0.0)"),
        (dict(sliding_window=4096), "text_config.sliding_window=4096 (unknown key: not read by this loader)"),
        (
            dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e7, "factor": 4.0}),
            'text_config.rope_parameters.rope_type="yarn" (supported: "default"); '
            "text_config.rope_parameters.factor=4.0 (unknown key: not read by this loader)",
        ),
        (
            dict(rope_scaling={"type": "linear", "factor": 2.0}),
            'text_config.rope_scaling.type="linear" (supported: "default")',
        ),
        (dict(model_type="qwen3_next"), 'text_config.model_type="qwen3_next" (supported: "qwen3_5_text" or'),
        (dict(head_dim=100), "partial_rotary_factor=0.25 of head_dim=100 gives 25 rotary dims: supported: an even"),
        (dict(linear_num_value_heads=24), "linear_num_value_heads=24: must be a multiple of linear_num_key_heads=16"),
        (dict(num_key_value_heads=0), "num_key_value_heads=0: supported: a positive integer"),
        (dict(tie_word_embeddings=True), "tie_word_embeddings=false and text_config.tie_word_embeddings=true disagree"),
    ],
)
def test_unsupported_keys_fail_naming_key_value_and_supported(edit, expect):
    with pytest.raises(ConfigError) as err:
        Qwen35Config.from_hf_dict(published(**edit), source="ckpt/config.json")
    msg = str(err.value)
    assert msg.startswith("ckpt/config.json: unsupported config: ") and expect in msg and "\n" not in msg


def test_moe_keys_are_checked():
    with pytest.raises(ConfigError, match=r"text_config.output_router_logits=true \(supported: false\)"):
        Qwen35Config.from_hf_dict(published(moe=True, output_router_logits=True))
    with pytest.raises(ConfigError, match="num_experts=4, num_experts_per_tok=8: supported"):
        Qwen35Config.from_hf_dict(published(moe=True, num_experts=4))


def test_unknown_top_level_key_fails():
    d = published()
    d["quantization_config"] = {"quant_method": "fp8"}
    with pytest.raises(ConfigError, match=r'quantization_config=\{"quant_method": "fp8"\} \(unknown key'):
        Qwen35Config.from_hf_dict(d)


def test_every_problem_is_named_in_one_line():
    with pytest.raises(ConfigError) as err:
        Qwen35Config.from_hf_dict(published(hidden_act="relu", attention_bias=True, foo=1))
    msg = str(err.value)
    assert "\n" not in msg and all(k in msg for k in ("hidden_act", "attention_bias", "text_config.foo=1"))


def test_layer_types_from_full_attention_interval():
    d = published()
    del d["text_config"]["layer_types"]
    d["text_config"].update(full_attention_interval=2, num_hidden_layers=4)
    cfg = Qwen35Config.from_hf_dict(d)
    assert cfg.layer_types == ["linear_attention", "full_attention"] * 2


def test_load_checkpoint_names_the_file(tmp_path):
    save_checkpoint(build_model("tiny", vocab_size=512), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["hidden_act"] = "gelu_pytorch_tanh"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    file = re.escape(str(tmp_path / "config.json"))
    with pytest.raises(ConfigError, match=f'^{file}: unsupported config: hidden_act="gelu_pytorch_tanh"'):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize(
    "kw, key",
    [
        (dict(head_dim=90, partial_rotary_factor=0.5), "partial_rotary_factor=0.5 of head_dim=90 gives 45"),
        (dict(hidden_size=0), "hidden_size=0"),
        (dict(num_experts=4, num_experts_per_tok=5), "num_experts=4, num_experts_per_tok=5"),
        (dict(num_attention_heads=6, num_key_value_heads=4), "num_attention_heads=6: must be a multiple"),
        (dict(layer_types=["linear_attention"] * 3 + ["sliding_attention"]), "unknown layer types"),
    ],
)
def test_sizes_the_model_cannot_run_fail_when_built(kw, key):
    with pytest.raises(ValueError, match=key):
        get_preset("tiny", **kw)


def test_preset_with_another_layer_count_repeats_its_pattern():
    assert get_preset("tiny", num_hidden_layers=6).layer_types == ["linear_attention"] * 3 + ["full_attention"] + [
        "linear_attention"
    ] * 2
