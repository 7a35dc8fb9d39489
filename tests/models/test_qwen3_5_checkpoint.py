"""Checkpoint save/load: bitwise round trip, the published layouts, errors, and the published presets on meta."""

import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from zeromismatch.models.qwen3_5 import (
    CheckpointError,
    build_model,
    load_checkpoint,
    load_state_dict_from_dir,
    save_checkpoint,
)
from zeromismatch.models.qwen3_5.checkpoint import INDEX_NAME, checkpoint_tensors

SMALL = dict(vocab_size=512)


def assert_same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


def shards(path):
    return sorted(path.glob("model-*.safetensors"))


def rewrite(path, edit):
    """Apply edit(tensors) to every shard of the checkpoint at path, in place."""
    for f in shards(path):
        tensors = load_file(f)
        edit(tensors)
        save_file(tensors, f, metadata={"format": "pt"})


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    model = build_model("tiny_moe", seed=3, **SMALL)
    path = save_checkpoint(model, tmp_path_factory.mktemp("moe"), max_shard_bytes=1 << 20)
    return model, path


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_is_bitwise_and_sharded(tmp_path, dtype):
    model = build_model("tiny_moe", seed=1, dtype=dtype, **SMALL)
    save_checkpoint(model, tmp_path, max_shard_bytes=1 << 20)
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    assert len(shards(tmp_path)) >= 2
    assert sorted(set(index["weight_map"].values())) == [f.name for f in shards(tmp_path)]
    assert index["weight_map"].keys() == checkpoint_tensors(model.state_dict()).keys()
    # the published names: merged projections stored as their halves, gate / b first
    layer = model.model.layers[0]
    stored = {k: v for f in shards(tmp_path) for k, v in load_file(f).items()}
    assert not any(k.endswith(("gate_up_proj.weight", "in_proj_ba.weight")) for k in stored)
    inter, hv = layer.mlp.shared_expert.inter, layer.linear_attn.hv
    assert torch.equal(stored["model.layers.0.mlp.shared_expert.gate_proj.weight"],
                       layer.mlp.shared_expert.gate_up_proj.weight[:inter])
    assert torch.equal(stored["model.layers.0.linear_attn.in_proj_a.weight"], layer.linear_attn.in_proj_ba.weight[hv:])
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "qwen3_5_moe_text"

    loaded = load_checkpoint(tmp_path, numerics="bi")
    assert not any(p.is_meta for p in loaded.parameters())
    assert loaded.numerics.name == "bi" and loaded.config == model.config
    assert_same_weights(model, loaded)

    other = build_model("tiny_moe", seed=2, **SMALL)  # materialized model: copied into, dtype kept
    load_state_dict_from_dir(other, tmp_path)
    assert other.lm_head.weight.dtype == torch.float32
    assert torch.equal(other.lm_head.weight, model.lm_head.weight.float())


def test_load_casts_when_asked(moe):
    _, path = moe
    assert load_checkpoint(path, dtype=torch.bfloat16).model.embed_tokens.weight.dtype == torch.bfloat16


def test_tied_embeddings(tmp_path):
    model = build_model("tiny", seed=1, tie_word_embeddings=True, **SMALL)
    save_checkpoint(model, tmp_path)
    assert "lm_head.weight" not in json.loads((tmp_path / INDEX_NAME).read_text())["weight_map"]
    loaded = load_checkpoint(tmp_path)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert_same_weights(model, loaded)


def test_multimodal_per_expert_layout(moe, tmp_path):
    """The published layout: nested text_config, text weights under model.language_model., vision tower and MTP
    head alongside (skipped), routed experts stored one by one."""
    model, path = moe
    mm = {}
    for k, v in checkpoint_tensors(model.state_dict()).items():
        k = k.replace("model.", "model.language_model.", 1)
        if k.endswith("experts.gate_up_proj"):
            base = k.removesuffix(".gate_up_proj")
            for j, w in enumerate(v):
                gate, up = w.chunk(2)
                mm[f"{base}.{j}.gate_proj.weight"], mm[f"{base}.{j}.up_proj.weight"] = gate.clone(), up.clone()
        elif k.endswith("experts.down_proj"):
            base = k.removesuffix(".down_proj")
            mm.update({f"{base}.{j}.down_proj.weight": w.clone() for j, w in enumerate(v)})
        else:
            mm[k] = v
    mm["model.visual.patch_embed.proj.weight"] = torch.zeros(8, 3)
    mm["mtp.fc.weight"] = torch.zeros(4, 8)
    names = sorted(mm)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate([names[:half], names[half:]]):
        save_file({k: mm[k] for k in part}, tmp_path / f"model-0000{i + 1}-of-00002.safetensors")
        weight_map.update(dict.fromkeys(part, f"model-0000{i + 1}-of-00002.safetensors"))
    (tmp_path / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config = {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": model.config.to_hf_dict(),
        "vision_config": {"depth": 1},
        "tie_word_embeddings": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))

    assert_same_weights(model, load_checkpoint(tmp_path))


