"""trainer.activation_checkpointing: recomputing each layer in backward changes no bit of the trainer's logprobs
or gradients, in every numerics mode, dense and MoE, over packed sequences of several lengths; the generator's
no-grad forwards never recompute; the RL config reaches the trainer's model."""

import pytest
import torch
from hydra import compose, initialize_config_dir

from zeromismatch.config import CONF_DIR
from zeromismatch.models.qwen3_5 import build_model
from zeromismatch.orchestration.build import build_trainer
from zeromismatch.trainer.scoring import next_token_logprobs


def logprobs_and_grads(model, seqs):
    model.zero_grad(set_to_none=True)
    lps = next_token_logprobs(model, seqs)
    loss = sum((lp * (i + 1)).sum() for i, lp in enumerate(lps))  # weights differ per sequence: no symmetric grads
    loss.backward()
    return [lp.detach() for lp in lps], {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("preset", ["tiny", "tiny_moe"])
@pytest.mark.parametrize("numerics", ["stock", "bi", "bi_chunk"])
def test_recompute_gives_the_same_bits(preset, numerics):
    model = build_model(preset, numerics, seed=3).train()
    g = torch.Generator().manual_seed(7)
    seqs = [torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist() for n in (5, 70, 131)]
    lp_off, grad_off = logprobs_and_grads(model, seqs)
    model.activation_checkpointing = True
    lp_on, grad_on = logprobs_and_grads(model, seqs)
    assert all(torch.equal(a, b) for a, b in zip(lp_off, lp_on))
    assert grad_off.keys() == grad_on.keys() and len(grad_on) > 0
    diff = [n for n in grad_off if not torch.equal(grad_off[n], grad_on[n])]
    assert not diff, f"gradients differ with activation checkpointing: {diff[:5]}"


def test_recompute_saves_activations_and_skips_no_grad_forwards():
    """With it on, backward runs each layer a second time and far fewer tensors are saved for it (each layer
    keeps its input); under no_grad (the generator, rescoring) each layer runs once."""
    model = build_model("tiny", "bi", seed=3).train()
    ids = torch.randint(0, model.config.vocab_size, (64,))
    calls = []
    # a pre-hook: the recompute stops as soon as backward has what it needs, before the layer's forward returns
    model.model.layers[0].register_forward_pre_hook(lambda *a: calls.append(1))

    def saved_and_calls():
        n, calls[:] = 0, []

        def pack(t):
            nonlocal n
            n += 1
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(ids).sum().backward()
        return n, len(calls)

    plain, plain_calls = saved_and_calls()
    model.activation_checkpointing = True
    saved, ac_calls = saved_and_calls()
    assert (plain_calls, ac_calls) == (1, 2)
    assert saved < plain / 2, (saved, plain)
    calls[:] = []
    with torch.no_grad():
        model(ids)
    assert len(calls) == 1


def test_config_reaches_the_trainer_model():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose("config", overrides=["job=rl", "model=tiny", "trainer.activation_checkpointing=true"])
    model = build_model("tiny", "bi", seed=0)
    assert model.activation_checkpointing is False
    build_trainer(cfg, model)
    assert model.activation_checkpointing is True
