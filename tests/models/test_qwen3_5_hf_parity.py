"""Fidelity against transformers' independent Qwen3.5 implementation, through the checkpoint files both ways.

Tiny random configs with 3 GDN + 1 attention layers; 2 x 100 tokens so the chunked GDN crosses a 64-token chunk
boundary. transformers runs its torch fallbacks (no FLA / causal-conv1d) in fp32 with eager attention."""

import pytest
import torch

from zeromismatch.models.qwen3_5 import build_model, get_preset, load_checkpoint, save_checkpoint

transformers = pytest.importorskip("transformers")

VOCAB = 512
HF_CLASS = {"tiny": "Qwen3_5ForCausalLM", "tiny_moe": "Qwen3_5MoeForCausalLM"}
INPUT_IDS = torch.randint(0, VOCAB, (2, 100), generator=torch.Generator().manual_seed(0))


def hf_logits(hf_model):
    with torch.no_grad():
        return hf_model(input_ids=INPUT_IDS).logits.reshape(-1, VOCAB)


def assert_close_in_every_mode(ours, ref):
    for numerics in ("stock", "bi"):
        ours.set_numerics(numerics)
        with torch.no_grad():
            out = ours(INPUT_IDS)
        assert out.dtype == torch.float32 and out.shape == ref.shape
        err = (out - ref).abs().max().item()
        assert err < 1e-4, f"{numerics}: max abs diff {err}"


@pytest.mark.parametrize("preset", ["tiny", "tiny_moe"])
def test_our_checkpoint_in_transformers(preset, tmp_path):
    ours = build_model(preset, seed=1, vocab_size=VOCAB)
    if ours.config.is_moe:
        router = ours.model.layers[0].mlp.gate.weight
        assert router.std() > 0.01  # routing actually depends on the token
    save_checkpoint(ours, tmp_path, max_shard_bytes=1 << 20)

    cls = getattr(transformers, HF_CLASS[preset])
    hf, info = cls.from_pretrained(tmp_path, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched tensors
    assert_close_in_every_mode(ours, hf_logits(hf.eval()))


@pytest.mark.parametrize("preset", ["tiny", "tiny_moe"])
def test_transformers_checkpoint_in_ours(preset, tmp_path):
    """transformers writes a single model.safetensors and, for MoE, one tensor per expert."""
    hf_dict = get_preset(preset, vocab_size=VOCAB).to_hf_dict()
    config = transformers.AutoConfig.for_model(**hf_dict, attn_implementation="eager")
    torch.manual_seed(2)
    hf = getattr(transformers, HF_CLASS[preset])(config)
    with torch.no_grad():  # zero-centred norms start at 0: make them matter
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    hf.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()

    ours = load_checkpoint(tmp_path)
    assert_close_in_every_mode(ours, hf_logits(hf.eval()))