def test_missing_tensor_is_named(moe, tmp_path):
    _, path = moe
    shutil.copytree(path, tmp_path, dirs_exist_ok=True)
    name = "model.layers.2.linear_attn.in_proj_z.weight"
    rewrite(tmp_path, lambda t: t.pop(name, None))  # the index still lists it
    with pytest.raises(CheckpointError, match=rf"missing 1 tensor\(s\): {re.escape(name)}"):
        load_checkpoint(tmp_path)
    model = build_model("tiny_moe", seed=5, **SMALL)
    before = model.model.layers[2].linear_attn.in_proj_z.weight.clone()
    load_state_dict_from_dir(model, tmp_path, strict=False)  # the rest loads, the missing one is kept
    assert torch.equal(model.model.layers[2].linear_attn.in_proj_z.weight, before)


def test_missing_tensors_are_counted(moe, tmp_path):
    _, path = moe
    shutil.copytree(path, tmp_path, dirs_exist_ok=True)
    rewrite(tmp_path, lambda t: [t.pop(k) for k in list(t) if k.startswith("model.layers.0.")])
    with pytest.raises(CheckpointError, match=r"missing \d+ tensor\(s\): model\.layers\.0\..*\(\d+ more\)"):
        load_checkpoint(tmp_path)


def test_wrong_shape_is_named(moe, tmp_path):
    _, path = moe
    shutil.copytree(path, tmp_path, dirs_exist_ok=True)
    name = "model.layers.3.self_attn.k_proj.weight"
    rewrite(tmp_path, lambda t: t.update({name: t[name][:-1].clone()}) if name in t else None)
    expected = f"1 tensor(s) of the wrong shape:\n  {name}: model expects (128, 256), checkpoint has (127, 256)"
    with pytest.raises(CheckpointError, match=re.escape(expected)):
        load_checkpoint(tmp_path)


def test_unexpected_tensor_is_named(moe, tmp_path):
    _, path = moe
    shutil.copytree(path, tmp_path, dirs_exist_ok=True)
    rewrite(tmp_path, lambda t: t.setdefault("model.layers.0.mlp.extra.weight", torch.zeros(2)))
    with pytest.raises(CheckpointError, match=r"1 unexpected tensor\(s\): model\.layers\.0\.mlp\.extra\.weight"):
        load_checkpoint(tmp_path)
    load_state_dict_from_dir(build_model("tiny_moe", **SMALL), tmp_path, strict=False)


def test_missing_files_are_named(moe, tmp_path):
    _, path = moe
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=f"checkpoint directory {re.escape(str(missing))} does not exist"):
        load_checkpoint(missing)
    with pytest.raises(FileNotFoundError, match=f"no config.json in checkpoint directory {re.escape(str(tmp_path))}"):
        load_checkpoint(tmp_path)
    shutil.copy(path / "config.json", tmp_path)
    with pytest.raises(FileNotFoundError, match=f"no {re.escape(INDEX_NAME)} or model.safetensors"):
        load_checkpoint(tmp_path)
    shutil.copy(path / INDEX_NAME, tmp_path)
    with pytest.raises(FileNotFoundError, match=r"lists model-00001-of-\d+\.safetensors, which is not in"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize(
    "preset, n_params, shapes",
    [
        (
            "qwen3_5_9b",
            8.95e9,
            {
                "model.embed_tokens.weight": (248320, 4096),
                "model.layers.0.linear_attn.in_proj_qkv.weight": (2 * 16 * 128 + 32 * 128, 4096),
                "model.layers.0.linear_attn.conv1d.weight": (8192, 1, 4),
                "model.layers.3.self_attn.q_proj.weight": (2 * 16 * 256, 4096),
                "model.layers.3.self_attn.k_proj.weight": (4 * 256, 4096),
                "model.layers.31.mlp.down_proj.weight": (4096, 12288),
                "lm_head.weight": (248320, 4096),
            },
        ),
        (
            "qwen3_5_35b_a3b",
            34.66e9,
            {
                "model.layers.0.linear_attn.in_proj_qkv.weight": (8192, 2048),
                "model.layers.3.self_attn.k_proj.weight": (2 * 256, 2048),
                "model.layers.39.mlp.gate.weight": (256, 2048),
                "model.layers.39.mlp.experts.gate_up_proj": (256, 1024, 2048),
                "model.layers.39.mlp.experts.down_proj": (256, 2048, 512),
                "model.layers.39.mlp.shared_expert.up_proj.weight": (512, 2048),
                "model.layers.39.mlp.shared_expert_gate.weight": (1, 2048),
            },
        ),
    ],
)
def test_published_presets_on_meta(preset, n_params, shapes):
    model = build_model(preset, device="meta")
    params = dict(model.named_parameters())
    assert all(p.is_meta for p in params.values())
    assert model.num_parameters() == pytest.approx(n_params, rel=1e-3)
    stored = {k: tuple(v.shape) for k, v in checkpoint_tensors(params).items()}  # under the published names
    for name, shape in shapes.items():
        assert stored[name] == shape, name
